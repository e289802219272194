//! Products of a few input rows on the codes (a short prefill: a question, a step's text): each
//! weight group is dequantized in registers once, `w = scale · code + offset`, and multiplied
//! into up to [`BLOCK`] input rows; weight rows split over the rayon pool.

use rayon::prelude::*;

use super::{Codes, Offsets, Out, QMatrix};

/// Input rows sharing one pass over a weight row's codes.
pub(crate) const BLOCK: usize = 8;
/// Input rows up to which [`super::Linear::forward`] multiplies `q` on its codes (more go
/// through dequantized panels and a GEMM): where the two cross, measured per instruction set
/// with the ignored `quant::tests::matvec_speed` probe (2 threads, 4864 x 1024). With AVX-512
/// (this project's Xeon and Zen 4 EPYC): 256. With AVX2 only (a Zen 3 EPYC, 2026-12-05) the
/// panels climb from 52-68 GFLOP/s at 32 rows to 77-99 at 64 and 105-128 at 128, while the
/// 4- and 5-bit row blocks run flat at 53-100 from 8 rows on (widening the codes binds them)
/// and the byte codes' weight-row pairs at 90-110: 48 rows for the first, 96 for the second.
pub(crate) fn max_rows(q: &QMatrix) -> usize {
    #[cfg(target_arch = "x86_64")]
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return if avx2_pairs(q) { 96 } else { 48 };
    }
    let _ = q;
    256
}

/// Whether `q`'s row products run as AVX2 weight-row pairs (`avx2::pair_block`): byte codes on
/// a CPU with AVX2 + FMA and no AVX-512. The 4- and 5-bit codes stay on [`BLOCK`]-row blocks,
/// where each widened group feeds twice the input rows (pairs measured 10-30% slower there).
#[cfg(target_arch = "x86_64")]
fn avx2_pairs(q: &QMatrix) -> bool {
    matches!(q.codes, Codes::U8(_) | Codes::I8(_))
        && !std::arch::is_x86_feature_detected!("avx512f")
        && super::avx2::available()
}

/// Weight rows per parallel task.
const TASK_ROWS: usize = 32;

