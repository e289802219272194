//! Qwen2.5-VL: the vision tower, its config, and the index arithmetic that places image tokens
//! (3-D M-RoPE ids). The text half is the shared Qwen2 runner ([`crate::Model`]).

mod config;
mod positions;
mod random;
mod tower;

pub use config::{VisionConfig, VisionTokens, VlConfig};
pub use positions::{Grid, image_positions, image_span, patch_rows_cols, rope_index, window_index};
pub use random::{Geometry, write_random_vl};
pub(crate) use tower::Tower;
pub use tower::VisionOutput;

use crate::error::{Error, Result};
use crate::vision::{ImagePatches, PreprocessConfig, RgbImage, preprocess};

/// The vision half of a loaded Qwen2.5-VL.
#[derive(Debug)]
pub struct Vision {
    pub(crate) tower: Tower,
    pub(crate) tokens: VisionTokens,
    pub(crate) preprocess: PreprocessConfig,
}

impl Vision {
    /// The image preprocessing of this model (its preprocessor_config.json).
    pub fn preprocess_config(&self) -> &PreprocessConfig {
        &self.preprocess
    }

    /// Preprocesses (resize within the pixel budget — `max_pixels` overrides the model's — and
    /// normalise, as HF does) and encodes one image.
    pub fn encode_image(&self, image: &RgbImage, max_pixels: Option<usize>) -> Result<(ImagePatches, VisionOutput)> {
        let cfg = match max_pixels {
            Some(m) => self.preprocess.clone().with_max_pixels(m),
            None => self.preprocess.clone(),
        };
        let patches = preprocess(image, &cfg)?;
        let out = self.encode(&patches.pixel_values, patches.grid_thw)?;
        Ok((patches, out))
    }

    pub fn config(&self) -> &VisionConfig {
        self.tower.config()
    }
    pub fn tokens(&self) -> VisionTokens {
        self.tokens
    }
    /// Image tokens (merged patches) an image of `grid` becomes.
    pub fn image_tokens(&self, grid: Grid) -> usize {
        let m = self.config().merge_size;
        grid[0] * (grid[1] / m) * (grid[2] / m)
    }
    /// An image chunk's tokens: `<|vision_start|>`, the merged image tokens, `<|vision_end|>`.
    pub fn chunk_tokens(&self, grid: Grid) -> Vec<u32> {
        let t = self.tokens;
        let mut ids = Vec::with_capacity(self.image_tokens(grid) + 2);
        ids.push(t.vision_start);
        ids.extend(std::iter::repeat_n(t.image, self.image_tokens(grid)));
        ids.push(t.vision_end);
        ids
    }
    /// Positions an image chunk occupies: its largest merged-grid side + the two markers (what
    /// follows resumes there), not its token count.
    pub fn chunk_span(&self, grid: Grid) -> i64 {
        image_span(grid, self.config().merge_size) + 2
    }
    /// The 3-D rotary ids of an image chunk's tokens when it starts at `at`.
    pub fn chunk_positions(&self, grid: Grid, at: i64) -> Vec<[i64; 3]> {
        let mut rot = vec![[at; 3]];
        rot.extend(image_positions(grid, self.config().merge_size, at + 1));
        rot.push([at + self.chunk_span(grid) - 1; 3]);
        rot
    }
    /// Runs the tower over one image's patches (`[t·h·w, C·T·P·P]`, as preprocessed).
    pub fn encode(&self, pixel_values: &[f32], grid: Grid) -> Result<VisionOutput> {
        self.tower.forward(pixel_values, grid)
    }

    /// Input embeddings of `ids` with every `<|image_pad|>` run replaced, in order, by the
    /// embeddings of `images` (`token_embeds` is `[ids.len(), hidden]` from
    /// [`crate::Model::embed_tokens`]).
    pub fn splice(&self, ids: &[u32], mut token_embeds: Vec<f32>, images: &[&[f32]]) -> Result<Vec<f32>> {
        const OP: &str = "Vision::splice";
        let hidden = self.config().out_hidden;
        if token_embeds.len() != ids.len() * hidden {
            return Err(Error::Shape {
                op: OP,
                detail: format!(
                    "{} embedding values for {} tokens of width {hidden}",
                    token_embeds.len(),
                    ids.len()
                ),
            });
        }
        let slots: Vec<usize> = (0..ids.len()).filter(|&i| ids[i] == self.tokens.image).collect();
        let given: usize = images.iter().map(|e| e.len() / hidden).sum();
        if images.iter().any(|e| e.len() % hidden != 0) || given != slots.len() {
            return Err(Error::Shape {
                op: OP,
                detail: format!(
                    "{} image tokens in the prompt, {given} image embedding rows given",
                    slots.len()
                ),
            });
        }
        let rows = images.iter().flat_map(|e| e.chunks(hidden));
        for (&slot, row) in slots.iter().zip(rows) {
            token_embeds[slot * hidden..(slot + 1) * hidden].copy_from_slice(row);
        }
        Ok(token_embeds)
    }
}
