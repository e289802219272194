//! Matrix-vector products on the codes (decode): `y_r = Σ_g scale_rg · Σ_{i∈g} code_i x_i +
//! offset_rg · Σ_{i∈g} x_i`, AVX-512 or AVX2 where the CPU has it (chosen at run time), else
//! portable code the compiler vectorises; rows split over the rayon pool.

use rayon::prelude::*;

use super::table::{Scale, with_table};
use super::{Codes, Offsets, QMatrix};

/// Weights per parallel task (smaller matrices run on the calling thread).
const TASK_WEIGHTS: usize = 1 << 18;

/// `y = W x` for one input row `x` (`cols`), `y` (`rows`), blocks of rows over the pool.
pub(crate) fn matvec(q: &QMatrix, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!((x.len(), y.len()), (q.cols, q.rows));
    let xsum = group_sums(q, x);
    let xl = lane_input(q, x);
    let rows_per_task = (TASK_WEIGHTS / q.cols).max(8);
    if q.rows <= rows_per_task {
        rows_into(q, x, xl.as_deref(), &xsum, 0, y);
    } else {
        y.par_chunks_mut(rows_per_task)
            .enumerate()
            .for_each(|(t, out)| rows_into(q, x, xl.as_deref(), &xsum, t * rows_per_task, out));
    }
}

/// Group sums of `x` for `q`'s offsets (empty for signed codes, which have none).
pub(crate) fn group_sums(q: &QMatrix, x: &[f32]) -> Vec<f32> {
    match q.offsets {
        Offsets::None => Vec::new(),
        _ => x.chunks_exact(q.group).map(|g| g.iter().sum()).collect(),
    }
}

/// `x` in the order the AVX2 kernel for 4- and 5-bit codes reads it (`avx2::lane_order`) where
/// that kernel multiplies `q` (x86 hosts with AVX2 and no AVX-512), else `None`: made once per
/// input, read by every row.
pub(crate) fn lane_input(q: &QMatrix, x: &[f32]) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if matches!(q.codes, Codes::U4(_) | Codes::U5(_))
        && q.group == 32
        && x.len() == q.cols
        && !has_avx512()
        && super::avx2::available()
    {
        return Some(super::avx2::lane_order(x));
    }
    None
}

/// Rows `r0..r0 + out.len()` of `W x` into `out`, on the calling thread; `xl` from
/// [`lane_input`], `xsum` from [`group_sums`].
pub(crate) fn rows_into(q: &QMatrix, x: &[f32], xl: Option<&[f32]>, xsum: &[f32], r0: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = has_avx512();
        if avx512 || super::avx2::available() {
            // The kernels read through pointers: a caller's shape error stops here, not in memory.
            assert!(
                r0 + out.len() <= q.rows && x.len() == q.cols && xl.is_none_or(|xl| xl.len() == q.cols),
                "rows {r0}..{} of a [{}, {}] matrix against an input of {}",
                r0 + out.len(),
                q.rows,
                q.cols,
                x.len()
            );
            if avx512 {
                // SAFETY: the CPU has AVX-512 F/BW; rows r0.. of q (checked above); x has q.cols
                // values.
                unsafe { avx512::code_rows(q, r0, x, xsum, out) };
            } else {
                // SAFETY: the CPU has AVX2 and FMA; rows r0.. of q (checked above); x has q.cols
                // values; `xl` came from `lane_input`: groups of 32, q.cols values.
                unsafe { super::avx2::code_rows(q, r0, xl.unwrap_or(x), xl.is_some(), xsum, out) };
            }
            return;
        }
    }
    let _ = xl;
    for (i, o) in out.iter_mut().enumerate() {
        *o = row_dot(q, r0 + i, x, xsum);
    }
}

/// Row `r`'s codes as bytes (signed codes reinterpreted; the kernels know which).
pub(crate) fn row_codes(q: &QMatrix, r: usize) -> &[u8] {
    match &q.codes {
        Codes::U8(c) => &c[r * q.cols..(r + 1) * q.cols],
        Codes::I8(c) => {
            let c = &c[r * q.cols..(r + 1) * q.cols];
            // SAFETY: i8 and u8 have the same size and alignment; every bit pattern is valid.
            unsafe { std::slice::from_raw_parts(c.as_ptr() as *const u8, c.len()) }
        }
        Codes::U4(c) => &c[r * q.cols / 2..(r + 1) * q.cols / 2],
        Codes::U5(c) => {
            let per_row = q.cols / 32 * super::U5_GROUP_BYTES;
            &c[r * per_row..(r + 1) * per_row]
        }
    }
}

