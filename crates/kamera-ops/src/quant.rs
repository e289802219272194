//! Quantised patch factors: int8 codes with one f32 scale per direction (per column of P, per
//! row of Wᵀ), 4-bit codes with one f16 scale per group of 32 codes of a direction, or 4-bit codes
//! whose scale layout (per direction or per group) is chosen per factor matrix. The dense factors
//! of a quantised patch hold the exact values code · scale.

use half::f16;

use crate::error::{Result, shape};
use crate::svd::LowRank;
use crate::tensor::Mat;

mod refit;
pub use refit::{quantise_refit, quantise_refit_ranges};

/// How patch factors are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Quant {
    /// Floats in the patch's dtype.
    #[default]
    None,
    /// Signed 8-bit codes in −127..=127, one f32 scale per direction.
    Int8,
    /// Signed 4-bit codes in −7..=7, two per byte (low nibble first), one f16 scale per group of
    /// [`INT4_GROUP`] consecutive codes of a direction ([`Grain::Group`] for every matrix).
    Int4,
    /// 4-bit codes as `Int4`, each factor matrix (P, Wᵀ of K and of V, per layer) with its own
    /// [`Grain`].
    Int4Mixed,
}

/// Codes per scale of 4-bit factors with [`Grain::Group`].
pub const INT4_GROUP: usize = 32;

/// The scale layout of one quantised factor matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Grain {
    /// One f32 scale per direction (a column of P, a row of Wᵀ).
    #[default]
    Direction,
    /// One f16 scale per [`INT4_GROUP`] consecutive codes of a direction.
    Group,
}

/// The scale layouts of a layer's four factor matrices: K's [P, Wᵀ], then V's [P, Wᵀ].
pub type Grains = [[Grain; 2]; 2];

impl Grain {
    /// Every matrix with this layout.
    pub fn everywhere(self) -> Grains {
        [[self; 2]; 2]
    }

    /// Scales per direction of a vector of `len` codes.
    pub fn groups(self, len: usize) -> usize {
        match self {
            Grain::Direction => 1,
            Grain::Group => len.div_ceil(INT4_GROUP),
        }
    }
    /// Bytes of one stored scale.
    pub fn scale_bytes(self) -> usize {
        match self {
            Grain::Direction => 4,
            Grain::Group => 2,
        }
    }
    /// Codes per scale in a vector of `len` codes.
    fn group_len(self, len: usize) -> usize {
        match self {
            Grain::Group => INT4_GROUP,
            Grain::Direction => len.max(1),
        }
    }
    /// A scale as stored (f16 for groups, rounded up so no code exceeds the range by more than
    /// the clamp).
    fn stored_scale(self, s: f32) -> f32 {
        match self {
            Grain::Group => {
                let h = f16::from_f32(s).to_f32();
                if h < s {
                    f16::from_bits(f16::from_f32(s).to_bits() + 1).to_f32()
                } else {
                    h
                }
            }
            Grain::Direction => s,
        }
    }
}

impl Quant {
    /// The largest code magnitude (0 for floats).
    pub fn max_code(self) -> i32 {
        match self {
            Quant::None => 0,
            Quant::Int8 => 127,
            Quant::Int4 | Quant::Int4Mixed => 7,
        }
    }
    /// Bytes of `len` codes.
    pub fn code_bytes(self, len: usize) -> usize {
        match self {
            Quant::None => 0,
            Quant::Int8 => len,
            Quant::Int4 | Quant::Int4Mixed => len.div_ceil(2),
        }
    }
    /// The scale layout of every matrix, where the type fixes it (`None` for `Int4Mixed`).
    pub fn grain(self) -> Option<Grain> {
        match self {
            Quant::Int4 => Some(Grain::Group),
            Quant::Int4Mixed => None,
            _ => Some(Grain::Direction),
        }
    }
    /// Stored bytes of a rank-`m` factor pair over `rows` tokens and `cols` features whose P and
    /// Wᵀ scales have `grain`: the codes and their scales (0 for floats).
    pub fn factor_bytes(self, rows: usize, m: usize, cols: usize, grain: [Grain; 2]) -> usize {
        match self {
            Quant::None => 0,
            q => {
                q.code_bytes(rows * m)
                    + q.code_bytes(m * cols)
                    + m * (grain[0].groups(rows) * grain[0].scale_bytes()
                        + grain[1].groups(cols) * grain[1].scale_bytes())
            }
        }
    }
}

