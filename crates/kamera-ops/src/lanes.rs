//! AVX-512 pieces the kernels share (rotation, the patch's product).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The lanes of `v` that hold ±∞ or NaN (`|x| < ∞` is false for them).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn non_finite(v: __m512) -> __mmask16 {
    let abs = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fff_ffff)));
    !_mm512_cmp_ps_mask::<_CMP_LT_OQ>(abs, _mm512_set1_ps(f32::INFINITY))
}
