//! The code products on AVX2 + FMA (x86 hosts without AVX-512: AMD Zen 1-3, Intel client
//! cores): a group's codes widened to f32 eight at a time, then the same three products as the
//! AVX-512 kernels — decode's row dot (`dot.rs`), short prefills' row blocks (`rows.rs`; byte
//! codes as weight-row pairs) and the panel dequantization of long prefills (`matmul.rs`).
//! Before them the portable loops ran there, with the code widening left scalar: prefills of
//! 16-96 tokens were 3.3-6.7x slower, decode 1.2-1.3x (`bench/model/avx2-zen3-2026-12-05.md`).

use std::arch::x86_64::*;

use super::rows::{BLOCK, scale_offset};
use super::table::{Scale, with_table, x86::RowOffsets, x86::set8};
use super::{Codes, QMatrix, U5_GROUP_BYTES};

/// Code kinds as const parameters, so a kernel's inner loop holds no match.
pub(super) const U8: u8 = 0;
pub(super) const I8: u8 = 1;
pub(super) const U4: u8 = 2;
pub(super) const U5: u8 = 3;

/// `$f::<K>(args)` with `K` the const kind of `$codes` (the kernels' one dispatch);
/// `$f::<_>(args)` gives `$f::<K, _>`, its second parameter (the scales' type) inferred.
macro_rules! by_kind {
    ($codes:expr, $f:ident::<_>($($arg:expr),*)) => {
        match $codes {
            Codes::U8(_) => $f::<U8, _>($($arg),*),
            Codes::I8(_) => $f::<I8, _>($($arg),*),
            Codes::U4(_) => $f::<U4, _>($($arg),*),
            Codes::U5(_) => $f::<U5, _>($($arg),*),
        }
    };
    ($codes:expr, $f:ident($($arg:expr),*)) => {
        match $codes {
            Codes::U8(_) => $f::<U8>($($arg),*),
            Codes::I8(_) => $f::<I8>($($arg),*),
            Codes::U4(_) => $f::<U4>($($arg),*),
            Codes::U5(_) => $f::<U5>($($arg),*),
        }
    };
}
pub(super) use by_kind;

/// Whether this CPU has AVX2, FMA and F16C (for f16 scales): the one check before any kernel
/// here (or in `avx2_int8.rs`) is called.
pub(super) fn available() -> bool {
    super::table::x86::has_f16c()
}

/// Bytes a group of `g` codes of kind `K` takes.
#[inline(always)]
pub(super) const fn group_bytes<const K: u8>(g: usize) -> usize {
    match K {
        U4 => 16,
        U5 => U5_GROUP_BYTES,
        _ => g,
    }
}

/// Eight unsigned bytes (the low half of `v`) as f32.
#[inline(always)]
unsafe fn u8x8(v: __m128i) -> __m256 {
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)) }
}

/// The eight byte codes at `p` as f32, sign-extended when `K` is [`I8`].
#[inline(always)]
unsafe fn b8x8<const K: u8>(p: *const u8) -> __m256 {
    unsafe {
        let v = _mm_loadl_epi64(p as *const __m128i);
        if K == I8 {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
        } else {
            u8x8(v)
        }
    }
}

/// A group of 32 4-bit codes (16 bytes at `p`) as bytes: (codes 0..16, codes 16..32), the low
/// nibbles then the high ones.
#[inline(always)]
pub(super) unsafe fn nibbles(p: *const u8) -> (__m128i, __m128i) {
    unsafe {
        let v = _mm_loadu_si128(p as *const __m128i);
        let m = _mm_set1_epi8(15);
        (_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m))
    }
}

/// The fifth bits of a [`Codes::U5`] group (20 bytes at `p`) as 16 in byte j where code j has
/// it: bit j of the little-endian u32 after the nibbles; byte j gets the u32's byte j / 8, then
/// bit j % 8 is tested.
#[inline(always)]
pub(super) unsafe fn fifth_bits(p: *const u8) -> __m256i {
    unsafe {
        let high = (p.add(16) as *const u32).read_unaligned() as i32;
        let b = _mm256_shuffle_epi8(
            _mm256_set1_epi32(high),
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(16))
    }
}

/// A group of 32 4-bit codes (16 bytes at `p`) as 32 bytes in order: low nibbles, then high.
#[inline(always)]
pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
    unsafe {
        let (lo, hi) = nibbles(p);
        _mm256_set_m128i(hi, lo)
    }
}

