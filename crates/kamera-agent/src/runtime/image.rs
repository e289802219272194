//! Screenshots as image chunks (Qwen2.5-VL): `<|vision_start|>`, the image's merged tokens and
//! `<|vision_end|>` form one chunk whose position span is its largest grid side + 2, not its
//! token count; the vision tower runs once per image the session has to prefill.

use std::sync::{Arc, OnceLock};

use kamera_model::vision::RgbImage;
use kamera_model::vl::Grid;
use kamera_model::{Context, Input, Prefill, PrefillOptions};
use kamera_store::ChunkId;

use crate::error::{Error, Result, model};
use crate::runtime::session::{Applied, Content, Session};

/// Encoder name hashed into image chunk ids, with the decoded pixels and the patch grid.
pub(crate) const IMAGE_ENCODER: &str = "screenshot:qwen2.5-vl:v1";

/// A chunk's prefill input: embeddings to use instead of its tokens (image chunks), and 3-D
/// rotary ids (M-RoPE models).
type ChunkInput = (Option<Vec<f32>>, Option<Vec<[i64; 3]>>);

/// An image chunk's pixels and patch grid, and the tower's output once computed (resized and
/// encoded only when a prefill of it is needed).
#[derive(Debug)]
pub(crate) struct ImageContent {
    pub image: RgbImage,
    pub grid: Grid,
    pub embeds: OnceLock<Vec<f32>>,
}

impl Session {
    /// A screenshot observed (PNG bytes): decoded, resized within
    /// [`SessionConfig::image_max_pixels`](crate::SessionConfig) and met by the window as an
    /// image chunk, like [`Session::observe`] does for page text. Needs a vision-language model.
    pub fn observe_image(&mut self, png: &[u8]) -> Result<Applied> {
        self.settle()?;
        let vision = self.model.vision().ok_or_else(|| Error::Runtime {
            op: "observe screenshot",
            detail: "the model has no vision tower (use a Qwen2.5-VL directory)".into(),
        })?;
        let image = RgbImage::decode_png(png).map_err(model("decode screenshot"))?;
        // The grid follows from the size and the budget: a screenshot seen before is neither
        // resized nor encoded again.
        let grid = vision
            .preprocess_config()
            .clone()
            .with_max_pixels(self.cfg.image_max_pixels)
            .grid(image.height(), image.width())
            .map_err(model("preprocess screenshot"))?;
        let mut bytes = Vec::with_capacity(image.data().len() + 40);
        for v in [image.width(), image.height(), grid[0], grid[1], grid[2]] {
            bytes.extend((v as u64).to_le_bytes());
        }
        bytes.extend_from_slice(image.data());
        let id = ChunkId::of(&bytes, IMAGE_ENCODER, self.fp);
        let tokens = vision.chunk_tokens(grid);
        let n = tokens.len();
        if !self.content.contains_key(&id) {
            self.window.declare_span(id, vision.chunk_span(grid))?;
            self.content.insert(
                id,
                Content {
                    tokens,
                    image: Some(Arc::new(ImageContent {
                        image,
                        grid,
                        embeds: OnceLock::new(),
                    })),
                },
            );
        }
        let store = self.store.clone();
        let (visit, plan) = self.window.visit(id, n, &|k| Self::stored(store.as_ref(), k))?;
        self.count_visit(id, visit);
        self.apply(Some(id), Some(visit), plan)
    }

    /// Positions a chunk occupies: the span declared to the window (an image), else its tokens.
    pub(crate) fn span_of(&self, chunk: &ChunkId, n_tokens: usize) -> i64 {
        self.window.declared_span(chunk).unwrap_or(n_tokens as i64)
    }

    fn content_of(&self, op: &'static str, chunk: &ChunkId) -> Result<&Content> {
        self.content.get(chunk).ok_or_else(|| Error::Runtime {
            op,
            detail: format!("chunk {chunk} has no known content to prefill"),
        })
    }

    /// What a prefill of `chunk` at rotary position `at` takes: the input embeddings (image
    /// chunks: the tower's output spliced in, computed once) and, for M-RoPE models, the 3-D
    /// rotary ids of its tokens.
    fn chunk_input(&self, op: &'static str, chunk: &ChunkId, at: i64) -> Result<ChunkInput> {
        let c = self.content_of(op, chunk)?;
        let mrope = self.model.config().mrope_sections.is_some();
        let Some(img) = &c.image else {
            let rot = mrope.then(|| (0..c.tokens.len() as i64).map(|i| [at + i; 3]).collect());
            return Ok((None, rot));
        };
        let vision = self.model.vision().ok_or_else(|| Error::Runtime {
            op,
            detail: "an image chunk needs a vision-language model".into(),
        })?;
        let embeds = match img.embeds.get() {
            Some(e) => e,
            None => {
                let (_, out) = vision
                    .encode_image(&img.image, Some(self.cfg.image_max_pixels))
                    .map_err(model("vision tower"))?;
                self.images_encoded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                img.embeds.get_or_init(|| out.embeds)
            }
        };
        let x = self.model.embed_tokens(&c.tokens).map_err(model(op))?;
        let x = vision.splice(&c.tokens, x, &[embeds]).map_err(model(op))?;
        let rot = vision.chunk_positions(img.grid, at);
        Ok((Some(x), Some(rot)))
    }

    /// Prefills `chunk` at rotary position `at` after `ctx` (alone when `None`).
    pub(crate) fn prefill_chunk(
        &self,
        op: &'static str,
        chunk: &ChunkId,
        at: i64,
        ctx: Option<&Context>,
    ) -> Result<Prefill> {
        let empty;
        let ctx = match ctx {
            Some(c) => c,
            None => {
                empty = self.model.empty_context();
                &empty
            }
        };
        let c = self.content_of(op, chunk)?;
        let (embeds, rot) = self.chunk_input(op, chunk, at)?;
        let input = match &embeds {
            Some(x) => Input::Embeddings {
                data: x,
                n: c.tokens.len(),
            },
            None => Input::Tokens(&c.tokens),
        };
        match rot {
            Some(rot) => self.model.prefill_rotary(input, &rot, ctx, PrefillOptions::default()),
            None => self.model.prefill_with(input, at, ctx, PrefillOptions::default()),
        }
        .map_err(model(op))
    }

    /// Appends `chunk` to the live context in place (at its rotary end), recording its span.
    pub(crate) fn extend_chunk(&mut self, op: &'static str, chunk: &ChunkId) -> Result<Prefill> {
        let at = self.ctx.rotary_end();
        let c = self.content_of(op, chunk)?;
        let n = c.tokens.len();
        let (embeds, rot) = self.chunk_input(op, chunk, at)?;
        let tokens = c.tokens.clone();
        let span = self.span_of(chunk, n);
        let out = match (&embeds, rot) {
            (Some(x), Some(rot)) => self
                .model
                .extend_rotary(Input::Embeddings { data: x, n }, &rot, &mut self.ctx),
            _ => self.model.extend(&tokens, &mut self.ctx),
        }
        .map_err(model(op))?;
        self.ctx.mark_span(n, span).map_err(model(op))?;
        Ok(out)
    }
}
