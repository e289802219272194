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
/// (tested); 0 below −87 (under f32's normal range).
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.max(-87.0);
    let n = (xc * std::f32::consts::LOG2_E).round();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, xc));
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let v = p * f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < -87.0 { 0.0 } else { v }
}