/// A group of 32 5-bit codes (`Codes::U5`, 20 bytes at `p`) as 32 bytes: the nibbles, plus 16
/// where the code's fifth bit is set.
#[inline(always)]
pub(super) unsafe fn fives32(p: *const u8) -> __m256i {
    unsafe { _mm256_or_si256(nibbles32(p), fifth_bits(p)) }
}

/// The group at `p` widened to f32, eight codes a vector: all four for a group of 32, the
/// first two for a group of 16 (byte codes only; 4- and 5-bit groups are always 32).
#[inline(always)]
unsafe fn group<const K: u8>(p: *const u8, g: usize) -> [__m256; 4] {
    unsafe {
        match K {
            U4 | U5 => {
                let (mut lo, mut hi) = nibbles(p);
                if K == U5 {
                    let sixteen = fifth_bits(p);
                    lo = _mm_or_si128(lo, _mm256_castsi256_si128(sixteen));
                    hi = _mm_or_si128(hi, _mm256_extracti128_si256::<1>(sixteen));
                }
                [
                    u8x8(lo),
                    u8x8(_mm_srli_si128(lo, 8)),
                    u8x8(hi),
                    u8x8(_mm_srli_si128(hi, 8)),
                ]
            }
            _ if g == 32 => [
                b8x8::<K>(p),
                b8x8::<K>(p.add(8)),
                b8x8::<K>(p.add(16)),
                b8x8::<K>(p.add(24)),
            ],
            _ => {
                let z = _mm256_setzero_ps();
                [b8x8::<K>(p), b8x8::<K>(p.add(8)), z, z]
            }
        }
    }
}

/// The sum of the eight lanes.
#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// Rows ahead of the one being multiplied whose bytes decode asks for ([`prefetch_row`]):
/// decode streams every weight from memory once, and the hardware prefetcher alone, following a
/// matrix's codes and scales as separate streams, left one Zen 3 core at 6-9 GB/s of its 18.
/// Four rows ahead (2-4 KB) measured as well as eight or sixteen.
pub(super) const PREFETCH_ROWS: usize = 4;

/// `out[i] = Σ_g scales[g] · Σ_{i∈g} code_i x_i` over rows `r0 + i` of `q` (`dot::rows_into`,
/// decode): one dispatch for the rows, each row's bytes asked for [`PREFETCH_ROWS`] ahead.
/// (Blocks of four rows sharing the input's loads were faster with the matrix in cache and
/// slower streaming it from memory: Q8_0 10.6 against 14.5 G weights/s.)
///
/// With `in_lane_order`, `x` is in [`lane_order`] and the rows go through [`lanes_row_dot`].
/// Each row's offsets' term on `xsum` is added (none where `xsum` is empty).
///
/// # Safety
/// The CPU has AVX2 and FMA; `r0 + out.len() <= q.rows`; `x` has `q.cols` values; with
/// `in_lane_order`, `q`'s groups are of 32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn code_rows(q: &QMatrix, r0: usize, x: &[f32], in_lane_order: bool, xsum: &[f32], out: &mut [f32]) {
    unsafe {
        with_table!(&q.scales, s => by_kind!(&q.codes, code_rows_kind::<_>(q, s, r0, x, in_lane_order, xsum, out)))
    }
}

#[inline(always)]
unsafe fn code_rows_kind<const K: u8, T: Scale>(
    q: &QMatrix,
    scales: &[T],
    r0: usize,
    x: &[f32],
    in_lane_order: bool,
    xsum: &[f32],
    out: &mut [f32],
) {
    unsafe {
        let offsets = RowOffsets::new(q, scales, xsum);
        for (i, o) in out.iter_mut().enumerate() {
            prefetch_row::<K>(q, r0 + i + PREFETCH_ROWS);
            *o = if in_lane_order {
                lanes_row_dot::<K, T>(q, scales, r0 + i, x)
            } else {
                row_dot::<K, T>(q, scales, r0 + i, x)
            } + offsets.avx2(r0 + i);
        }
    }
}

/// `x` reordered for [`lanes_row_dot`]: in each group of 32, the values at `16h + 4i + k` for
/// `k` in 0..4, then `h` in 0..2, then `i` in 0..4 (the order a group's code bytes come out of
/// 32-bit lanes by shifts).
pub(super) fn lane_order(x: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (g, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(32)) {
        for k in 0..4 {
            for h in 0..2 {
                for i in 0..4 {
                    o[8 * k + 4 * h + i] = g[16 * h + 4 * i + k];
                }
            }
        }
    }
    out
}