/// Rows `r0..r0 + out.len()` of `W x` into `out` with `x` quantized to int8 (`vnni.rs`),
/// on the calling thread; `xsum` from [`super::vnni::Q8Input::group_sums`].
pub(crate) fn rows_into_q8(q: &QMatrix, x: &super::vnni::Q8Input, xsum: &[f32], r0: usize, out: &mut [f32]) {
    super::vnni::code_rows(q, r0, x, xsum, out);
}

/// Whether the AVX-512 kernels here run: AVX-512 F, and BW for f16 scales and the offsets.
#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw")
}

/// Row `r` of `W x` on CPUs without the x86 kernels: [`portable`] plus the offsets' term.
#[inline(always)]
fn row_dot(q: &QMatrix, r: usize, x: &[f32], xsum: &[f32]) -> f32 {
    let gpr = q.cols / q.group;
    with_table!(&q.scales, v => portable(&q.codes, q.group, row_codes(q, r), &v[r * gpr..(r + 1) * gpr], x))
        + offset_dot(q, r, xsum)
}

/// Row `r`'s `Σ_g offset_g · Σ_{i∈g} x_i`.
#[inline(always)]
pub(super) fn offset_dot(q: &QMatrix, r: usize, xsum: &[f32]) -> f32 {
    let gpr = q.cols / q.group;
    match &q.offsets {
        Offsets::None => 0.0,
        Offsets::Zero(z) => -z * q.scales.dot(r * gpr, xsum),
        Offsets::PerGroup(o) => o.dot(r * gpr, xsum),
    }
}

