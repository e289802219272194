//! Qwen2-VL / Qwen2.5-VL image preprocessing, value for value as HF transformers'
//! `Qwen2VLImageProcessor` (the PIL path): smart resize, bicubic resampling, rescale, CLIP
//! normalisation, temporal tiling and the processor's patch flattening order.

use std::path::Path;

use serde::Deserialize;

use super::image::{RgbImage, resize_bicubic};
use crate::{Error, Result};

/// The processor settings read from a `preprocessor_config.json`.
///
/// `Default` is HF's `Qwen2VLImageProcessor` default (what a config without the field gets); note
/// that the released Qwen2.5-VL checkpoints ship `max_pixels = 12845056` in their file, which
/// [`PreprocessConfig::from_file`] reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawConfig")]
pub struct PreprocessConfig {
    /// Side of a ViT patch in pixels (14).
    pub patch_size: usize,
    /// Frames per temporal patch (2); a still image is repeated to fill them.
    pub temporal_patch_size: usize,
    /// Patches merged per side into one LLM token (2).
    pub merge_size: usize,
    /// Pixel budget floor for [`smart_resize`].
    pub min_pixels: usize,
    /// Pixel budget ceiling for [`smart_resize`].
    pub max_pixels: usize,
    /// Per-channel mean (R, G, B) subtracted after rescaling.
    pub image_mean: [f64; 3],
    /// Per-channel standard deviation (R, G, B) divided by after subtracting the mean.
    pub image_std: [f64; 3],
    /// Factor taking 8-bit values to [0, 1] (1/255).
    pub rescale_factor: f64,
    /// Resize to the [`smart_resize`] size (when off, both sides must already be multiples of
    /// `patch_size * merge_size`).
    pub do_resize: bool,
    /// Multiply by `rescale_factor`.
    pub do_rescale: bool,
    /// Subtract `image_mean` and divide by `image_std`.
    pub do_normalize: bool,
}

/// OpenAI CLIP's channel means and standard deviations (HF's `OPENAI_CLIP_MEAN` / `_STD`).
const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

impl Default for PreprocessConfig {
    fn default() -> Self {
        Self {
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
            rescale_factor: 1.0 / 255.0,
            do_resize: true,
            do_rescale: true,
            do_normalize: true,
        }
    }
}

/// A scalar or a per-channel list, as HF accepts for `image_mean` / `image_std`.
#[derive(Deserialize)]
#[serde(untagged)]
enum PerChannel {
    One(f64),
    Many(Vec<f64>),
}

#[derive(Deserialize)]
struct SizeDict {
    shortest_edge: Option<usize>,
    longest_edge: Option<usize>,
}

/// The JSON as written; every field optional, checked in `TryFrom`.
#[derive(Deserialize)]
struct RawConfig {
    patch_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    merge_size: Option<usize>,
    min_pixels: Option<usize>,
    max_pixels: Option<usize>,
    size: Option<SizeDict>,
    image_mean: Option<PerChannel>,
    image_std: Option<PerChannel>,
    rescale_factor: Option<f64>,
    do_resize: Option<bool>,
    do_rescale: Option<bool>,
    do_normalize: Option<bool>,
    resample: Option<u32>,
}

fn per_channel(name: &str, v: Option<PerChannel>, default: [f64; 3]) -> Result<[f64; 3], String> {
    match v {
        None => Ok(default),
        Some(PerChannel::One(x)) => Ok([x; 3]),
        Some(PerChannel::Many(v)) => v
            .as_slice()
            .try_into()
            .map_err(|_| format!("{name} must have 3 values (R, G, B), got {}", v.len())),
    }
}

impl TryFrom<RawConfig> for PreprocessConfig {
    type Error = String;

