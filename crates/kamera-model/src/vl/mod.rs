//! Qwen2.5-VL: the vision tower, its config, and the index arithmetic that places image tokens
//! (3-D M-RoPE ids). The text half is the shared Qwen2 runner ([`crate::Model`]).

mod config;
mod positions;
mod tower;

pub use config::{VisionConfig, VisionTokens, VlConfig};
pub use positions::{Grid, image_positions, image_span, patch_rows_cols, rope_index, window_index};
pub(crate) use tower::Tower;
pub use tower::VisionOutput;

use crate::error::{Error, Result};

/// The vision half of a loaded Qwen2.5-VL.
#[derive(Debug)]
pub struct Vision {
    pub(crate) tower: Tower,
    pub(crate) tokens: VisionTokens,
}

impl Vision {
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
