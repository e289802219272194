//! The int8 decode product (`vnni.rs`) on AVX2, for hosts without AVX512-VNNI (llama.cpp's AVX2
//! way): 32 codes as bytes times 32 rounded inputs by `vpmaddubsw` (pairs into i16) and
//! `vpmaddwd` with ones (fours into i32: one lane per quantization block of 4, as `vpdpbusd`
//! gives), each lane scaled by its group's scale and its block's `dx`. Codes stay below 2⁷ in
//! magnitude (4-, 5- and Q5_K's 5-bit codes unsigned; signed bytes multiplied as `|c| · sign(c)·q`),
//! so no i16 pair sum saturates (at most 2 · 128 · 127).

use std::arch::x86_64::*;

use super::{Codes, Q8Input, QMatrix, U5_GROUP_BYTES, avx2};

/// `Σ_g scale_g · Σ_{i∈g} code_i · dx_i q_i` over row `r` of `m` (`vnni::code_dot`).
///
/// # Safety
/// The CPU has AVX2 and FMA; `r < m.rows`; `x` has `m.cols` values (padded to 64).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn code_dot(m: &QMatrix, r: usize, x: &Q8Input) -> f32 {
    unsafe {
        let (q, dxv) = super::vnni::parts(x);
        let (g, cols) = (m.group, m.cols);
        let gpr = cols / g;
        let scales = &m.scales[r * gpr..(r + 1) * gpr];
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); 2];
        for h in 0..cols.div_ceil(32) {
            let xs = _mm256_loadu_si256(q.as_ptr().add(32 * h) as *const __m256i);
            let pairs = match &m.codes {
                Codes::I8(c) => {
                    let w = bytes32(c.as_ptr() as *const u8, r * cols, h, cols);
                    _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xs, w))
                }
                Codes::U8(c) => _mm256_maddubs_epi16(bytes32(c.as_ptr(), r * cols, h, cols), xs),
                Codes::U4(c) => _mm256_maddubs_epi16(nibbles32(c.as_ptr().add((r * gpr + h) * 16)), xs),
                Codes::U5(c) => _mm256_maddubs_epi16(fives32(c.as_ptr().add((r * gpr + h) * U5_GROUP_BYTES)), xs),
            };
            let dp = _mm256_madd_epi16(pairs, ones);
            // Lane l reads values 32h + 4l ..: group h (groups of 32) or 2h, 2h + 1 (of 16).
            let sv = if g == 32 {
                _mm256_set1_ps(scales[h])
            } else {
                let s1 = scales.get(2 * h + 1).copied().unwrap_or(0.0);
                _mm256_setr_m128(_mm_set1_ps(scales[2 * h]), _mm_set1_ps(s1))
            };
            let scale = _mm256_mul_ps(sv, _mm256_loadu_ps(dxv.as_ptr().add(8 * h)));
            acc[h % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), scale, acc[h % 2]);
        }
        avx2::hsum(_mm256_add_ps(acc[0], acc[1]))
    }
}

/// Byte codes `32h..32h + 32` of the row starting at `row` (zeros past `cols`).
#[inline(always)]
unsafe fn bytes32(base: *const u8, row: usize, h: usize, cols: usize) -> __m256i {
    unsafe {
        let at = base.add(row + 32 * h);
        if 32 * h + 32 <= cols {
            return _mm256_loadu_si256(at as *const __m256i);
        }
        let mut tail = [0u8; 32];
        std::ptr::copy_nonoverlapping(at, tail.as_mut_ptr(), cols - 32 * h);
        _mm256_loadu_si256(tail.as_ptr() as *const __m256i)
    }
}

/// A group of 32 4-bit codes (16 bytes at `p`) as 32 bytes in order: low nibbles, then high.
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    unsafe {
        let (lo, hi) = avx2::nibbles(p);
        _mm256_set_m128i(hi, lo)
    }
}

/// A group of 32 5-bit codes (`Codes::U5`, 20 bytes at `p`) as 32 bytes: the nibbles, plus 16
/// where the code's fifth bit is set.
#[inline(always)]
unsafe fn fives32(p: *const u8) -> __m256i {
    unsafe { _mm256_or_si256(nibbles32(p), avx2::fifth_bits(p)) }
}