/// Row `r` of [`code_rows`] for groups of 32 on an input in [`lane_order`]: a group's 32 codes
/// as bytes in one register, each fourth byte of its 32-bit lanes taken by a shift (and a mask
/// or a sign extension) instead of a byte-to-lane widening, which runs on the shuffle units the
/// 5-bit expansion also needs. From memory on one Zen 3 core: Q5_0 10.1 against 7.3 G
/// weights/s, Q4_K 12.8 / 9.9, Q4_1 12.6 / 9.7; byte codes gain nothing (Q8_0 14.2 / 14.5), so
/// decode routes only 4- and 5-bit codes here (`dot::lane_input`); every kind is correct (tested).
#[inline(always)]
unsafe fn lanes_row_dot<const K: u8, T: Scale>(q: &QMatrix, scales: &[T], r: usize, xl: &[f32]) -> f32 {
    unsafe {
        let gpr = q.cols / 32;
        let gb = group_bytes::<K>(32);
        let c = code_bytes(&q.codes).add(r * gpr * gb);
        let scales = scales.as_ptr().add(r * gpr);
        let mask = _mm256_set1_epi32(0xFF);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for j in 0..gpr {
            let p = c.add(j * gb);
            let w = match K {
                U4 => nibbles32(p),
                U5 => fives32(p),
                _ => _mm256_loadu_si256(p as *const __m256i),
            };
            let (v0, v1, v2, v3) = if K == I8 {
                (
                    _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(w)),
                    _mm256_srai_epi32::<24>(_mm256_slli_epi32::<16>(w)),
                    _mm256_srai_epi32::<24>(_mm256_slli_epi32::<8>(w)),
                    _mm256_srai_epi32::<24>(w),
                )
            } else {
                (
                    _mm256_and_si256(w, mask),
                    _mm256_and_si256(_mm256_srli_epi32::<8>(w), mask),
                    _mm256_and_si256(_mm256_srli_epi32::<16>(w), mask),
                    _mm256_srli_epi32::<24>(w),
                )
            };
            let xg = xl.as_ptr().add(32 * j);
            let mut d = _mm256_mul_ps(_mm256_cvtepi32_ps(v0), _mm256_loadu_ps(xg));
            d = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v1), _mm256_loadu_ps(xg.add(8)), d);
            let t = _mm256_mul_ps(_mm256_cvtepi32_ps(v2), _mm256_loadu_ps(xg.add(16)));
            d = _mm256_add_ps(
                d,
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(v3), _mm256_loadu_ps(xg.add(24)), t),
            );
            let s = set8(scales.add(j));
            if j % 2 == 0 {
                a0 = _mm256_fmadd_ps(d, s, a0);
            } else {
                a1 = _mm256_fmadd_ps(d, s, a1);
            }
        }
        hsum(_mm256_add_ps(a0, a1))
    }
}

/// The longest row of codes [`prefetch_row`] asks for. A longer row is one long sequential
/// stream the hardware prefetcher follows by itself, and a burst of one software prefetch per
/// line at each row's start slowed it: streaming from memory on one Zen 4 core
/// (`decode_rows_speed`), 4864-column rows (Qwen2.5's `ffn_down`) ran at int8 Q5_0 12.1 and
/// Q8_0 9.0 G weights/s with their codes prefetched, 18.7 and 13.0 without; at 1536-2048
/// columns without was also ahead, at 576-896 (up to 896 bytes) with was.
const PREFETCH_ROW_BYTES: usize = 1024;

/// Asks for row `r` of `q` (its codes, of kind `K`, where a row is at most
/// [`PREFETCH_ROW_BYTES`], and its scales and offsets) to be brought into the cache; a row past
/// the matrix's end asks for nothing (software prefetches do not fault).
#[inline(always)]
pub(super) unsafe fn prefetch_row<const K: u8>(q: &QMatrix, r: usize) {
    unsafe {
        let gpr = q.cols / q.group;
        let row_bytes = gpr * group_bytes::<K>(q.group);
        if row_bytes <= PREFETCH_ROW_BYTES {
            prefetch(code_bytes(&q.codes).wrapping_add(r * row_bytes), row_bytes);
        }
        let (p, bytes) = q.scales.span(r * gpr, gpr);
        prefetch(p, bytes);
        if let super::Offsets::PerGroup(o) = &q.offsets {
            let (p, bytes) = o.span(r * gpr, gpr);
            prefetch(p, bytes);
        }
    }
}

