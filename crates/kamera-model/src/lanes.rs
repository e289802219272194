//! Reductions written in independent lanes so the compiler vectorises them (a plain `sum()` of
//! f32 is one serial add chain), and a branch-free exponential: shared by the attention, the
//! activations and the quantized products.

/// `Σ a_i b_i` in 8 lanes.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for t in 0..8 {
            acc[t] += x[t] * y[t];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// eˣ for x ≤ 0 (softmax arguments after subtracting the max), branch-free so it vectorises:
/// x = n·ln2 + r with n = round(x·log₂e) and r reduced in two steps (Cody-Waite, |r| ≤ ln2/2),
/// eʳ by a degree-7 Taylor polynomial, 2ⁿ from exponent bits; relative error a few ulps
/// (tested); 0 below −87 (under f32's normal range). n is rounded by adding 1.5·2²³, which
/// leaves it in the low mantissa bits (no float-to-int cast, whose saturation is scalar code).
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    let xc = x.max(EXP_FLOOR);
    let t = xc.mul_add(std::f32::consts::LOG2_E, ROUND);
    let n = t - ROUND;
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, xc));
    let p = EXP_TAYLOR.iter().fold(0.0, |p, &c| p * r + c);
    let v = p * f32::from_bits(t.to_bits().wrapping_add(127) << 23);
    if x < EXP_FLOOR { 0.0 } else { v }
}

/// ln 2 in two parts (Cody-Waite: `n · LN2_HI` is exact for the n of f32's range).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this eˣ is under f32's normal range and taken as 0.
const EXP_FLOOR: f32 = -87.0;
/// eʳ's Taylor coefficients to degree 7, highest first (Horner's order).
const EXP_TAYLOR: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// [`exp_nonpositive`] on 16 lanes (the same reduction and polynomial; 2ⁿ by `vscalefps`).
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn exp_nonpositive_x16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let floor = _mm512_set1_ps(EXP_FLOOR);
    // maxps returns its second operand for a NaN lane, like `f32::max` here.
    let xc = _mm512_max_ps(x, floor);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        xc,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), xc);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_setzero_ps();
    for c in EXP_TAYLOR {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, floor);
    _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n))
}