    fn try_from(raw: RawConfig) -> Result<Self, String> {
        let d = Self::default();
        // PIL's BICUBIC is 3; it is the only filter implemented here.
        if let Some(r) = raw.resample.filter(|&r| r != 3) {
            return Err(format!("resample {r} is not supported (only 3, bicubic)"));
        }
        let size = raw.size.unwrap_or(SizeDict {
            shortest_edge: None,
            longest_edge: None,
        });
        let cfg = Self {
            patch_size: raw.patch_size.unwrap_or(d.patch_size),
            temporal_patch_size: raw.temporal_patch_size.unwrap_or(d.temporal_patch_size),
            merge_size: raw.merge_size.unwrap_or(d.merge_size),
            // `min_pixels` / `max_pixels` win over `size`, as in HF.
            min_pixels: raw.min_pixels.or(size.shortest_edge).unwrap_or(d.min_pixels),
            max_pixels: raw.max_pixels.or(size.longest_edge).unwrap_or(d.max_pixels),
            image_mean: per_channel("image_mean", raw.image_mean, d.image_mean)?,
            image_std: per_channel("image_std", raw.image_std, d.image_std)?,
            rescale_factor: raw.rescale_factor.unwrap_or(d.rescale_factor),
            do_resize: raw.do_resize.unwrap_or(d.do_resize),
            do_rescale: raw.do_rescale.unwrap_or(d.do_rescale),
            do_normalize: raw.do_normalize.unwrap_or(d.do_normalize),
        };
        cfg.check()?;
        Ok(cfg)
    }
}

impl PreprocessConfig {
    /// Read a Hugging Face `preprocessor_config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            op: "read preprocessor config",
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| Error::Invalid {
            op: "parse preprocessor config",
            detail: format!("{}: {e}", path.display()),
        })
    }

    /// The same settings with another pixel ceiling (a screenshot budget); the floor is lowered to
    /// it if it was higher.
    pub fn with_max_pixels(mut self, max_pixels: usize) -> Self {
        self.max_pixels = max_pixels;
        self.min_pixels = self.min_pixels.min(max_pixels);
        self
    }

    /// The side every resized dimension is a multiple of: `patch_size * merge_size` (28).
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// The (height, width) an image of this size is resized to.
    pub fn resized_size(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        if self.do_resize {
            return smart_resize(height, width, self.factor(), self.min_pixels, self.max_pixels);
        }
        let f = self.factor();
        if height == 0 || width == 0 || height % f != 0 || width % f != 0 {
            return Err(Error::Invalid {
                op: "preprocess image",
                detail: format!("do_resize is off, so {height}x{width} (h x w) must be non-zero multiples of {f}"),
            });
        }
        Ok((height, width))
    }

    /// The patch grid (temporal, height, width) an image of this size becomes, without
    /// resizing it: a still image is one temporal patch.
    pub fn grid(&self, height: usize, width: usize) -> Result<[usize; 3]> {
        let (rh, rw) = self.resized_size(height, width)?;
        Ok([1, rh / self.patch_size, rw / self.patch_size])
    }

    fn check(&self) -> Result<(), String> {
        let sizes = [
            ("patch_size", self.patch_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("merge_size", self.merge_size),
            ("max_pixels", self.max_pixels),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        if self.image_std.iter().any(|s| *s == 0.0 || !s.is_finite()) || self.image_mean.iter().any(|m| !m.is_finite())
        {
            return Err(format!(
                "image_mean must be finite and image_std finite and non-zero, got {:?} and {:?}",
                self.image_mean, self.image_std
            ));
        }
        if !self.rescale_factor.is_finite() {
            return Err(format!("rescale_factor must be finite, got {}", self.rescale_factor));
        }
        Ok(())
    }
}

/// HF's `smart_resize`: the (height, width) nearest the input's with both sides multiples of
/// `factor` and `min_pixels <= h * w <= max_pixels` (rounding half to even, as Python does), or
/// HF's error for aspect ratios above 200.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize)> {
    let invalid = |detail: String| Error::Invalid {
        op: "smart_resize",
        detail,
    };
    if height == 0 || width == 0 || factor == 0 || max_pixels == 0 {
        return Err(invalid(format!(
            "height {height}, width {width}, factor {factor} and max_pixels {max_pixels} must be positive"
        )));
    }
    let ratio = height.max(width) as f64 / height.min(width) as f64;
    if ratio > 200.0 {
        return Err(invalid(format!(
            "absolute aspect ratio must be smaller than 200, got {ratio} ({height}x{width}, h x w)"
        )));
    }
    let area = height
        .checked_mul(width)
        .ok_or_else(|| invalid(format!("{height}x{width} overflows")))?;
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let mut h_bar = (h / f).round_ties_even() as usize * factor;
    let mut w_bar = (w / f).round_ties_even() as usize * factor;
    if h_bar.saturating_mul(w_bar) > max_pixels {
        let beta = (area as f64 / max_pixels as f64).sqrt();
        h_bar = factor.max((h / beta / f).floor() as usize * factor);
        w_bar = factor.max((w / beta / f).floor() as usize * factor);
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels as f64 / area as f64).sqrt();
        h_bar = (h * beta / f).ceil() as usize * factor;
        w_bar = (w * beta / f).ceil() as usize * factor;
    }
    if h_bar == 0 || w_bar == 0 {
        return Err(invalid(format!(
            "{height}x{width} (h x w) resizes to {h_bar}x{w_bar} with min_pixels {min_pixels}"
        )));
    }
    Ok((h_bar, w_bar))
}