/// `y = x Wᵀ` for `x: [n, cols]`, `y: [n, rows]`, row-major.
pub(crate) fn product(q: &QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
    let (rows, cols) = (q.rows, q.cols);
    assert_eq!((x.len(), y.len()), (n * cols, n * rows), "rows::product shapes");
    let out = Out(y.as_mut_ptr());
    #[cfg(target_arch = "x86_64")]
    let pairs = avx2_pairs(q);
    let task = |t: usize| {
        let (r0, r1) = (t * TASK_ROWS, ((t + 1) * TASK_ROWS).min(rows));
        #[cfg(target_arch = "x86_64")]
        if pairs {
            // AVX2: two weight rows against four input rows at a time (`avx2::pair_block`).
            const P: usize = super::avx2::PAIR_ROWS;
            for b0 in (0..n).step_by(P) {
                let nb = P.min(n - b0);
                let xb = &x[b0 * cols..(b0 + nb) * cols];
                for ra in (r0..r1).step_by(2) {
                    let rb = (ra + 1).min(r1 - 1);
                    // SAFETY: the CPU has AVX2 and FMA; `xb` holds `nb` rows; ra, rb < rows.
                    let acc = unsafe { super::avx2::pair_block(q, ra, rb, xb, nb) };
                    for (r, acc) in [(ra, acc[0]), (rb, acc[1])] {
                        for (i, &a) in acc[..nb].iter().enumerate() {
                            // SAFETY: as below: (b0 + i, r) is inside y, column r is this task's.
                            unsafe { *out.at((b0 + i) * rows + r) = a };
                        }
                    }
                }
            }
            return;
        }
        let mut acc = [0f32; BLOCK];
        for b0 in (0..n).step_by(BLOCK) {
            let nb = BLOCK.min(n - b0);
            let xb = &x[b0 * cols..(b0 + nb) * cols];
            for r in r0..r1 {
                row_times_block(q, r, xb, nb, &mut acc);
                for (i, &a) in acc[..nb].iter().enumerate() {
                    // SAFETY: (b0 + i, r) is inside y (b0 + i < n, r < rows) and only this task
                    // writes column r.
                    unsafe { *out.at((b0 + i) * rows + r) = a };
                }
            }
        }
    };
    let tasks = rows.div_ceil(TASK_ROWS);
    if tasks * n * cols < 1 << 16 {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// `acc[i] = Σ_c w[r, c] · x[i, c]` for the `nb` rows of `xb`.
fn row_times_block(q: &QMatrix, r: usize, xb: &[f32], nb: usize, acc: &mut [f32; BLOCK]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; `xb` holds `nb` rows of `q.cols` values.
        unsafe {
            match nb {
                8 => avx512::row::<8>(q, r, xb, acc),
                7 => avx512::row::<7>(q, r, xb, acc),
                6 => avx512::row::<6>(q, r, xb, acc),
                5 => avx512::row::<5>(q, r, xb, acc),
                4 => avx512::row::<4>(q, r, xb, acc),
                3 => avx512::row::<3>(q, r, xb, acc),
                2 => avx512::row::<2>(q, r, xb, acc),
                _ => avx512::row::<1>(q, r, xb, acc),
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2::available() {
        // SAFETY: the CPU has AVX2 and FMA; `xb` holds `nb` rows of `q.cols` values.
        unsafe { super::avx2::row_block(q, r, xb, nb, acc) };
        return;
    }
    portable(q, r, xb, nb, acc);
}

/// The group's scale and offset.
#[inline(always)]
pub(super) fn scale_offset(q: &QMatrix, gi: usize) -> (f32, f32) {
    let s = q.scales.get(gi);
    let off = match &q.offsets {
        Offsets::None => 0.0,
        Offsets::Zero(z) => -z * s,
        Offsets::PerGroup(v) => v.get(gi),
    };
    (s, off)
}

/// The reference: one weight group dequantized, then multiplied into every row.
pub(crate) fn portable(q: &QMatrix, r: usize, xb: &[f32], nb: usize, acc: &mut [f32; BLOCK]) {
    let (g, cols) = (q.group, q.cols);
    let mut w = [0f32; 32];
    let w = &mut w[..g];
    let mut lanes = [[0f32; 16]; BLOCK];
    for j in 0..cols / g {
        let gi = r * (cols / g) + j;
        let (s, off) = scale_offset(q, gi);
        match &q.codes {
            Codes::U8(c) => w
                .iter_mut()
                .zip(&c[gi * g..])
                .for_each(|(w, &c)| *w = s * c as f32 + off),
            Codes::I8(c) => w
                .iter_mut()
                .zip(&c[gi * g..])
                .for_each(|(w, &c)| *w = s * c as f32 + off),
            Codes::U4(c) => {
                let b = &c[gi * 16..gi * 16 + 16];
                for t in 0..16 {
                    w[t] = s * (b[t] & 15) as f32 + off;
                    w[t + 16] = s * (b[t] >> 4) as f32 + off;
                }
            }
            Codes::U5(c) => {
                let b = &c[gi * super::U5_GROUP_BYTES..(gi + 1) * super::U5_GROUP_BYTES];
                for (t, w) in w.iter_mut().enumerate() {
                    *w = s * super::u5_code(b, t) as f32 + off;
                }
            }
        }
        for (i, l) in lanes[..nb].iter_mut().enumerate() {
            let xg = &xb[i * cols + j * g..i * cols + (j + 1) * g];
            for (wc, xc) in w.chunks_exact(16).zip(xg.chunks_exact(16)) {
                for t in 0..16 {
                    l[t] += wc[t] * xc[t];
                }
            }
        }
    }
    for (a, l) in acc.iter_mut().zip(&lanes[..nb]) {
        *a = l.iter().sum();
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::super::dot::avx512::{b8x16, u5x32};
    use super::{BLOCK, Codes, QMatrix, scale_offset};

    /// `acc[i] += w16 · x[i, at..at + 16]` for the block's `R` rows.
    #[inline(always)]
    unsafe fn fma_rows<const R: usize>(w: __m512, xp: *const f32, cols: usize, at: usize, a: &mut [__m512; R]) {
        unsafe {
            for (i, a) in a.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(w, _mm512_loadu_ps(xp.add(i * cols + at)), *a);
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn row<const R: usize>(q: &QMatrix, r: usize, xb: &[f32], acc: &mut [f32; BLOCK]) {
        unsafe {
            let (g, cols) = (q.group, q.cols);
            let gpr = cols / g;
            let xp = xb.as_ptr();
            let mut a = [_mm512_setzero_ps(); R];
            for j in 0..gpr {
                let gi = r * gpr + j;
                let (s, off) = scale_offset(q, gi);
                let (s, off) = (_mm512_set1_ps(s), _mm512_set1_ps(off));
                match &q.codes {
                    Codes::U4(c) => {
                        let v = _mm_loadu_si128(c.as_ptr().add(gi * 16) as *const __m128i);
                        let m = _mm_set1_epi8(15);
                        let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, m)));
                        let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), m)));
                        fma_rows(_mm512_fmadd_ps(lo, s, off), xp, cols, j * 32, &mut a);
                        fma_rows(_mm512_fmadd_ps(hi, s, off), xp, cols, j * 32 + 16, &mut a);
                    }
                    Codes::U5(c) => {
                        let (lo, hi) = u5x32(c.as_ptr().add(gi * 20));
                        fma_rows(_mm512_fmadd_ps(lo, s, off), xp, cols, j * 32, &mut a);
                        fma_rows(_mm512_fmadd_ps(hi, s, off), xp, cols, j * 32 + 16, &mut a);
                    }
                    codes => {
                        let signed = matches!(codes, Codes::I8(_));
                        let base = match codes {
                            Codes::U8(c) => c.as_ptr(),
                            Codes::I8(c) => c.as_ptr() as *const u8,
                            Codes::U4(_) | Codes::U5(_) => unreachable!(),
                        };
                        for h in (0..g).step_by(16) {
                            let p = base.add(gi * g + h);
                            let w = if signed { b8x16::<true>(p) } else { b8x16::<false>(p) };
                            fma_rows(_mm512_fmadd_ps(w, s, off), xp, cols, j * g + h, &mut a);
                        }
                    }
                }
            }
            for (o, a) in acc.iter_mut().zip(a) {
                *o = _mm512_reduce_add_ps(a);
            }
        }
    }
}
