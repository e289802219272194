//! Quantised patch factors: int8 or 4-bit codes with one f32 scale per direction (per column of
//! P, per row of Wᵀ). The dense factors of a quantised patch hold the exact values code · scale.

use crate::error::{Result, shape};
use crate::svd::LowRank;
use crate::tensor::Mat;

/// How patch factors are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Quant {
    /// Floats in the patch's dtype.
    #[default]
    None,
    /// Signed 8-bit codes in −127..=127, one f32 scale per direction.
    Int8,
    /// Signed 4-bit codes in −7..=7, two per byte (low nibble first), one f32 scale per direction.
    Int4,
}

impl Quant {
    /// The largest code magnitude (0 for floats).
    pub fn max_code(self) -> i32 {
        match self {
            Quant::None => 0,
            Quant::Int8 => 127,
            Quant::Int4 => 7,
        }
    }
    /// Bytes of `len` codes.
    pub fn code_bytes(self, len: usize) -> usize {
        match self {
            Quant::None => 0,
            Quant::Int8 => len,
            Quant::Int4 => len.div_ceil(2),
        }
    }
    /// Stored bytes of a rank-`m` factor pair over `rows` tokens and `cols` features: the codes
    /// of P and Wᵀ and 2m f32 scales (0 for floats).
    pub fn factor_bytes(self, rows: usize, m: usize, cols: usize) -> usize {
        match self {
            Quant::None => 0,
            q => q.code_bytes(rows * m) + q.code_bytes(m * cols) + 8 * m,
        }
    }
}

/// The per-direction scales of one quantised factor pair.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scales {
    /// One per column of P.
    pub p: Vec<f32>,
    /// One per row of Wᵀ.
    pub wt: Vec<f32>,
}

/// Quantises `lr`: returns the factors holding code · scale (f32) and their scales.
pub fn quantise(lr: &LowRank, q: Quant) -> Result<(LowRank, Scales)> {
    let (n, m, f) = (lr.p.rows(), lr.rank(), lr.wt.cols());
    let max = q.max_code() as f32;
    if max == 0.0 {
        return Ok((lr.clone(), Scales::default()));
    }
    let (p, wt) = (lr.p.to_f32_vec(), lr.wt.to_f32_vec());
    let scale = |it: &mut dyn Iterator<Item = f32>| it.fold(0.0f32, |a, x| a.max(x.abs())) / max;
    let sp: Vec<f32> = (0..m).map(|j| scale(&mut (0..n).map(|i| p[i * m + j]))).collect();
    let sw: Vec<f32> = (0..m)
        .map(|j| scale(&mut wt[j * f..(j + 1) * f].iter().copied()))
        .collect();
    let deq = |x: f32, s: f32| {
        if s > 0.0 {
            (x / s).round().clamp(-max, max) * s
        } else {
            0.0
        }
    };
    let pq = (0..n * m).map(|i| deq(p[i], sp[i % m.max(1)])).collect();
    let wq = (0..m * f).map(|i| deq(wt[i], sw[i / f.max(1)])).collect();
    let out = LowRank {
        p: Mat::from_f32(n, m, pq)?,
        wt: Mat::from_f32(m, f, wq)?,
        spectrum: lr.spectrum.clone(),
    };
    Ok((out, Scales { p: sp, wt: sw }))
}

/// The codes of a quantised factor pair (P row-major, then Wᵀ row-major): x / scale, exact
/// because every value is code · scale.
pub fn codes(lr: &LowRank, s: &Scales) -> Result<(Vec<i8>, Vec<i8>)> {
    let (m, f) = (lr.rank(), lr.wt.cols());
    if s.p.len() != m || s.wt.len() != m {
        return Err(shape(
            "quant::codes",
            "scales per direction",
            m,
            format!("{} / {}", s.p.len(), s.wt.len()),
        ));
    }
    let code = |x: f32, sc: f32| {
        if sc > 0.0 {
            (x / sc).round().clamp(-127.0, 127.0) as i8
        } else {
            0
        }
    };
    let p =
        lr.p.to_f32_vec()
            .iter()
            .enumerate()
            .map(|(i, &x)| code(x, s.p[i % m.max(1)]))
            .collect();
    let w = lr
        .wt
        .to_f32_vec()
        .iter()
        .enumerate()
        .map(|(i, &x)| code(x, s.wt[i / f.max(1)]))
        .collect();
    Ok((p, w))
}