/// One image as the vision tower's input rows.
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePatches {
    /// `t * h * w` rows of `patch_dim` values, in HF's order (2x2 merge groups contiguous).
    pub pixel_values: Vec<f32>,
    /// Patches along time, height and width.
    pub grid_thw: [usize; 3],
    /// Values per row: `3 * temporal_patch_size * patch_size^2` (1176).
    pub patch_dim: usize,
}

impl ImagePatches {
    /// Rows of `pixel_values`: `t * h * w`.
    pub fn n_patches(&self) -> usize {
        self.grid_thw.iter().product()
    }
}

/// Preprocess one image as `Qwen2VLImageProcessor` does: resize to the smart size with PIL's
/// bicubic, `f32(f64(v) * rescale_factor)`, `(x - mean) / std` in f32, the frame repeated to
/// `temporal_patch_size`, and patches flattened as (t, h/m, w/m, m, m) rows of (c, T, p, p).
///
/// ```
/// use kamera_model::vision::{PreprocessConfig, RgbImage, preprocess};
/// let png = std::fs::read("tests/golden/qwen25vl-golden/img0.png")?; // 120x90
/// let image = RgbImage::decode_png(&png)?;
/// let cfg = PreprocessConfig::default().with_max_pixels(28 * 28 * 16); // a screenshot budget
/// let patches = preprocess(&image, &cfg)?; // resized to 112x84
/// assert_eq!(patches.grid_thw, [1, 6, 8]);
/// assert_eq!(patches.pixel_values.len(), 48 * 1176);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn preprocess(image: &RgbImage, cfg: &PreprocessConfig) -> Result<ImagePatches> {
    cfg.check().map_err(|detail| Error::Invalid {
        op: "preprocess image",
        detail,
    })?;
    let (rh, rw) = cfg.resized_size(image.height(), image.width())?;
    let resized;
    let img = if (rh, rw) == (image.height(), image.width()) {
        image
    } else {
        resized = resize_bicubic(image, rw, rh);
        &resized
    };
    let mean = cfg.image_mean.map(|m| m as f32);
    let std = cfg.image_std.map(|s| s as f32);
    // Channel-first values of the one frame.
    let plane = rh * rw;
    let mut chw = vec![0f32; 3 * plane];
    for (i, px) in img.data().chunks_exact(3).enumerate() {
        for c in 0..3 {
            let mut v = if cfg.do_rescale {
                (f64::from(px[c]) * cfg.rescale_factor) as f32
            } else {
                f32::from(px[c])
            };
            if cfg.do_normalize {
                v = (v - mean[c]) / std[c];
            }
            chw[c * plane + i] = v;
        }
    }
    let (p, m, tp) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let (gh, gw) = (rh / p, rw / p);
    let patch_dim = 3 * tp * p * p;
    let mut out = Vec::with_capacity(gh * gw * patch_dim);
    for bh in 0..gh / m {
        for bw in 0..gw / m {
            for mh in 0..m {
                for mw in 0..m {
                    let (y0, x0) = ((bh * m + mh) * p, (bw * m + mw) * p);
                    for c in 0..3 {
                        for _ in 0..tp {
                            for y in 0..p {
                                let start = c * plane + (y0 + y) * rw + x0;
                                out.extend_from_slice(&chw[start..start + p]);
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(ImagePatches {
        pixel_values: out,
        grid_thw: [1, gh, gw],
        patch_dim,
    })
}