/// The scales of one quantised factor pair, direction-major: direction j's scales of P (of its
/// column) at `p[j·groups(n)..]`, of Wᵀ (its row) at `wt[j·groups(f)..]`; `grain` is the layout
/// of P's and of Wᵀ's.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scales {
    pub p: Vec<f32>,
    pub wt: Vec<f32>,
    pub grain: [Grain; 2],
}

/// Index of the scale of P element (i, j) and of Wᵀ element (j, c).
fn p_scale(g: Grain, n: usize, i: usize, j: usize) -> usize {
    j * g.groups(n) + i / g.group_len(n)
}
fn w_scale(g: Grain, f: usize, j: usize, c: usize) -> usize {
    j * g.groups(f) + c / g.group_len(f)
}

/// Scales of one matrix (`rows` x `cols`; its directions are columns when `by_col`, else rows)
/// with grain `g`, and its values as stored (code · scale).
fn quantise_mat(v: &[f32], rows: usize, cols: usize, by_col: bool, g: Grain, max: f32) -> (Vec<f32>, Vec<f32>) {
    // Directions are the columns of P (by_col) or the rows of Wᵀ; `len` entries each.
    let (dirs, len) = if by_col { (cols, rows) } else { (rows, cols) };
    let at = |d: usize, e: usize| if by_col { e * cols + d } else { d * cols + e };
    let gl = g.group_len(len);
    let mut s = vec![0.0f32; dirs * g.groups(len)];
    for d in 0..dirs {
        for e in 0..len {
            let k = d * g.groups(len) + e / gl;
            s[k] = s[k].max(v[at(d, e)].abs());
        }
    }
    for x in s.iter_mut() {
        *x = g.stored_scale(*x / max);
    }
    let mut out = vec![0.0f32; v.len()];
    for d in 0..dirs {
        for e in 0..len {
            let sc = s[d * g.groups(len) + e / gl];
            out[at(d, e)] = dequantised(v[at(d, e)], sc, max);
        }
    }
    (s, out)
}

/// Clip ratios a refit tries for each scale: the share of the group's largest magnitude that
/// maps to the largest code.
const CLIPS: [f32; 14] = [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.15, 0.1];
/// [`CLIPS`] padded to a whole number of vectors (the padding's errors are never read).
const LANES: usize = 16;

/// As [`quantise_mat`], each scale chosen among [`CLIPS`] of the group's largest magnitude by
/// the squared rounding error of its entries weighted by `w` (per entry along a direction:
/// per token for P, per feature for Wᵀ; `None`: 1). Entries past the clip saturate.
/// `max[d]` is direction d's largest code magnitude.
pub(super) fn quantise_mat_clipped(
    v: &[f32],
    (rows, cols): (usize, usize),
    by_col: bool,
    g: Grain,
    max: &[f32],
    w: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let (dirs, len) = if by_col { (cols, rows) } else { (rows, cols) };
    let at = |d: usize, e: usize| if by_col { e * cols + d } else { d * cols + e };
    let gl = g.group_len(len);
    let groups = g.groups(len);
    let mut s = vec![0.0f32; dirs * groups];
    let mut out = vec![0.0f32; v.len()];
    // One group's entries (and weights) side by side: the 14 clips each read them all.
    let (mut xs, mut ws) = (Vec::with_capacity(gl), Vec::with_capacity(gl));
    for d in 0..dirs {
        let max = max[d];
        for k in 0..groups {
            let span = k * gl..((k + 1) * gl).min(len);
            xs.clear();
            xs.extend(span.clone().map(|e| v[at(d, e)]));
            ws.clear();
            ws.extend(span.clone().map(|e| w.map_or(1.0, |w| w[e] as f64)));
            let top = xs.iter().map(|x| x.abs()).fold(0.0f32, f32::max);
            // Every clip's error in one pass: 14 independent sums (each in entry order, as a
            // sum per clip would be) instead of one dependent chain at a time.
            let mut scs = [0.0f32; LANES];
            for (sc, c) in scs.iter_mut().zip(CLIPS) {
                *sc = g.stored_scale(top * c / max);
            }
            let errs = clip_errors(&xs, &ws, &scs, max);
            let mut best = (f64::INFINITY, 0.0f32);
            for (&err, &sc) in errs.iter().zip(&scs).take(CLIPS.len()) {
                if err < best.0 {
                    best = (err, sc);
                }
            }
            s[d * groups + k] = best.1;
            for (e, &x) in span.zip(&xs) {
                out[at(d, e)] = dequantised(x, best.1, max);
            }
        }
    }
    (s, out)
}

