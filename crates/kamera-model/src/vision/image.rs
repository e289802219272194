//! 8-bit RGB images: PNG decoding as PIL's `Image.open(..).convert("RGB")` does, and PIL's bicubic
//! resize (`Image.resize(.., BICUBIC)`) reproduced bit for bit.

use std::io::Cursor;

use crate::{Error, Result};

/// An 8-bit RGB image, rows top to bottom, pixels packed `[r, g, b]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    width: usize,
    height: usize,
    data: Vec<u8>,
}

impl RgbImage {
    /// An image from packed RGB bytes; `data` must hold `width * height * 3` bytes.
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> Result<Self> {
        let want = width.checked_mul(height).and_then(|n| n.checked_mul(3));
        if want != Some(data.len()) {
            return Err(Error::Invalid {
                op: "RgbImage::new",
                detail: format!(
                    "{width}x{height} RGB needs {} bytes, got {}",
                    want.map_or("more than usize::MAX".to_string(), |n| n.to_string()),
                    data.len()
                ),
            });
        }
        Ok(Self { width, height, data })
    }

    /// Decode a PNG (any colour type and bit depth) to RGB as PIL's `convert("RGB")` does: grey
    /// is replicated, palettes looked up, alpha and tRNS dropped (not composited), 16-bit samples
    /// keep their high byte, except 16-bit grey, which PIL reads as `I;16` and clips to 255.
    pub fn decode_png(bytes: &[u8]) -> Result<Self> {
        let bad = |e: png::DecodingError| Error::Invalid {
            op: "decode PNG",
            detail: format!("{} bytes are not a valid PNG: {e}", bytes.len()),
        };
        let mut decoder = png::Decoder::new(Cursor::new(bytes));
        decoder.set_transformations(png::Transformations::EXPAND);
        let mut reader = decoder.read_info().map_err(bad)?;
        let (src_color, src_depth) = (reader.info().color_type, reader.info().bit_depth);
        let size = reader.output_buffer_size().ok_or_else(|| Error::Invalid {
            op: "decode PNG",
            detail: "image too large for this machine's address space".into(),
        })?;
        let mut buf = vec![0u8; size];
        let frame = reader.next_frame(&mut buf).map_err(bad)?;
        let (width, height) = (frame.width as usize, frame.height as usize);
        let (color, depth) = (frame.color_type, frame.bit_depth);
        let channels = color.samples();
        let sample_bytes = if depth == png::BitDepth::Sixteen { 2 } else { 1 };
        let grey16 = src_color == png::ColorType::Grayscale && src_depth == png::BitDepth::Sixteen;
        let mut data = Vec::with_capacity(width * height * 3);
        for row in buf.chunks_exact(frame.line_size).take(height) {
            for px in row.chunks_exact(channels * sample_bytes).take(width) {
                // Sample i as 8 bits: the high byte of 16-bit samples (PIL's `;16B` unpackers),
                // or 16-bit grey clipped to 255 (PIL's I;16 -> RGB).
                let s = |i: usize| -> u8 {
                    if sample_bytes == 1 {
                        px[i]
                    } else if grey16 {
                        u16::from_be_bytes([px[2 * i], px[2 * i + 1]]).min(255) as u8
                    } else {
                        px[2 * i]
                    }
                };
                match color {
                    png::ColorType::Grayscale | png::ColorType::GrayscaleAlpha => data.extend_from_slice(&[s(0); 3]),
                    png::ColorType::Rgb | png::ColorType::Rgba => data.extend_from_slice(&[s(0), s(1), s(2)]),
                    png::ColorType::Indexed => {
                        return Err(Error::Invalid {
                            op: "decode PNG",
                            detail: "palette was not expanded (missing PLTE chunk?)".into(),
                        });
                    }
                }
            }
        }
        Self::new(width, height, data)
    }

    /// The image as an 8-bit RGB PNG (fast compression): [`RgbImage::decode_png`] gives it back
    /// unchanged. A web page's screenshot takes a fraction of its raw bytes so.
    pub fn encode_png(&self) -> Result<Vec<u8>> {
        let bad = |e: png::EncodingError| Error::Invalid {
            op: "encode PNG",
            detail: format!("{}x{} RGB: {e}", self.width, self.height),
        };
        let size = |v: usize| {
            u32::try_from(v).map_err(|_| Error::Invalid {
                op: "encode PNG",
                detail: format!("a side of {v} pixels is over PNG's 2^32 - 1"),
            })
        };
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, size(self.width)?, size(self.height)?);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_compression(png::Compression::Fast);
        let mut w = enc.write_header().map_err(bad)?;
        w.write_image_data(&self.data).map_err(bad)?;
        w.finish().map_err(bad)?;
        Ok(out)
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// Packed RGB bytes, `width * height * 3` of them.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The packed RGB bytes, by value.
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }

    /// The `[r, g, b]` of pixel (x, y), or `None` outside the image.
    pub fn pixel(&self, x: usize, y: usize) -> Option<[u8; 3]> {
        if x >= self.width || y >= self.height {
            return None;
        }
        let i = (y * self.width + x) * 3;
        Some([self.data[i], self.data[i + 1], self.data[i + 2]])
    }
}