/// The factor pair of `codes` (as [`codes`] returns them) and scales, over `rows` tokens and
/// `cols` features.
pub fn dequantise(rows: usize, cols: usize, p: &[i8], wt: &[i8], s: &Scales, spectrum: Vec<f32>) -> Result<LowRank> {
    const OP: &str = "quant::dequantise";
    let m = s.p.len();
    if s.wt.len() != m || p.len() != rows * m || wt.len() != m * cols {
        return Err(shape(
            OP,
            "codes (P, Wᵀ) and scales",
            format!("{rows}x{m}, {m}x{cols}, {m} + {m} scales"),
            format!("{} codes, {} codes, {} + {} scales", p.len(), wt.len(), m, s.wt.len()),
        ));
    }
    let pv = p
        .iter()
        .enumerate()
        .map(|(i, &c)| c as f32 * s.p[i % m.max(1)])
        .collect();
    let wv = wt
        .iter()
        .enumerate()
        .map(|(i, &c)| c as f32 * s.wt[i / cols.max(1)])
        .collect();
    Ok(LowRank {
        p: Mat::from_f32(rows, m, pv)?,
        wt: Mat::from_f32(m, cols, wv)?,
        spectrum,
    })
}

/// Packs 4-bit codes two per byte, low nibble first (an odd count ends with a zero nibble).
pub fn pack_nibbles(codes: &[i8]) -> Vec<u8> {
    codes
        .chunks(2)
        .map(|c| (c[0] as u8 & 0x0f) | ((c.get(1).copied().unwrap_or(0) as u8 & 0x0f) << 4))
        .collect()
}

/// Unpacks `len` 4-bit codes (sign-extended) from [`pack_nibbles`] bytes.
pub fn unpack_nibbles(bytes: &[u8], len: usize) -> Vec<i8> {
    let mut out = Vec::with_capacity(len);
    for &b in bytes {
        for nib in [b << 4, b & 0xf0] {
            if out.len() < len {
                out.push((nib as i8) >> 4);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lr() -> LowRank {
        let (n, m, f) = (7, 3, 5);
        let p = (0..n * m)
            .map(|i| ((i as f32) * 0.7).sin() * (1 + i % m) as f32)
            .collect();
        let w = (0..m * f).map(|i| ((i as f32) * 1.3).cos()).collect();
        LowRank {
            p: Mat::from_f32(n, m, p).unwrap(),
            wt: Mat::from_f32(m, f, w).unwrap(),
            spectrum: vec![3.0, 2.0, 1.0],
        }
    }

    #[test]
    fn codes_round_trip_exactly_and_errors_are_bounded() {
        for q in [Quant::Int8, Quant::Int4] {
            let orig = lr();
            let (deq, s) = quantise(&orig, q).unwrap();
            let (pc, wc) = codes(&deq, &s).unwrap();
            assert!(pc.iter().chain(&wc).all(|c| c.unsigned_abs() as i32 <= q.max_code()));
            let back = dequantise(7, 5, &pc, &wc, &s, deq.spectrum.clone()).unwrap();
            assert_eq!(back, deq, "{q:?}");
            let (op, dp) = (orig.p.to_f32_vec(), deq.p.to_f32_vec());
            for (i, (a, b)) in op.iter().zip(dp).enumerate() {
                assert!((a - b).abs() <= s.p[i % 3] / 2.0 + 1e-6, "{q:?} {a} {b}");
            }
            let packed = pack_nibbles(&pc);
            assert_eq!(packed.len(), Quant::Int4.code_bytes(pc.len()));
            if q == Quant::Int4 {
                assert_eq!(unpack_nibbles(&packed, pc.len()), pc);
            }
        }
        assert!(dequantise(7, 5, &[0; 3], &[0; 15], &Scales::default(), vec![]).is_err());
    }
}
