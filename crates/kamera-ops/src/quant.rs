//! Quantised patch factors: int8 codes with one f32 scale per direction (per column of P, per
//! row of Wᵀ), or 4-bit codes with one f16 scale per group of 32 codes of a direction. The dense
//! factors of a quantised patch hold the exact values code · scale.

use half::f16;

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
    /// Signed 4-bit codes in −7..=7, two per byte (low nibble first), one f16 scale per group of
    /// [`INT4_GROUP`] consecutive codes of a direction.
    Int4,
}

/// Codes per scale of 4-bit factors.
pub const INT4_GROUP: usize = 32;

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
    /// Scales per direction of a vector of `len` codes.
    pub fn groups(self, len: usize) -> usize {
        match self {
            Quant::None => 0,
            Quant::Int8 => 1,
            Quant::Int4 => len.div_ceil(INT4_GROUP),
        }
    }
    /// Bytes of one stored scale.
    pub fn scale_bytes(self) -> usize {
        match self {
            Quant::None => 0,
            Quant::Int8 => 4,
            Quant::Int4 => 2,
        }
    }
    /// Stored bytes of a rank-`m` factor pair over `rows` tokens and `cols` features: the codes
    /// of P and Wᵀ and their scales (0 for floats).
    pub fn factor_bytes(self, rows: usize, m: usize, cols: usize) -> usize {
        match self {
            Quant::None => 0,
            q => {
                q.code_bytes(rows * m)
                    + q.code_bytes(m * cols)
                    + m * (q.groups(rows) + q.groups(cols)) * q.scale_bytes()
            }
        }
    }
    /// Group length of a vector of `len` codes.
    fn group_len(self, len: usize) -> usize {
        match self {
            Quant::Int4 => INT4_GROUP,
            _ => len.max(1),
        }
    }
    /// A scale as stored (f16-rounded for 4-bit codes, rounded up so no code exceeds the range
    /// by more than the clamp).
    fn stored_scale(self, s: f32) -> f32 {
        match self {
            Quant::Int4 => {
                let h = f16::from_f32(s).to_f32();
                if h < s {
                    f16::from_bits(f16::from_f32(s).to_bits() + 1).to_f32()
                } else {
                    h
                }
            }
            _ => s,
        }
    }
}

/// The scales of one quantised factor pair, direction-major: direction j's groups of P (of its
/// column) at `p[j·groups(n)..]`, of Wᵀ (its row) at `wt[j·groups(f)..]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scales {
    pub p: Vec<f32>,
    pub wt: Vec<f32>,
}

/// Index of the scale of P element (i, j) and of Wᵀ element (j, c).
fn p_scale(q: Quant, n: usize, i: usize, j: usize) -> usize {
    j * q.groups(n) + i / q.group_len(n)
}
fn w_scale(q: Quant, f: usize, j: usize, c: usize) -> usize {
    j * q.groups(f) + c / q.group_len(f)
}

/// Quantises `lr`: returns the factors holding code · scale (f32) and their scales.
pub fn quantise(lr: &LowRank, q: Quant) -> Result<(LowRank, Scales)> {
    let (n, m, f) = (lr.p.rows(), lr.rank(), lr.wt.cols());
    let max = q.max_code() as f32;
    if max == 0.0 {
        return Ok((lr.clone(), Scales::default()));
    }
    let (p, wt) = (lr.p.to_f32_vec(), lr.wt.to_f32_vec());
    let mut sp = vec![0.0f32; m * q.groups(n)];
    let mut sw = vec![0.0f32; m * q.groups(f)];
    for i in 0..n {
        for j in 0..m {
            let k = p_scale(q, n, i, j);
            sp[k] = sp[k].max(p[i * m + j].abs());
        }
    }
    for j in 0..m {
        for c in 0..f {
            let k = w_scale(q, f, j, c);
            sw[k] = sw[k].max(wt[j * f + c].abs());
        }
    }
    for x in sp.iter_mut().chain(sw.iter_mut()) {
        *x = q.stored_scale(*x / max);
    }
    let deq = |x: f32, s: f32| {
        if s > 0.0 {
            (x / s).round().clamp(-max, max) * s
        } else {
            0.0
        }
    };
    let pq = (0..n * m)
        .map(|i| deq(p[i], sp[p_scale(q, n, i / m.max(1), i % m.max(1))]))
        .collect();
    let wq = (0..m * f)
        .map(|i| deq(wt[i], sw[w_scale(q, f, i / f.max(1), i % f.max(1))]))
        .collect();
    let out = LowRank {
        p: Mat::from_f32(n, m, pq)?,
        wt: Mat::from_f32(m, f, wq)?,
        spectrum: lr.spectrum.clone(),
    };
    Ok((out, Scales { p: sp, wt: sw }))
}