/// Software prefetch of the cache lines of `bytes` bytes from `p` into L1.
#[inline(always)]
unsafe fn prefetch(p: *const u8, bytes: usize) {
    unsafe {
        let mut at = 0;
        while at < bytes {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(at) as *const i8);
            at += 64;
        }
    }
}

/// Row `r` of [`code_rows`].
#[inline(always)]
unsafe fn row_dot<const K: u8, T: Scale>(q: &QMatrix, scales: &[T], r: usize, x: &[f32]) -> f32 {
    unsafe {
        let (g, xp) = (q.group, x.as_ptr());
        let (gpr, gb) = (q.cols / g, group_bytes::<K>(g));
        let c = code_bytes(&q.codes).add(r * gpr * gb);
        let scales = scales.as_ptr().add(r * gpr);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for j in 0..gpr {
            let w = group::<K>(c.add(j * gb), g);
            let xg = xp.add(j * g);
            let mut p = _mm256_mul_ps(w[0], _mm256_loadu_ps(xg));
            p = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xg.add(8)), p);
            if g == 32 {
                let t = _mm256_mul_ps(w[2], _mm256_loadu_ps(xg.add(16)));
                p = _mm256_add_ps(p, _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg.add(24)), t));
            }
            let s = set8(scales.add(j));
            if j % 2 == 0 {
                a0 = _mm256_fmadd_ps(p, s, a0);
            } else {
                a1 = _mm256_fmadd_ps(p, s, a1);
            }
        }
        hsum(_mm256_add_ps(a0, a1))
    }
}

/// `acc[i] = Σ_c w[r, c] · x[i, c]` for the `nb ≤ BLOCK` rows of `xb` (`rows::row_times_block`).
///
/// # Safety
/// The CPU has AVX2 and FMA; `xb` holds `nb` rows of `q.cols` values; `r < q.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn row_block(q: &QMatrix, r: usize, xb: &[f32], nb: usize, acc: &mut [f32; BLOCK]) {
    unsafe { by_kind!(&q.codes, row_block_kind(q, r, xb, nb, acc)) }
}

#[inline(always)]
unsafe fn row_block_kind<const K: u8>(q: &QMatrix, r: usize, xb: &[f32], nb: usize, acc: &mut [f32; BLOCK]) {
    unsafe {
        match nb {
            8 => row::<K, 8>(q, r, xb, acc),
            7 => row::<K, 7>(q, r, xb, acc),
            6 => row::<K, 6>(q, r, xb, acc),
            5 => row::<K, 5>(q, r, xb, acc),
            4 => row::<K, 4>(q, r, xb, acc),
            3 => row::<K, 3>(q, r, xb, acc),
            2 => row::<K, 2>(q, r, xb, acc),
            _ => row::<K, 1>(q, r, xb, acc),
        }
    }
}

/// The codes' base pointer (signed codes reinterpreted; the kind says which).
fn code_bytes(codes: &Codes) -> *const u8 {
    match codes {
        Codes::U8(c) | Codes::U4(c) | Codes::U5(c) => c.as_ptr(),
        Codes::I8(c) => c.as_ptr() as *const u8,
    }
}

/// One weight row against `R` input rows: each group dequantized in registers once,
/// `w = scale · code + offset`, and multiplied into every row.
#[inline(always)]
unsafe fn row<const K: u8, const R: usize>(q: &QMatrix, r: usize, xb: &[f32], acc: &mut [f32; BLOCK]) {
    unsafe {
        let (g, cols) = (q.group, q.cols);
        let (gpr, gb) = (cols / g, group_bytes::<K>(g));
        let (base, xp) = (code_bytes(&q.codes), xb.as_ptr());
        let mut a = [_mm256_setzero_ps(); R];
        for j in 0..gpr {
            let gi = r * gpr + j;
            let (s, off) = scale_offset(q, gi);
            let (s, off) = (_mm256_set1_ps(s), _mm256_set1_ps(off));
            let w = group::<K>(base.add(gi * gb), g);
            for (k, &c) in w[..g / 8].iter().enumerate() {
                let w = _mm256_fmadd_ps(c, s, off);
                let at = j * g + 8 * k;
                for (i, a) in a.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(xp.add(i * cols + at)), *a);
                }
            }
        }
        for (o, a) in acc.iter_mut().zip(a) {
            *o = hsum(a);
        }
    }
}