/// Per scale in `scs`, Σ w·(x − x as stored)² over one group's entries (each sum in entry
/// order), on the widest vectors the CPU has.
fn clip_errors(xs: &[f32], ws: &[f64], scs: &[f32; LANES], max: f32) -> [f64; LANES] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports the feature this function is compiled for.
            return unsafe { clip_errors_avx512(xs, ws, scs, max) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { clip_errors_avx2(xs, ws, scs, max) };
        }
    }
    clip_errors_generic(xs, ws, scs, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn clip_errors_avx512(xs: &[f32], ws: &[f64], scs: &[f32; LANES], max: f32) -> [f64; LANES] {
    clip_errors_generic(xs, ws, scs, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn clip_errors_avx2(xs: &[f32], ws: &[f64], scs: &[f32; LANES], max: f32) -> [f64; LANES] {
    clip_errors_generic(xs, ws, scs, max)
}

#[inline(always)]
fn clip_errors_generic(xs: &[f32], ws: &[f64], scs: &[f32; LANES], max: f32) -> [f64; LANES] {
    let mut errs = [0.0f64; LANES];
    for (&x, &wt) in xs.iter().zip(ws) {
        let mut diff = [0.0f32; LANES];
        for (d, &sc) in diff.iter_mut().zip(scs) {
            *d = x - dequantised(x, sc, max);
        }
        for (err, &d) in errs.iter_mut().zip(&diff) {
            *err += wt * (d as f64 * d as f64);
        }
    }
    errs
}

/// `x` as stored with scale `sc` and codes in −`max`..=`max` (`max` < 2²²): round(x / sc)
/// (half away from zero, as `f32::round`) clamped, times `sc`; 0 for a zero scale. Plain float
/// operations and selects, no call to `roundf` and no saturating conversion, so a loop over
/// clips vectorises; bit for bit what `(x / sc).round().clamp(-max, max) * sc` stores.
#[inline(always)]
fn dequantised(x: f32, sc: f32, max: f32) -> f32 {
    const SHIFT: f32 = 8_388_608.0; // 2²³: x + 2²³ − 2²³ rounds x ≥ 0 to the nearest integer.
    let q = x / sc;
    // Past max + 1 every quotient clamps to max: bounding it first keeps the rounding exact.
    let t = q.abs().min(max + 1.0);
    let u = t + 0.5;
    let nearest = (u + SHIFT) - SHIFT;
    let floor = if nearest > u { nearest - 1.0 } else { nearest };
    // t + 0.5 rounds up to 1 for the one t just below 0.5 (0.5 − 2⁻²⁵): floor(t + 0.5) is
    // then one too many (floor − 0.5 is exact for an integer this small).
    let rounded = if floor - 0.5 > t { floor - 1.0 } else { floor };
    let value = rounded.min(max).copysign(q) * sc;
    let value = if x.is_nan() { x } else { value };
    if sc > 0.0 { value } else { 0.0 }
}

/// Quantises `lr` with the scale layout `quant` fixes (per direction for `Int4Mixed`): returns
/// the factors holding code · scale (f32) and their scales.
pub fn quantise(lr: &LowRank, q: Quant) -> Result<(LowRank, Scales)> {
    let g = q.grain().unwrap_or_default();
    quantise_grains(lr, q, [g, g])
}

/// Quantises `lr` with P's and Wᵀ's scale layouts given.
pub fn quantise_grains(lr: &LowRank, q: Quant, grain: [Grain; 2]) -> Result<(LowRank, Scales)> {
    let (n, m, f) = (lr.p.rows(), lr.rank(), lr.wt.cols());
    let max = q.max_code() as f32;
    if max == 0.0 {
        return Ok((lr.clone(), Scales::default()));
    }
    let (sp, pq) = quantise_mat(&lr.p.to_f32_vec(), n, m, true, grain[0], max);
    let (sw, wq) = quantise_mat(&lr.wt.to_f32_vec(), m, f, false, grain[1], max);
    let out = LowRank {
        p: Mat::from_f32(n, m, pq)?,
        wt: Mat::from_f32(m, f, wq)?,
        spectrum: lr.spectrum.clone(),
    };
    Ok((out, Scales { p: sp, wt: sw, grain }))
}

/// Quantises `lr` as 4-bit codes with the pair of scale layouts whose product P̂Ŵᵀ is closest
/// to PWᵀ (squared error; ties to per-direction scales, which are fewer bytes).
pub fn quantise_auto(lr: &LowRank) -> Result<(LowRank, Scales)> {
    let dense = lr.dense();
    let mut best: Option<(f64, LowRank, Scales)> = None;
    for gp in [Grain::Direction, Grain::Group] {
        for gw in [Grain::Direction, Grain::Group] {
            let (q, s) = quantise_grains(lr, Quant::Int4Mixed, [gp, gw])?;
            let err: f64 = q
                .dense()
                .iter()
                .zip(&dense)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum();
            if best.as_ref().is_none_or(|(e, _, _)| err < *e) {
                best = Some((err, q, s));
            }
        }
    }
    let (_, q, s) = best.expect("four candidates");
    Ok((q, s))
}

fn check_scales(op: &'static str, n: usize, m: usize, f: usize, s: &Scales) -> Result<()> {
    let (gp, gw) = (m * s.grain[0].groups(n), m * s.grain[1].groups(f));
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

/// The codes of a quantised factor pair (P row-major, then Wᵀ row-major): x / scale, exact
/// because every value is code · scale.
pub fn codes(lr: &LowRank, s: &Scales) -> Result<(Vec<i8>, Vec<i8>)> {
    let (n, m, f) = (lr.p.rows(), lr.rank(), lr.wt.cols());
    check_scales("quant::codes", n, m, f, s)?;
    let code = |x: f32, sc: f32| {
        if sc > 0.0 {
            (x / sc).round().clamp(-127.0, 127.0) as i8
        } else {
            0
        }
    };
    let [gp, gw] = s.grain;
    let pv = lr.p.to_f32_vec();
    let wv = lr.wt.to_f32_vec();
    let pc = (0..n * m)
        .map(|i| code(pv[i], s.p[p_scale(gp, n, i / m.max(1), i % m.max(1))]))
        .collect();
    let wc = (0..m * f)
        .map(|i| code(wv[i], s.wt[w_scale(gw, f, i / f.max(1), i % f.max(1))]))
        .collect();
    Ok((pc, wc))
}

/// The factor pair of `codes` (as [`codes`] returns them) and scales, over `rows` tokens and
/// `cols` features, rank `m`.
pub fn dequantise(
    rows: usize,
    m: usize,
    cols: usize,
    p: &[i8],
    wt: &[i8],
    s: &Scales,
    spectrum: Vec<f32>,
) -> Result<LowRank> {
    const OP: &str = "quant::dequantise";
    check_scales(OP, rows, m, cols, s)?;
    if p.len() != rows * m || wt.len() != m * cols {
        return Err(shape(
            OP,
            "codes (P, Wᵀ)",
            format!("{}, {}", rows * m, m * cols),
            format!("{}, {}", p.len(), wt.len()),
        ));
    }
    let [gp, gw] = s.grain;
    let pv = (0..rows * m)
        .map(|i| p[i] as f32 * s.p[p_scale(gp, rows, i / m.max(1), i % m.max(1))])
        .collect();
    let wv = (0..m * cols)
        .map(|i| wt[i] as f32 * s.wt[w_scale(gw, cols, i / cols.max(1), i % cols.max(1))])
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

    /// The fast rounding stores exactly what `f32::round` and a clamp store: random quotients,
    /// exact half-way ties (away from zero), signed zeros, quotients far past the codes.
    #[test]
    fn dequantised_equals_round_and_clamp() {
        let reference = |x: f32, sc: f32, max: f32| {
            if sc > 0.0 {
                (x / sc).round().clamp(-max, max) * sc
            } else {
                0.0
            }
        };
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for max in [1.0f32, 7.0, 127.0] {
            for i in 0..20_000 {
                let sc: f32 = [0.0, 1e-30, 0.013, 0.5, 3.0][i % 5];
                let x = match i % 4 {
                    0 => next() * 4.0 * max * sc.max(1e-3),
                    1 => ((i / 4 % 300) as f32 - 150.0 + 0.5) * sc,
                    2 => next() * 1e30,
                    _ => -0.0,
                };
                let (a, b) = (dequantised(x, sc, max), reference(x, sc, max));
                assert!(
                    a.to_bits() == b.to_bits(),
                    "x {x:e} sc {sc:e} max {max}: {a:e} vs {b:e}"
                );
            }
        }
        assert!(dequantised(f32::NAN, 0.5, 7.0).is_nan());
        // Every 31st f32 quotient from 0 to 130 with scale 1 (an exhaustive run found no
        // difference), and the one below 0.5 whose + 0.5 rounds up.
        let (lo, hi) = (0u32, 130f32.to_bits());
        for bits in (lo..hi).step_by(31).chain([(0.5f32 - 2f32.powi(-25)).to_bits()]) {
            let x = f32::from_bits(bits);
            for x in [x, -x] {
                let (a, b) = (dequantised(x, 1.0, 127.0), reference(x, 1.0, 127.0));
                assert!(a.to_bits() == b.to_bits(), "x {x:e}: {a:e} vs {b:e}");
            }
        }
    }

    /// A pseudo-random rank-`m` pair with a few large P entries (what clipping is for).
    fn rand_lr(n: usize, m: usize, f: usize, seed: u64) -> LowRank {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let p = (0..n * m)
            .map(|i| next() * if i % 37 == 5 { 12.0 } else { 1.0 } * (m - i % m) as f32)
            .collect();
        let w = (0..m * f).map(|_| next()).collect();
        LowRank {
            p: Mat::from_f32(n, m, p).unwrap(),
            wt: Mat::from_f32(m, f, w).unwrap(),
            spectrum: vec![],
        }
    }

    #[test]
    fn refit_codes_round_trip_and_lower_the_error() {
        let err = |a: &LowRank, b: &LowRank, r: &[f32]| -> f64 {
            let f = a.wt.cols();
            a.dense()
                .iter()
                .zip(b.dense())
                .enumerate()
                .map(|(i, (x, y))| r[i / f] as f64 * ((x - y) as f64).powi(2))
                .sum()
        };
        let (mut plain, mut refit) = (0.0, 0.0);
        for seed in 1..13u64 {
            let (n, m, f) = (96, 6, 40);
            let orig = rand_lr(n, m, f, seed);
            let r: Vec<f32> = (0..n).map(|t| 0.2 + ((t as u64 * 7 + seed) % 5) as f32).collect();
            for (q, g) in [(Quant::Int4, [Grain::Group; 2]), (Quant::Int8, [Grain::Direction; 2])] {
                let (deq, s) = quantise_refit(&orig, q, g, Some(&r), None).unwrap();
                assert_eq!(s.grain, g);
                let (pc, wc) = codes(&deq, &s).unwrap();
                assert!(pc.iter().chain(&wc).all(|c| c.unsigned_abs() as i32 <= q.max_code()));
                let back = dequantise(n, m, f, &pc, &wc, &s, deq.spectrum.clone()).unwrap();
                assert_eq!(back, deq, "{q:?}: values must be code x scale");
                if q == Quant::Int4 {
                    plain += err(&orig, &quantise_grains(&orig, q, g).unwrap().0, &r);
                    refit += err(&orig, &deq, &r);
                }
            }
        }
        assert!(refit < 0.9 * plain, "refit {refit} vs plain {plain}");
        assert!(quantise_refit(&lr(), Quant::Int4, [Grain::Group; 2], Some(&[1.0; 3]), None).is_err());
        let (same, _) = quantise_refit(&lr(), Quant::None, [Grain::Direction; 2], None, None).unwrap();
        assert_eq!(same, lr());
    }

    #[test]
    fn codes_round_trip_exactly_and_errors_are_bounded() {
        let grains = [Grain::Direction, Grain::Group];
        for (q, g) in [
            (Quant::Int8, [Grain::Direction; 2]),
            (Quant::Int4, [Grain::Group; 2]),
            (Quant::Int4Mixed, [Grain::Direction, Grain::Group]),
            (Quant::Int4Mixed, [Grain::Group, Grain::Direction]),
        ] {
            let orig = lr();
            let (deq, s) = quantise_grains(&orig, q, g).unwrap();
            assert!(grains.contains(&s.grain[0]));
            let (pc, wc) = codes(&deq, &s).unwrap();
            assert!(pc.iter().chain(&wc).all(|c| c.unsigned_abs() as i32 <= q.max_code()));
            let back = dequantise(7, 3, 5, &pc, &wc, &s, deq.spectrum.clone()).unwrap();
            assert_eq!(back, deq, "{q:?}");
            let (op, dp) = (orig.p.to_f32_vec(), deq.p.to_f32_vec());
            for (i, (a, b)) in op.iter().zip(dp).enumerate() {
                assert!(
                    (a - b).abs() <= s.p[p_scale(g[0], 7, i / 3, i % 3)] / 2.0 + 1e-6,
                    "{q:?} {a} {b}"
                );
            }
            let packed = pack_nibbles(&pc);
            assert_eq!(packed.len(), Quant::Int4.code_bytes(pc.len()));
            if q != Quant::Int8 {
                assert_eq!(unpack_nibbles(&packed, pc.len()), pc);
            }
        }
        assert_eq!(quantise(&lr(), Quant::Int4).unwrap().1.grain, [Grain::Group; 2]);
        assert!(dequantise(7, 3, 5, &[0; 3], &[0; 15], &Scales::default(), vec![]).is_err());
        // 4-bit group scales are per group of 32 codes and f16-exact.
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
        let g = [Grain::Group; 2];
        assert_eq!(Quant::Int4.factor_bytes(70, 1, 2, g), 35 + 1 + 2 * (3 + 1));
        let d = [Grain::Direction, Grain::Group];
        assert_eq!(Quant::Int4Mixed.factor_bytes(70, 1, 2, d), 35 + 1 + 4 + 2);
        // Per direction, the outlier flattens the rest: the automatic choice takes the groups.
        let (auto, s) = quantise_auto(&long).unwrap();
        assert_eq!(s.grain[0], Grain::Group);
        assert_eq!(auto.p, deq.p);
    }

    #[test]
    fn the_automatic_choice_never_loses_to_a_fixed_layout() {
        let err = |q: &LowRank, o: &LowRank| -> f64 {
            q.dense()
                .iter()
                .zip(o.dense())
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum()
        };
        let o = lr();
        let (a, _) = quantise_auto(&o).unwrap();
        for g in [[Grain::Direction; 2], [Grain::Group; 2]] {
            let (q, _) = quantise_grains(&o, Quant::Int4Mixed, g).unwrap();
            assert!(err(&a, &o) <= err(&q, &o));
        }
    }
}
