//! `C += P · Wᵀ` for a block of rows of a chunk (KAMERA.md §3.2, the patch P Wᵀ): the small,
//! skinny product the fused reuse pass applies per block, register-blocked on AVX-512 (4 rows ×
//! 64 columns per step), faer elsewhere.

/// `c[bn × cols] += p[bn × m] · wt[m × cols]`, all row-major.
pub(crate) fn add_product(c: &mut [f32], bn: usize, cols: usize, p: &[f32], wt: &[f32], m: usize) {
    debug_assert!(c.len() == bn * cols && p.len() == bn * m && wt.len() == m * cols);
    #[cfg(target_arch = "x86_64")]
    if cols % 16 == 0 && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; the shapes are as documented (checked in debug builds).
        unsafe { avx512::add_product(c, bn, cols, p, wt, m) };
        return;
    }
    faer::linalg::matmul::matmul(
        faer::MatMut::from_row_major_slice_mut(c, bn, cols),
        faer::Accum::Add,
        faer::MatRef::from_row_major_slice(p, bn, m),
        faer::MatRef::from_row_major_slice(wt, m, cols),
        1.0f32,
        faer::Par::Seq,
    );
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn add_product(c: &mut [f32], bn: usize, cols: usize, p: &[f32], wt: &[f32], m: usize) {
        unsafe {
            let (cp, pp, wp) = (c.as_mut_ptr(), p.as_ptr(), wt.as_ptr());
            let mut r = 0;
            while r + 4 <= bn {
                step::<4>(cp, pp, wp, r, cols, m);
                r += 4;
            }
            while r < bn {
                step::<1>(cp, pp, wp, r, cols, m);
                r += 1;
            }
        }
    }

    /// Rows `r..r + R`: column blocks of 64, then of 16.
    #[inline(always)]
    unsafe fn step<const R: usize>(c: *mut f32, p: *const f32, wt: *const f32, r: usize, cols: usize, m: usize) {
        unsafe {
            let mut c0 = 0;
            while c0 + 64 <= cols {
                block::<R, 4>(c, p, wt, r, c0, cols, m);
                c0 += 64;
            }
            while c0 < cols {
                block::<R, 1>(c, p, wt, r, c0, cols, m);
                c0 += 16;
            }
        }
    }

    #[inline(always)]
    unsafe fn block<const R: usize, const V: usize>(
        c: *mut f32,
        p: *const f32,
        wt: *const f32,
        r: usize,
        c0: usize,
        cols: usize,
        m: usize,
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            for (i, a) in acc.iter_mut().enumerate() {
                for (v, x) in a.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(c.add((r + i) * cols + c0 + 16 * v));
                }
            }
            for j in 0..m {
                let mut w = [_mm512_setzero_ps(); V];
                for (v, x) in w.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(wt.add(j * cols + c0 + 16 * v));
                }
                for (i, a) in acc.iter_mut().enumerate() {
                    let s = _mm512_set1_ps(*p.add((r + i) * m + j));
                    for (x, &wv) in a.iter_mut().zip(&w) {
                        *x = _mm512_fmadd_ps(s, wv, *x);
                    }
                }
            }
            for (i, a) in acc.iter().enumerate() {
                for (v, &x) in a.iter().enumerate() {
                    _mm512_storeu_ps(c.add((r + i) * cols + c0 + 16 * v), x);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// Against f64 sums, for row counts past a multiple of 4 and column counts past 64.
    #[test]
    fn add_product_matches_f64() {
        for (bn, cols, m) in [(1, 16, 1), (7, 80, 5), (64, 192, 32), (13, 256, 17), (5, 20, 3)] {
            let f = |n: usize, s: f32| (0..n).map(|i| (i as f32 * 0.37 + s).sin()).collect::<Vec<f32>>();
            let (mut c, p, wt) = (f(bn * cols, 0.1), f(bn * m, 0.2), f(m * cols, 0.3));
            let want: Vec<f64> = (0..bn * cols)
                .map(|i| {
                    let (r, k) = (i / cols, i % cols);
                    c[i] as f64
                        + (0..m)
                            .map(|j| p[r * m + j] as f64 * wt[j * cols + k] as f64)
                            .sum::<f64>()
                })
                .collect();
            super::add_product(&mut c, bn, cols, &p, &wt, m);
            let err = c
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f64 - b).abs())
                .fold(0f64, f64::max);
            assert!(err < 1e-5, "{bn}x{cols}, rank {m}: {err}");
        }
    }
}