/// `Σ_g scales[g] · Σ_{i∈g} code_i x_i` over one row. The reference: plain loops, 16 lanes wide so the compiler can vectorise them.
#[inline(always)]
pub(crate) fn portable<T: Scale>(kind: &Codes, group: usize, codes: &[u8], scales: &[T], x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut add = |s: f32, p: &[f32; 16]| {
        for t in 0..16 {
            acc[t] += s * p[t];
        }
    };
    match kind {
        Codes::U8(_) | Codes::I8(_) => {
            let signed = matches!(kind, Codes::I8(_));
            for ((&s, xg), cg) in scales.iter().zip(x.chunks_exact(group)).zip(codes.chunks_exact(group)) {
                let mut p = [0f32; 16];
                for (xs, cs) in xg.chunks_exact(16).zip(cg.chunks_exact(16)) {
                    for t in 0..16 {
                        let c = if signed { cs[t] as i8 as f32 } else { cs[t] as f32 };
                        p[t] += c * xs[t];
                    }
                }
                add(s.f32(), &p);
            }
        }
        Codes::U4(_) => {
            for ((&s, xg), b) in scales.iter().zip(x.chunks_exact(32)).zip(codes.chunks_exact(16)) {
                let mut p = [0f32; 16];
                for t in 0..16 {
                    p[t] = (b[t] & 15) as f32 * xg[t] + (b[t] >> 4) as f32 * xg[t + 16];
                }
                add(s.f32(), &p);
            }
        }
        Codes::U5(_) => {
            let gb = super::U5_GROUP_BYTES;
            for ((&s, xg), b) in scales.iter().zip(x.chunks_exact(32)).zip(codes.chunks_exact(gb)) {
                let mut p = [0f32; 16];
                for t in 0..16 {
                    p[t] = super::u5_code(b, t) as f32 * xg[t] + super::u5_code(b, t + 16) as f32 * xg[t + 16];
                }
                add(s.f32(), &p);
            }
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use std::arch::x86_64::*;

    use super::super::avx2::group_bytes;
    use super::super::avx2::{I8, PREFETCH_ROWS, U4, U5, U8, by_kind, prefetch_row};
    use super::super::table::{Scale, with_table, x86::RowOffsets, x86::widen16};
    use super::super::{Codes, QMatrix};

    /// `out[i] = Σ_g scale_g · Σ_{i∈g} code_i x_i` over rows `r0 + i` of `q` (decode, f32),
    /// plus the offsets' term on `xsum` (none where it is empty): one dispatch for the rows,
    /// each row's bytes asked for [`PREFETCH_ROWS`] ahead, as the AVX2 kernels do.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW; `r0 + out.len() <= q.rows`; `x` has `q.cols` values.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn code_rows(q: &QMatrix, r0: usize, x: &[f32], xsum: &[f32], out: &mut [f32]) {
        unsafe { with_table!(&q.scales, s => by_kind!(&q.codes, rows_kind::<_>(q, s, r0, x, xsum, out))) }
    }

    #[inline(always)]
    unsafe fn rows_kind<const K: u8, T: Scale>(
        q: &QMatrix,
        scales: &[T],
        r0: usize,
        x: &[f32],
        xsum: &[f32],
        out: &mut [f32],
    ) {
        unsafe {
            let offsets = RowOffsets::new(q, scales, xsum);
            let (g, gpr) = (q.group, q.cols / q.group);
            let gb = group_bytes::<K>(g);
            let mut wide = [0f32; 256];
            for (i, o) in out.iter_mut().enumerate() {
                let r = r0 + i;
                prefetch_row::<K>(q, r + PREFETCH_ROWS);
                let (codes, scales) = (super::row_codes(q, r), &scales[r * gpr..(r + 1) * gpr]);
                *o = if let Some(scales) = T::as_f32(scales) {
                    code_dot(&q.codes, g, codes, scales, x)
                } else {
                    // f16 scales widened a row's 256 groups at a time, so the group loop reads
                    // f32 as before instead of converting a scale per group.
                    let mut sum = 0.0;
                    for j in (0..gpr).step_by(256) {
                        let n = (gpr - j).min(256);
                        widen16(scales.as_ptr().add(j), n, &mut wide);
                        sum += code_dot(
                            &q.codes,
                            g,
                            &codes[j * gb..(j + n) * gb],
                            &wide[..n],
                            &x[j * g..(j + n) * g],
                        );
                    }
                    sum
                } + offsets.avx512(r);
            }
        }
    }

    /// `Σ_g scales[g] · Σ_{i∈g} code_i x_i` over one row, by the kernel for `kind` and `group`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `codes`, `scales` and `x` are one row of a matrix and its input.
    #[inline(always)]
    unsafe fn code_dot(kind: &Codes, group: usize, codes: &[u8], scales: &[f32], x: &[f32]) -> f32 {
        unsafe {
            match (kind, group) {
                (Codes::U8(_), 32) => b8_g32::<false>(codes, scales, x),
                (Codes::U8(_), _) => b8_g16::<false>(codes, scales, x),
                (Codes::I8(_), 32) => b8_g32::<true>(codes, scales, x),
                (Codes::I8(_), _) => b8_g16::<true>(codes, scales, x),
                (Codes::U4(_), _) => u4_g32(codes, scales, x),
                (Codes::U5(_), _) => u5_g32(codes, scales, x),
            }
        }
    }

    /// 16 byte codes as f32, sign-extended when `S`.
    #[inline(always)]
    pub(in crate::quant) unsafe fn b8x16<const S: bool>(p: *const u8) -> __m512 {
        unsafe {
            let v = _mm_loadu_si128(p as *const __m128i);
            _mm512_cvtepi32_ps(if S {
                _mm512_cvtepi8_epi32(v)
            } else {
                _mm512_cvtepu8_epi32(v)
            })
        }
    }

    /// `Σ code·x` of one group of 32 byte codes, as 16 lanes.
    #[inline(always)]
    unsafe fn b8_group<const S: bool>(c: *const u8, xp: *const f32) -> __m512 {
        unsafe {
            _mm512_fmadd_ps(
                b8x16::<S>(c.add(16)),
                _mm512_loadu_ps(xp.add(16)),
                _mm512_mul_ps(b8x16::<S>(c), _mm512_loadu_ps(xp)),
            )
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn b8_g32<const S: bool>(codes: &[u8], scales: &[f32], x: &[f32]) -> f32 {
        unsafe {
            let (c, xp) = (codes.as_ptr(), x.as_ptr());
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let n = scales.len();
            let mut g = 0;
            while g + 1 < n {
                let p0 = b8_group::<S>(c.add(32 * g), xp.add(32 * g));
                let p1 = b8_group::<S>(c.add(32 * g + 32), xp.add(32 * g + 32));
                a0 = _mm512_fmadd_ps(p0, _mm512_set1_ps(scales[g]), a0);
                a1 = _mm512_fmadd_ps(p1, _mm512_set1_ps(scales[g + 1]), a1);
                g += 2;
            }
            if g < n {
                a0 = _mm512_fmadd_ps(
                    b8_group::<S>(c.add(32 * g), xp.add(32 * g)),
                    _mm512_set1_ps(scales[g]),
                    a0,
                );
            }
            _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn b8_g16<const S: bool>(codes: &[u8], scales: &[f32], x: &[f32]) -> f32 {
        unsafe {
            let (c, xp) = (codes.as_ptr(), x.as_ptr());
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let n = scales.len();
            let mut g = 0;
            while g + 1 < n {
                let (o0, o1) = (16 * g, 16 * g + 16);
                let p0 = _mm512_mul_ps(b8x16::<S>(c.add(o0)), _mm512_loadu_ps(xp.add(o0)));
                let p1 = _mm512_mul_ps(b8x16::<S>(c.add(o1)), _mm512_loadu_ps(xp.add(o1)));
                a0 = _mm512_fmadd_ps(p0, _mm512_set1_ps(scales[g]), a0);
                a1 = _mm512_fmadd_ps(p1, _mm512_set1_ps(scales[g + 1]), a1);
                g += 2;
            }
            if g < n {
                let o0 = 16 * g;
                a0 = _mm512_fmadd_ps(
                    _mm512_mul_ps(b8x16::<S>(c.add(o0)), _mm512_loadu_ps(xp.add(o0))),
                    _mm512_set1_ps(scales[g]),
                    a0,
                );
            }
            _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
        }
    }

    #[inline(always)]
    unsafe fn u4_group(c: *const u8, xp: *const f32) -> __m512 {
        unsafe {
            let v = _mm_loadu_si128(c as *const __m128i);
            let m = _mm_set1_epi8(15);
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, m)));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), m)));
            _mm512_fmadd_ps(hi, _mm512_loadu_ps(xp.add(16)), _mm512_mul_ps(lo, _mm512_loadu_ps(xp)))
        }
    }

    /// The 16 + 16 codes of a [`super::super::Codes::U5`] group as f32: (codes 0..16, 16..32).
    #[inline(always)]
    pub(in crate::quant) unsafe fn u5x32(c: *const u8) -> (__m512, __m512) {
        unsafe {
            let v = _mm_loadu_si128(c as *const __m128i);
            let high = (c.add(16) as *const u32).read_unaligned();
            let m = _mm_set1_epi8(15);
            let sixteen = _mm512_set1_epi32(16);
            let lo = _mm512_cvtepu8_epi32(_mm_and_si128(v, m));
            let hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), m));
            let lo = _mm512_mask_add_epi32(lo, high as u16, lo, sixteen);
            let hi = _mm512_mask_add_epi32(hi, (high >> 16) as u16, hi, sixteen);
            (_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(hi))
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn u5_g32(codes: &[u8], scales: &[f32], x: &[f32]) -> f32 {
        unsafe {
            let (c, xp) = (codes.as_ptr(), x.as_ptr());
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for (g, &s) in scales.iter().enumerate() {
                let (lo, hi) = u5x32(c.add(20 * g));
                let p = _mm512_fmadd_ps(
                    hi,
                    _mm512_loadu_ps(xp.add(32 * g + 16)),
                    _mm512_mul_ps(lo, _mm512_loadu_ps(xp.add(32 * g))),
                );
                if g % 2 == 0 {
                    a0 = _mm512_fmadd_ps(p, _mm512_set1_ps(s), a0);
                } else {
                    a1 = _mm512_fmadd_ps(p, _mm512_set1_ps(s), a1);
                }
            }
            _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn u4_g32(codes: &[u8], scales: &[f32], x: &[f32]) -> f32 {
        unsafe {
            let (c, xp) = (codes.as_ptr(), x.as_ptr());
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let n = scales.len();
            let mut g = 0;
            while g + 1 < n {
                let p0 = u4_group(c.add(16 * g), xp.add(32 * g));
                let p1 = u4_group(c.add(16 * g + 16), xp.add(32 * g + 32));
                a0 = _mm512_fmadd_ps(p0, _mm512_set1_ps(scales[g]), a0);
                a1 = _mm512_fmadd_ps(p1, _mm512_set1_ps(scales[g + 1]), a1);
                g += 2;
            }
            if g < n {
                a0 = _mm512_fmadd_ps(u4_group(c.add(16 * g), xp.add(32 * g)), _mm512_set1_ps(scales[g]), a0);
            }
            _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
        }
    }
}