/// Fixed-point bits of PIL's 8-bit resampling coefficients (`PRECISION_BITS` in Resample.c).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// PIL's bicubic kernel (a = -0.5).
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// One axis' taps: for each output index the first source index, the tap count and the
/// fixed-point weights (`ksize` slots each), as PIL's `precompute_coeffs` + `normalize_coeffs_8bpc`.
struct Taps {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    weights: Vec<i32>,
}

impl Taps {
    fn new(in_size: usize, out_size: usize) -> Self {
        // PIL passes the box (0, in_size) as C floats; their difference is exact below 2^24.
        let scale = (in_size as f32 - 0.0f32) as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = 2.0 * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut bounds = Vec::with_capacity(out_size);
        let mut weights = vec![0i32; out_size * ksize];
        let mut k = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = 0.0 + (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) - xmin;
            let (xmin, xmax) = (xmin as usize, xmax.max(0) as usize);
            let mut ww = 0.0;
            for x in 0..xmax {
                let w = bicubic(((x + xmin) as f64 - center + 0.5) * ss);
                k[x] = w;
                ww += w;
            }
            for x in 0..xmax {
                if ww != 0.0 {
                    k[x] /= ww;
                }
                let scaled = k[x] * (1u32 << PRECISION_BITS) as f64;
                weights[xx * ksize + x] = if k[x] < 0.0 {
                    (-0.5 + scaled) as i32
                } else {
                    (0.5 + scaled) as i32
                };
            }
            bounds.push((xmin, xmax));
        }
        Self { ksize, bounds, weights }
    }

    /// The fixed-point sum of `taps` source samples read by `sample(i)`, clipped to 8 bits.
    fn apply(&self, out: usize, sample: impl Fn(usize) -> u8) -> u8 {
        let (min, n) = self.bounds[out];
        let w = &self.weights[out * self.ksize..out * self.ksize + n];
        let mut ss: i64 = 1 << (PRECISION_BITS - 1);
        for (i, &k) in w.iter().enumerate() {
            ss += i64::from(sample(min + i)) * i64::from(k);
        }
        (ss >> PRECISION_BITS).clamp(0, 255) as u8
    }
}

/// Resize to `width` x `height` exactly as PIL's `Image.resize((width, height), BICUBIC)` on an
/// RGB image: separable (horizontal pass first, over the source rows the vertical pass reads),
/// 22-bit fixed-point weights, an 8-bit rounded and clipped intermediate, and a support widened
/// by the scale when downscaling (antialiasing).
pub fn resize_bicubic(src: &RgbImage, width: usize, height: usize) -> RgbImage {
    let (sw, sh) = (src.width, src.height);
    if width == 0 || height == 0 || sw == 0 || sh == 0 {
        return RgbImage {
            width,
            height,
            data: vec![0; width * height * 3],
        };
    }
    let vert = Taps::new(sh, height);
    let (first, _) = vert.bounds[0];
    let (last_min, last_n) = vert.bounds[height - 1];
    // Horizontal pass, only over the rows the vertical pass reads.
    let (mid, mid_w, row0) = if width != sw {
        let horiz = Taps::new(sw, width);
        let rows = last_min + last_n - first;
        let mut mid = vec![0u8; width * rows * 3];
        for y in 0..rows {
            let row = &src.data[(y + first) * sw * 3..(y + first + 1) * sw * 3];
            for xx in 0..width {
                for c in 0..3 {
                    mid[(y * width + xx) * 3 + c] = horiz.apply(xx, |x| row[x * 3 + c]);
                }
            }
        }
        (mid, width, first)
    } else {
        (src.data.clone(), sw, 0)
    };
    if height == sh {
        // PIL skips the vertical pass; the horizontal pass covered every row.
        return RgbImage {
            width,
            height,
            data: mid,
        };
    }
    let mut data = vec![0u8; width * height * 3];
    for yy in 0..height {
        for xx in 0..mid_w {
            for c in 0..3 {
                data[(yy * width + xx) * 3 + c] = vert.apply(yy, |y| mid[((y - row0) * mid_w + xx) * 3 + c]);
            }
        }
    }
    RgbImage { width, height, data }
}