fn check_scales(op: &'static str, q: Quant, n: usize, m: usize, f: usize, s: &Scales) -> Result<()> {
    let (gp, gw) = (m * q.groups(n), m * q.groups(f));
    if s.p.len() != gp || s.wt.len() != gw {
        return Err(shape(
            op,
            "scales (P, Wᵀ)",
            format!("{gp}, {gw}"),
            format!("{}, {}", s.p.len(), s.wt.len()),
        ));
    }
    Ok(())
}

/// The codes of a factor pair quantised as `q` (P row-major, then Wᵀ row-major): x / scale,
/// exact because every value is code · scale.
pub fn codes(lr: &LowRank, s: &Scales, q: Quant) -> Result<(Vec<i8>, Vec<i8>)> {
    let (n, m, f) = (lr.p.rows(), lr.rank(), lr.wt.cols());
    check_scales("quant::codes", q, n, m, f, s)?;
    let code = |x: f32, sc: f32| {
        if sc > 0.0 {
            (x / sc).round().clamp(-127.0, 127.0) as i8
        } else {
            0
        }
    };
    let pv = lr.p.to_f32_vec();
    let wv = lr.wt.to_f32_vec();
    let pc = (0..n * m)
        .map(|i| code(pv[i], s.p[p_scale(q, n, i / m.max(1), i % m.max(1))]))
        .collect();
    let wc = (0..m * f)
        .map(|i| code(wv[i], s.wt[w_scale(q, f, i / f.max(1), i % f.max(1))]))
        .collect();
    Ok((pc, wc))
}

/// The factor pair of `codes` (as [`codes`] returns them) and scales, over `rows` tokens and
/// `cols` features, rank `m`.
#[allow(clippy::too_many_arguments)]
pub fn dequantise(
    q: Quant,
    rows: usize,
    m: usize,
    cols: usize,
    p: &[i8],
    wt: &[i8],
    s: &Scales,
    spectrum: Vec<f32>,
) -> Result<LowRank> {
    const OP: &str = "quant::dequantise";
    check_scales(OP, q, rows, m, cols, s)?;
    if p.len() != rows * m || wt.len() != m * cols {
        return Err(shape(
            OP,
            "codes (P, Wᵀ)",
            format!("{}, {}", rows * m, m * cols),
            format!("{}, {}", p.len(), wt.len()),
        ));
    }
    let pv = (0..rows * m)
        .map(|i| p[i] as f32 * s.p[p_scale(q, rows, i / m.max(1), i % m.max(1))])
        .collect();
    let wv = (0..m * cols)
        .map(|i| wt[i] as f32 * s.wt[w_scale(q, cols, i / cols.max(1), i % cols.max(1))])
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
            let (pc, wc) = codes(&deq, &s, q).unwrap();
            assert!(pc.iter().chain(&wc).all(|c| c.unsigned_abs() as i32 <= q.max_code()));
            let back = dequantise(q, 7, 3, 5, &pc, &wc, &s, deq.spectrum.clone()).unwrap();
            assert_eq!(back, deq, "{q:?}");
            let (op, dp) = (orig.p.to_f32_vec(), deq.p.to_f32_vec());
            for (i, (a, b)) in op.iter().zip(dp).enumerate() {
                assert!(
                    (a - b).abs() <= s.p[p_scale(q, 7, i / 3, i % 3)] / 2.0 + 1e-6,
                    "{q:?} {a} {b}"
                );
            }
            let packed = pack_nibbles(&pc);
            assert_eq!(packed.len(), Quant::Int4.code_bytes(pc.len()));
            if q == Quant::Int4 {
                assert_eq!(unpack_nibbles(&packed, pc.len()), pc);
            }
        }
        assert!(dequantise(Quant::Int8, 7, 3, 5, &[0; 3], &[0; 15], &Scales::default(), vec![]).is_err());
        // 4-bit scales are per group of 32 codes and f16-exact.
        let long = LowRank {
            p: Mat::from_f32(
                70,
                1,
                (0..70)
                    .map(|i| if i == 3 { 100.0 } else { (i as f32 * 0.3).sin() })
                    .collect(),
            )
            .unwrap(),
            wt: Mat::from_f32(1, 2, vec![0.5, -1.0]).unwrap(),
            spectrum: vec![],
        };
        let (deq, s) = quantise(&long, Quant::Int4).unwrap();
        assert_eq!((s.p.len(), s.wt.len()), (3, 1));
        assert!(s.p.iter().all(|&x| f16::from_f32(x).to_f32() == x));
        // The outlier in group 0 does not flatten groups 1 and 2.
        let v = deq.p.to_f32_vec();
        assert!(v[40..].iter().filter(|x| **x != 0.0).count() > 25);
        assert_eq!(Quant::Int4.factor_bytes(70, 1, 2), 35 + 1 + 2 * (3 + 1));
    }
}
