//! Reductions written in independent lanes so the compiler vectorises them (a plain `sum()` of
//! f32 is one serial add chain): shared by the attention and the quantized products.

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
