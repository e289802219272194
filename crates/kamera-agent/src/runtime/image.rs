//! Screenshots as image chunks (Qwen2.5-VL): `<|vision_start|>`, the image's merged tokens and
//! `<|vision_end|>` form one chunk whose position span is its largest grid side + 2, not its
//! token count; the vision tower runs once per image the session has to prefill.

use std::sync::{Arc, OnceLock};

use kamera_model::vision::RgbImage;
use kamera_store::ChunkId;

use crate::error::{Error, Result, model};
use crate::runtime::encoder::{Content, ImageContent};
use crate::runtime::session::{Applied, Session};

/// Encoder name hashed into image chunk ids, with the decoded pixels and the patch grid.
pub(crate) const IMAGE_ENCODER: &str = "screenshot:qwen2.5-vl:v1";

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
        if !self.exec.encoder().content.contains_key(&id) {
            let span = vision.chunk_span(grid);
            self.window.declare_span(id, span)?;
            self.exec.encoder_mut().spans.insert(id, span);
            self.exec.encoder_mut().content.insert(
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
}