/// Row `r` of `q` in f32 (`QMatrix::dequantize_row`).
///
/// # Safety
/// The CPU has AVX2 and FMA; `out.len() == q.cols`; `r < q.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequantize_row(q: &QMatrix, r: usize, out: &mut [f32]) {
    unsafe { by_kind!(&q.codes, dequantize(q, r, out)) }
}

#[inline(always)]
unsafe fn dequantize<const K: u8>(q: &QMatrix, r: usize, out: &mut [f32]) {
    unsafe {
        let g = q.group;
        let (gpr, gb) = (q.cols / g, group_bytes::<K>(g));
        let (base, o) = (code_bytes(&q.codes), out.as_mut_ptr());
        for j in 0..gpr {
            let gi = r * gpr + j;
            let (s, off) = scale_offset(q, gi);
            let (s, off) = (_mm256_set1_ps(s), _mm256_set1_ps(off));
            let w = group::<K>(base.add(gi * gb), g);
            for (k, &c) in w[..g / 8].iter().enumerate() {
                _mm256_storeu_ps(o.add(j * g + 8 * k), _mm256_fmadd_ps(c, s, off));
            }
        }
    }
}

/// Input rows of [`pair_block`]: two weight rows x four input rows keep eight accumulators,
/// the two rows' weights, scales and offsets in the sixteen registers.
pub(super) const PAIR_ROWS: usize = 4;

/// `[Σ_c w[ra, c] · x[i, c], Σ_c w[rb, c] · x[i, c]]` for the `nb ≤ PAIR_ROWS` rows of `xb`:
/// every input load feeds two FMAs (one per weight row), so the loads no longer bind as in
/// [`row_block`] (one FMA per load). `ra == rb` is allowed (an odd last row).
///
/// # Safety
/// The CPU has AVX2 and FMA; `xb` holds `nb` rows of `q.cols` values; `ra, rb < q.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pair_block(q: &QMatrix, ra: usize, rb: usize, xb: &[f32], nb: usize) -> [[f32; PAIR_ROWS]; 2] {
    unsafe { by_kind!(&q.codes, pair_kind(q, ra, rb, xb, nb)) }
}

#[inline(always)]
unsafe fn pair_kind<const K: u8>(q: &QMatrix, ra: usize, rb: usize, xb: &[f32], nb: usize) -> [[f32; PAIR_ROWS]; 2] {
    unsafe {
        match nb {
            4 => pair::<K, 4>(q, ra, rb, xb),
            3 => pair::<K, 3>(q, ra, rb, xb),
            2 => pair::<K, 2>(q, ra, rb, xb),
            _ => pair::<K, 1>(q, ra, rb, xb),
        }
    }
}

#[inline(always)]
unsafe fn pair<const K: u8, const R: usize>(q: &QMatrix, ra: usize, rb: usize, xb: &[f32]) -> [[f32; PAIR_ROWS]; 2] {
    unsafe {
        let (g, cols) = (q.group, q.cols);
        let (gpr, gb) = (cols / g, group_bytes::<K>(g));
        let (base, xp) = (code_bytes(&q.codes), xb.as_ptr());
        let (mut a, mut b) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
        for j in 0..gpr {
            let (ga, gbi) = (ra * gpr + j, rb * gpr + j);
            let ((sa, oa), (sb, ob)) = (scale_offset(q, ga), scale_offset(q, gbi));
            let wa = group::<K>(base.add(ga * gb), g);
            let wb = group::<K>(base.add(gbi * gb), g);
            for k in 0..g / 8 {
                let va = _mm256_fmadd_ps(wa[k], _mm256_set1_ps(sa), _mm256_set1_ps(oa));
                let vb = _mm256_fmadd_ps(wb[k], _mm256_set1_ps(sb), _mm256_set1_ps(ob));
                let at = j * g + 8 * k;
                for i in 0..R {
                    let x = _mm256_loadu_ps(xp.add(i * cols + at));
                    a[i] = _mm256_fmadd_ps(va, x, a[i]);
                    b[i] = _mm256_fmadd_ps(vb, x, b[i]);
                }
            }
        }
        let mut out = [[0f32; PAIR_ROWS]; 2];
        for i in 0..R {
            out[0][i] = hsum(a[i]);
            out[1][i] = hsum(b[i]);
        }
        out
    }
}
