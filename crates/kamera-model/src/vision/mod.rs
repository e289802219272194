//! Qwen2.5-VL vision: image decoding and HF-exact preprocessing.

mod image;
mod preprocess;

pub use image::{RgbImage, resize_bicubic};
pub use preprocess::{ImagePatches, PreprocessConfig, preprocess, smart_resize};
