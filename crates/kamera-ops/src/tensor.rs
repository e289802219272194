//! Storage: a row-major tokens x features matrix in f32, f16 or bf16; math always runs in f32.

use crate::error::{Error, Result, shape};
use half::{bf16, f16};

/// Element type of stored KV and patch factors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }
}

/// A storage element: converts to and from f32 (all arithmetic is in f32).
pub trait Elem: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Elem for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Elem for bf16 {
    const DTYPE: DType = DType::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    /// Round to nearest even, NaN kept quiet (bit-identical to `bf16::from_f32`), written
    /// branch-free so the hot loops vectorise.
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        let u = x.to_bits();
        let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16;
        let quiet_nan = (u >> 16) | 0x40;
        bf16::from_bits(if x.is_nan() { quiet_nan } else { rounded } as u16)
    }
}

/// Typed storage of a matrix.
#[derive(Debug, Clone, PartialEq)]
pub enum Buf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

/// Calls `$body` with `$v` bound to the typed vector inside a [`Buf`].
#[macro_export]
#[doc(hidden)]
macro_rules! with_buf {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            $crate::Buf::F32($v) => $body,
            $crate::Buf::F16($v) => $body,
            $crate::Buf::Bf16($v) => $body,
        }
    };
}

impl Buf {
    pub fn dtype(&self) -> DType {
        match self {
            Buf::F32(_) => DType::F32,
            Buf::F16(_) => DType::F16,
            Buf::Bf16(_) => DType::Bf16,
        }
    }

    pub fn len(&self) -> usize {
        with_buf!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Zeros of the given type.
    pub fn zeros(dtype: DType, len: usize) -> Buf {
        match dtype {
            DType::F32 => Buf::F32(vec![0.0; len]),
            DType::F16 => Buf::F16(vec![f16::ZERO; len]),
            DType::Bf16 => Buf::Bf16(vec![bf16::ZERO; len]),
        }
    }

    /// Empty, with room for `len` values of the given type (filled by [`Buf::extend_f32`]).
    pub fn with_capacity(dtype: DType, len: usize) -> Buf {
        match dtype {
            DType::F32 => Buf::F32(Vec::with_capacity(len)),
            DType::F16 => Buf::F16(Vec::with_capacity(len)),
            DType::Bf16 => Buf::Bf16(Vec::with_capacity(len)),
        }
    }

    /// Appends f32 values converted to this buffer's type (round to nearest even).
    pub fn extend_f32(&mut self, data: &[f32]) {
        match self {
            Buf::F32(v) => v.extend_from_slice(data),
            Buf::F16(v) => v.extend(data.iter().map(|&x| f16::from_f32(x))),
            Buf::Bf16(v) => v.extend(data.iter().map(|&x| bf16::from_f32(x))),
        }
    }

    /// Converts f32 values to the given type (round to nearest even).
    pub fn from_f32(dtype: DType, data: &[f32]) -> Buf {
        match dtype {
            DType::F32 => Buf::F32(data.to_vec()),
            DType::F16 => Buf::F16(data.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::Bf16 => Buf::Bf16(data.iter().map(|&x| bf16::from_f32(x)).collect()),
        }
    }

    /// The values widened to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        with_buf!(self, v => v.iter().map(|x| x.to_f32()).collect())
    }

    /// Index of the first NaN or infinity, if any.
    pub fn first_non_finite(&self) -> Option<usize> {
        with_buf!(self, v => v.iter().position(|x| !x.to_f32().is_finite()))
    }
}

/// A row-major matrix: one row per token, one column per feature (kv_heads * head_dim).
#[derive(Debug, Clone, PartialEq)]
pub struct Mat {
    rows: usize,
    cols: usize,
    data: Buf,
}

impl Mat {
    /// Wraps typed storage; its length must be rows * cols.
    pub fn new(rows: usize, cols: usize, data: Buf) -> Result<Mat> {
        let want = rows
            .checked_mul(cols)
            .ok_or_else(|| shape("Mat::new", "rows*cols", "no overflow", format!("{rows}x{cols}")))?;
        if data.len() != want {
            return Err(shape(
                "Mat::new",
                "data length",
                format!("{rows}x{cols}={want}"),
                data.len(),
            ));
        }
        Ok(Mat { rows, cols, data })
    }

    /// An f32 matrix.
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Result<Mat> {
        Mat::new(rows, cols, Buf::F32(data))
    }

    pub fn zeros(rows: usize, cols: usize, dtype: DType) -> Mat {
        Mat {
            rows,
            cols,
            data: Buf::zeros(dtype, rows * cols),
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    pub fn data(&self) -> &Buf {
        &self.data
    }
    pub fn data_mut(&mut self) -> &mut Buf {
        &mut self.data
    }
    pub fn into_data(self) -> Buf {
        self.data
    }
    /// Storage bytes.
    pub fn bytes(&self) -> usize {
        self.data.len() * self.dtype().size()
    }
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.data.to_f32_vec()
    }
    /// Rows `start..start + n` copied out (`None` past the end).
    pub fn row_range(&self, start: usize, n: usize) -> Option<Mat> {
        let end = start.checked_add(n).filter(|&e| e <= self.rows)?;
        let (a, b) = (start * self.cols, end * self.cols);
        let data = match &self.data {
            Buf::F32(v) => Buf::F32(v[a..b].to_vec()),
            Buf::F16(v) => Buf::F16(v[a..b].to_vec()),
            Buf::Bf16(v) => Buf::Bf16(v[a..b].to_vec()),
        };
        Some(Mat {
            rows: n,
            cols: self.cols,
            data,
        })
    }

    /// The same values stored as `dtype` (rounded).
    pub fn to_dtype(&self, dtype: DType) -> Mat {
        if dtype == self.dtype() {
            return self.clone();
        }
        Mat {
            rows: self.rows,
            cols: self.cols,
            data: Buf::from_f32(dtype, &self.to_f32_vec()),
        }
    }

    /// Errors with [`Error::NonFinite`] if any value is NaN or infinite.
    pub fn check_finite(&self, op: &'static str, what: &str) -> Result<()> {
        match self.data.first_non_finite() {
            None => Ok(()),
            Some(index) => Err(Error::NonFinite {
                op,
                what: what.to_string(),
                index,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The branch-free bf16 conversions agree bit for bit with the `half` crate.
    #[test]
    fn bf16_conversion_matches_half() {
        let mut specials = vec![
            0.0f32,
            -0.0,
            1.0,
            -1.5,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        specials.extend((0..200_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))));
        for x in specials {
            let ours = <bf16 as Elem>::from_f32(x);
            let theirs = bf16::from_f32(x);
            assert!(
                ours.to_bits() == theirs.to_bits() || (x.is_nan() && ours.is_nan()),
                "{x:e}: {ours:?} vs {theirs:?}"
            );
            assert_eq!(<bf16 as Elem>::to_f32(theirs).to_bits(), theirs.to_f32().to_bits());
        }
    }
}
