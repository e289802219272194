//! The int8 decode product (`vnni.rs`) on AVX2, for hosts without AVX512-VNNI (llama.cpp's AVX2
//! way): 32 codes as bytes times 32 rounded inputs by `vpmaddubsw` (pairs into i16) and
//! `vpmaddwd` with ones (fours into i32: one lane per quantization block of 4, as `vpdpbusd`
//! gives), each lane scaled by its group's scale and its block's `dx`. Codes stay below 2⁷ in
//! magnitude (4-, 5- and Q5_K's 5-bit codes unsigned; signed bytes multiplied as `|c| · sign(c)·q`),
//! so no i16 pair sum saturates (at most 2 · 128 · 127).

use std::arch::x86_64::*;

use super::avx2::{I8, U4, U5, U8, by_kind};
use super::table::{Scale, with_table, x86::RowOffsets, x86::get, x86::set8};
use super::{Codes, Q8Input, QMatrix, U5_GROUP_BYTES, avx2, dot};

/// `out[i] = Σ_g scale_g · Σ_{i∈g} code_i · dx_i q_i` over rows `r0 + i` of `m`
/// (`vnni::code_rows`): one dispatch for the rows, each row's bytes asked for
/// [`avx2::PREFETCH_ROWS`] ahead. Q5_0 streamed from memory on one Zen 3 core: 14.5 G weights/s,
/// against 8.0 with a call and no prefetch per row.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `r0 + out.len() <= m.rows`; `x` has `m.cols` values (padded to 64).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn code_rows(m: &QMatrix, r0: usize, x: &Q8Input, xsum: &[f32], out: &mut [f32]) {
    unsafe { with_table!(&m.scales, s => by_kind!(&m.codes, code_rows_kind::<_>(m, s, r0, x, xsum, out))) }
}

// The row loop is this function's and vnni.rs's own, not one helper taking the row as a
// closure: a closure's body is compiled without the kernel's target features, so its
// intrinsics stay calls (the int8 probe ran 25x slower that way).
#[inline(always)]
unsafe fn code_rows_kind<const K: u8, T: Scale>(
    m: &QMatrix,
    scales: &[T],
    r0: usize,
    x: &Q8Input,
    xsum: &[f32],
    out: &mut [f32],
) {
    unsafe {
        let offsets = RowOffsets::new(m, scales, xsum);
        for (i, o) in out.iter_mut().enumerate() {
            avx2::prefetch_row::<K>(m, r0 + i + avx2::PREFETCH_ROWS);
            *o = row::<K, T>(m, scales, r0 + i, x) + offsets.avx2(r0 + i);
        }
    }
}

/// Row `r` of [`code_rows`]: each 32-value step's codes as bytes times the rounded inputs, its
/// eight lanes of four scaled by their group's scale and their block's `dx`.
#[inline(always)]
unsafe fn row<const K: u8, T: Scale>(m: &QMatrix, scales: &[T], r: usize, x: &Q8Input) -> f32 {
    unsafe {
        if K == U4 {
            return row_u4(m, scales, r, x);
        }
        let (q, dxv) = super::vnni::parts(x, m);
        let (g, cols) = (m.group, m.cols);
        let codes = dot::row_codes(m, r).as_ptr();
        let scales = scales.as_ptr().add(r * (cols / g));
        let ones = _mm256_set1_epi16(1);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        // Lane l of step h reads values 32h + 4l ..: group h (groups of 32) or 2h, 2h + 1 (of
        // 16); a row of byte codes in groups of 16 may end on half a step, whose upper half is
        // then zeros (the input's padding is zeros; codes past the row are not read).
        for h in 0..cols.div_ceil(32) {
            let half = 32 * h + 32 > cols;
            let xs = _mm256_loadu_si256(q.as_ptr().add(32 * h) as *const __m256i);
            let w = match K {
                U4 => avx2::nibbles32(codes.add(16 * h)),
                U5 => avx2::fives32(codes.add(U5_GROUP_BYTES * h)),
                _ if half => _mm256_zextsi128_si256(_mm_loadu_si128(codes.add(32 * h) as *const __m128i)),
                _ => _mm256_loadu_si256(codes.add(32 * h) as *const __m256i),
            };
            let pairs = if K == I8 {
                _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xs, w))
            } else {
                _mm256_maddubs_epi16(w, xs)
            };
            let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            let sv = if g == 32 {
                set8(scales.add(h))
            } else {
                let s1 = if half { 0.0 } else { get(scales.add(2 * h + 1)) };
                _mm256_setr_m128(_mm_set1_ps(get(scales.add(2 * h))), _mm_set1_ps(s1))
            };
            let scale = _mm256_mul_ps(sv, _mm256_loadu_ps(dxv.as_ptr().add(8 * h)));
            if h % 2 == 0 {
                a0 = _mm256_fmadd_ps(lanes, scale, a0);
            } else {
                a1 = _mm256_fmadd_ps(lanes, scale, a1);
            }
        }
        avx2::hsum(_mm256_add_ps(a0, a1))
    }
}

/// Row `r` of 4-bit codes, two groups (32 bytes) a step, on the input in the paired order
/// (`vnni::Q8Input`): the low nibbles are both groups' first 16 codes, the high ones their last
/// 16, and both meet one `dx` per group, so their `vpmaddubsw` pair sums add as i16 (at most
/// 2 · 2 · 15 · 127, no saturation) before one `vpmaddwd`, one conversion and one FMA per 64
/// codes (the loop in [`row`] takes two of each).
#[inline(always)]
unsafe fn row_u4<T: Scale>(m: &QMatrix, scales: &[T], r: usize, x: &Q8Input) -> f32 {
    unsafe {
        let (xq, xdx) = super::vnni::paired(x);
        let gpr = m.cols / 32;
        let codes = dot::row_codes(m, r).as_ptr();
        let scales = scales.as_ptr().add(r * gpr);
        let (low, ones) = (_mm256_set1_epi8(15), _mm256_set1_epi16(1));
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        // Step h: groups 2h, 2h + 1, in chunk h / 2 of the paired input at half h % 2.
        for h in 0..gpr.div_ceil(2) {
            let at = 128 * (h / 2) + 32 * (h % 2);
            let z = if 2 * h + 1 < gpr {
                _mm256_loadu_si256(codes.add(32 * h) as *const __m256i)
            } else {
                _mm256_zextsi128_si256(_mm_loadu_si128(codes.add(32 * h) as *const __m128i))
            };
            let lo = _mm256_and_si256(z, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(z), low);
            let pairs = _mm256_add_epi16(
                _mm256_maddubs_epi16(lo, _mm256_loadu_si256(xq.add(at) as *const __m256i)),
                _mm256_maddubs_epi16(hi, _mm256_loadu_si256(xq.add(at + 64) as *const __m256i)),
            );
            let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            let s1 = if 2 * h + 1 < gpr {
                get(scales.add(2 * h + 1))
            } else {
                0.0
            };
            let sv = _mm256_setr_m128(_mm_set1_ps(get(scales.add(2 * h))), _mm_set1_ps(s1));
            let scale = _mm256_mul_ps(sv, _mm256_loadu_ps(xdx.add(16 * (h / 2) + 8 * (h % 2))));
            if h % 2 == 0 {
                a0 = _mm256_fmadd_ps(lanes, scale, a0);
            } else {
                a1 = _mm256_fmadd_ps(lanes, scale, a1);
            }
        }
        avx2::hsum(_mm256_add_ps(a0, a1))
    }
}
