//! Screenshots as image chunks (Qwen2.5-VL): `<|vision_start|>`, the image's merged tokens and
//! `<|vision_end|>` form one chunk whose position span is its largest grid side + 2, not its
//! token count; the vision tower runs once per image the session has to prefill. A screenshot
//! over the pixel budget is downscaled to fit, or with [`SessionConfig::screenshot_tiles`] cut
//! into horizontal bands, each its own content-addressed chunk (an unchanged band of a changed
//! page stays a hit), in reading order, as a long page's text becomes several chunks.

use std::sync::Arc;

use kamera_model::vision::RgbImage;
use kamera_store::ChunkId;

#[cfg(doc)]
use crate::SessionConfig;
use crate::error::{Error, Result, model};
use crate::runtime::encoder::{Content, ImageContent};
use crate::runtime::pages::{ObservedPage, costlier, merge};
use crate::runtime::session::{Applied, Session};

/// Encoder name hashed into image chunk ids, with the decoded pixels and the patch grid.
pub(crate) const IMAGE_ENCODER: &str = "screenshot:qwen2.5-vl:v1";

impl Session {
    /// A screenshot observed (PNG bytes): decoded, resized within
    /// [`SessionConfig::image_max_pixels`](crate::SessionConfig) and met by the window as an
    /// image chunk, like [`Session::observe`] does for page text. Needs a vision-language model.
    pub fn observe_image(&mut self, png: &[u8]) -> Result<Applied> {
        let image = RgbImage::decode_png(png).map_err(model("decode screenshot"))?;
        self.observe_rgb(image, Some(png))
    }

    /// A screenshot observed (PNG bytes) as [`Session::observe_image`] does, or, where it is over
    /// the pixel budget and [`SessionConfig::screenshot_tiles`] allows more than one, as that many
    /// horizontal bands at most (whole rows of 28 pixels, each within the budget at full width
    /// where the count allows), top to bottom, each an image chunk.
    pub fn observe_screenshot(&mut self, png: &[u8]) -> Result<ObservedPage> {
        let image = RgbImage::decode_png(png).map_err(model("decode screenshot"))?;
        let bands = tile_rows(
            image.width(),
            image.height(),
            self.cfg.image_max_pixels,
            self.cfg.screenshot_tiles,
        );
        let mut shot = ObservedPage::default();
        for (k, rows) in bands.iter().enumerate() {
            let band = if bands.len() == 1 {
                image.clone()
            } else {
                let row = image.width() * 3;
                let data = image.data()[rows.start * row..rows.end * row].to_vec();
                RgbImage::new(image.width(), rows.len(), data).map_err(model("cut screenshot"))?
            };
            let a = self.observe_rgb(band, (bands.len() == 1).then_some(png))?;
            let id = a.chunk.ok_or_else(|| Error::Runtime {
                op: "observe screenshot",
                detail: "the visit named no chunk".into(),
            })?;
            shot.tokens += self.chunk_tokens(&id).map_or(0, <[u32]>::len);
            shot.chunks.push(id);
            if k == 0 {
                shot.applied = a;
            } else {
                shot.applied.visit = match (shot.applied.visit, a.visit) {
                    (Some(x), Some(y)) => Some(costlier(x, y)),
                    (x, y) => x.or(y),
                };
                merge(&mut shot.applied, a);
            }
        }
        Ok(shot)
    }

    /// A decoded screenshot met by the window as one image chunk; `png` is the file it was
    /// decoded from, if it was decoded whole (kept as it is; else the pixels are encoded).
    fn observe_rgb(&mut self, image: RgbImage, png: Option<&[u8]>) -> Result<Applied> {
        self.settle()?;
        let vision = self.model.vision().ok_or_else(|| Error::Runtime {
            op: "observe screenshot",
            detail: "the model has no vision tower (use a Qwen2.5-VL directory)".into(),
        })?;
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
            let png = match png {
                Some(p) => p.to_vec(),
                None => image.encode_png().map_err(model("keep screenshot"))?,
            };
            let span = vision.chunk_span(grid);
            self.window.declare_span(id, span)?;
            self.exec.encoder_mut().spans.insert(id, span);
            self.exec.encoder_mut().content.insert(
                id,
                Content {
                    tokens,
                    image: Some(Arc::new(ImageContent { png, grid })),
                },
            );
        }
        let store = self.store.clone();
        let (visit, plan) = self.window.visit(id, n, &|k| Self::stored(store.as_ref(), k))?;
        self.count_visit(id, visit);
        self.apply(Some(id), Some(visit), plan)
    }
}

/// The row ranges of a `width` x `height` screenshot's bands: one (the whole) when it fits
/// `max_pixels` or `max_tiles` is 1; else the fewest bands of whole 28-pixel rows within
/// `max_pixels` at full width, at most `max_tiles` (then taller, and downscaled to fit).
pub(crate) fn tile_rows(
    width: usize,
    height: usize,
    max_pixels: usize,
    max_tiles: usize,
) -> Vec<std::ops::Range<usize>> {
    const ROW: usize = 28;
    if max_tiles <= 1 || width * height <= max_pixels || width == 0 {
        return std::iter::once(0..height).collect();
    }
    let band = ((max_pixels / width) / ROW).max(1) * ROW;
    let n = height.div_ceil(band).min(max_tiles);
    let band = height.div_ceil(n).div_ceil(ROW) * ROW;
    (0..height).step_by(band).map(|y| y..(y + band).min(height)).collect()
}

#[cfg(test)]
mod tests {
    use super::tile_rows;

    #[test]
    fn bands_cover_the_screenshot_in_order_within_the_budget() {
        // 1280 x 2000 under 28*28*256 pixels: bands of 140 rows (179,200 pixels), 15 of them.
        let b = tile_rows(1280, 2000, 28 * 28 * 256, 32);
        assert_eq!(b.len(), 15);
        assert_eq!(b[0], 0..140);
        assert_eq!(b.last().unwrap().end, 2000);
        for w in b.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert!(b.iter().all(|r| r.len() * 1280 <= 28 * 28 * 256));
        // At most 4: taller bands (downscaled to the budget when encoded).
        let b = tile_rows(1280, 2000, 28 * 28 * 256, 4);
        assert_eq!(b.len(), 4);
        assert_eq!(b[0], 0..504);
        assert_eq!(b.last().unwrap().end, 2000);
        // One tile, or a screenshot within the budget: the whole.
        assert_eq!(
            tile_rows(1280, 2000, 28 * 28 * 256, 1),
            std::iter::once(0..2000).collect::<Vec<_>>()
        );
        assert_eq!(
            tile_rows(200, 300, 28 * 28 * 256, 8),
            std::iter::once(0..300).collect::<Vec<_>>()
        );
    }
}
