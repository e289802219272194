//! `C += P · Wᵀ` for a block of rows of a chunk (KAMERA.md §3.2, the patch P Wᵀ): the small,
//! skinny product the fused reuse pass applies per block, register-blocked on AVX-512 (4 rows ×
//! 64 columns per step), faer elsewhere.

use std::borrow::Cow;

use half::bf16;

use crate::tensor::{Buf, Mat};

/// `c[bn × cols] += p[bn × m] · wt[m × cols]`, all row-major.
pub(crate) fn add_product(c: &mut [f32], bn: usize, cols: usize, p: &[f32], wt: &[f32], m: usize) -> bool {
    debug_assert!(c.len() == bn * cols && p.len() == bn * m && wt.len() == m * cols);
    #[cfg(target_arch = "x86_64")]
    if cols % 16 == 0 && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F; the shapes are as documented (checked in debug builds).
        return unsafe { avx512::add_product(c, bn, cols, p, wt, m) };
    }
    faer::linalg::matmul::matmul(
        faer::MatMut::from_row_major_slice_mut(c, bn, cols),
        faer::Accum::Add,
        faer::MatRef::from_row_major_slice(p, bn, m),
        faer::MatRef::from_row_major_slice(wt, m, cols),
        1.0f32,
        faer::Par::Seq,
    );
    c.iter().fold(true, |a, r| a & r.is_finite())
}

/// One layer and channel's patch factors, prepared for [`Factors::add`] over blocks of rows:
/// f32 (converted once when stored otherwise), or, when both are stored bf16 with an even rank
/// on an AVX512_BF16 CPU, the bf16 values themselves in `VDPBF16PS` products (each product of
/// two bf16 exact in f32, twice the multiply-adds per instruction; f32 sums).
pub(crate) enum Factors<'a> {
    F32 {
        p: Cow<'a, [f32]>,
        wt: Cow<'a, [f32]>,
        m: usize,
        cols: usize,
    },
    Bf16 {
        p: Cow<'a, [u32]>,
        wt: Vec<u32>,
        pairs: usize,
        cols: usize,
    },
}

impl<'a> Factors<'a> {
    /// `p: [n × m]`, `wt: [m × cols]`.
    pub(crate) fn new(p: &'a Mat, wt: &'a Mat) -> Factors<'a> {
        let (m, cols) = (wt.rows(), wt.cols());
        if let (Buf::Bf16(pv), Buf::Bf16(wv)) = (p.data(), wt.data())
            && m % 2 == 0
            && cols % 16 == 0
            && bf16_available()
        {
            // P's rows are pairs as stored; Wᵀ's rows 2q and 2q + 1 interleaved per column.
            let p = pv.chunks_exact(2).map(|q| pair(q[0], q[1])).collect();
            let wt = (0..m / 2)
                .flat_map(|q| (0..cols).map(move |c| (q, c)))
                .map(|(q, c)| pair(wv[2 * q * cols + c], wv[(2 * q + 1) * cols + c]))
                .collect();
            return Factors::Bf16 {
                p: Cow::Owned(p),
                wt,
                pairs: m / 2,
                cols,
            };
        }
        let f32_view = |m: &'a Mat| match m.data() {
            Buf::F32(v) => Cow::Borrowed(v.as_slice()),
            _ => Cow::Owned(m.to_f32_vec()),
        };
        Factors::F32 {
            p: f32_view(p),
            wt: f32_view(wt),
            m,
            cols,
        }
    }

    /// The factors of columns `c0..c0 + w` only (one head of a head-first destination); P shared.
    pub(crate) fn columns(&self, c0: usize, w: usize) -> Factors<'_> {
        let slice = |v: &[f32], rows: usize, cols: usize| -> Vec<f32> {
            (0..rows)
                .flat_map(|j| &v[j * cols + c0..j * cols + c0 + w])
                .copied()
                .collect()
        };
        match self {
            Factors::F32 { p, wt, m, cols } => Factors::F32 {
                p: Cow::Borrowed(p),
                wt: Cow::Owned(slice(wt, *m, *cols)),
                m: *m,
                cols: w,
            },
            Factors::Bf16 { p, wt, pairs, cols } => Factors::Bf16 {
                p: Cow::Borrowed(p),
                wt: (0..*pairs)
                    .flat_map(|q| &wt[q * cols + c0..q * cols + c0 + w])
                    .copied()
                    .collect(),
                pairs: *pairs,
                cols: w,
            },
        }
    }

    /// `blk[bn × cols] += P[b0..b0 + bn] · Wᵀ` (KAMERA §3.2: the patch P Wᵀ); returns whether
    /// every value of `blk` is finite afterwards (checked on the stored vectors).
    #[inline(always)]
    pub(crate) fn add(&self, blk: &mut [f32], b0: usize) -> bool {
        match self {
            Factors::F32 { p, wt, m, cols } => {
                let bn = blk.len() / cols;
                add_product(blk, bn, *cols, &p[b0 * m..(b0 + bn) * m], wt, *m)
            }
            Factors::Bf16 { p, wt, pairs, cols } => {
                let bn = blk.len() / cols;
                #[cfg(target_arch = "x86_64")]
                // SAFETY: built only where the CPU has AVX512_BF16 (`new`); shapes as built.
                return unsafe {
                    avx512::add_product_bf16(blk, bn, *cols, &p[b0 * pairs..(b0 + bn) * pairs], wt, *pairs)
                };
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!("bf16 factors are built on x86-64 only ({p:?} {wt:?} {pairs} {bn})")
            }
        }
    }
}

/// bf16 `lo`, `hi` as one pair (`lo` in the low half), as `VDPBF16PS` reads them.
fn pair(lo: bf16, hi: bf16) -> u32 {
    lo.to_bits() as u32 | (hi.to_bits() as u32) << 16
}

/// Whether the CPU has AVX-512F and AVX512_BF16.
fn bf16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn add_product(c: &mut [f32], bn: usize, cols: usize, p: &[f32], wt: &[f32], m: usize) -> bool {
        assert!(c.len() >= bn * cols && p.len() >= bn * m && wt.len() >= m * cols && cols % 16 == 0);
        let fma = |acc, s, w| _mm512_fmadd_ps(s, w, acc);
        // SAFETY: shapes asserted; f32 values are read through their bits.
        unsafe { rows(c, bn, cols, p.as_ptr() as *const u32, wt.as_ptr() as *const u32, m, fma) }
    }

    /// [`super::Factors::add`] on bf16 pairs: `p` is `bn` rows of `pairs` pairs, `wt` `pairs`
    /// rows of `cols` pairs (`cols` a multiple of 16).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn add_product_bf16(
        c: &mut [f32],
        bn: usize,
        cols: usize,
        p: &[u32],
        wt: &[u32],
        pairs: usize,
    ) -> bool {
        assert!(c.len() >= bn * cols && p.len() >= bn * pairs && wt.len() >= pairs * cols && cols % 16 == 0);
        // SAFETY (transmutes): 32-bit lanes holding bf16 pairs.
        let dot = |acc, s, w| unsafe {
            _mm512_dpbf16_ps(
                acc,
                std::mem::transmute::<__m512, __m512bh>(s),
                std::mem::transmute::<__m512, __m512bh>(w),
            )
        };
        // SAFETY: shapes asserted.
        unsafe { rows(c, bn, cols, p.as_ptr(), wt.as_ptr(), pairs, dot) }
    }

    /// `c[bn × cols] += p · wt` with `k` steps of `mac(acc, p broadcast, wt vector)` (an f32 FMA,
    /// or a bf16 pair's dot product), 4 rows × 64 columns at a time; whether every stored value
    /// is finite.
    #[inline(always)]
    unsafe fn rows(
        c: &mut [f32],
        bn: usize,
        cols: usize,
        p: *const u32,
        wt: *const u32,
        k: usize,
        mac: impl Fn(__m512, __m512, __m512) -> __m512 + Copy,
    ) -> bool {
        unsafe {
            let cp = c.as_mut_ptr();
            let (mut r, mut bad) = (0, 0);
            while r + 4 <= bn {
                bad |= step::<4>(cp, p, wt, r, cols, k, mac);
                r += 4;
            }
            while r < bn {
                bad |= step::<1>(cp, p, wt, r, cols, k, mac);
                r += 1;
            }
            bad == 0
        }
    }

    /// Rows `r..r + R`: column blocks of 64, then of 16.
    #[inline(always)]
    unsafe fn step<const R: usize>(
        c: *mut f32,
        p: *const u32,
        wt: *const u32,
        r: usize,
        cols: usize,
        k: usize,
        mac: impl Fn(__m512, __m512, __m512) -> __m512 + Copy,
    ) -> u16 {
        unsafe {
            let (mut c0, mut bad) = (0, 0);
            while c0 + 64 <= cols {
                bad |= block::<R, 4>(c, p, wt, r, c0, cols, k, mac);
                c0 += 64;
            }
            while c0 < cols {
                bad |= block::<R, 1>(c, p, wt, r, c0, cols, k, mac);
                c0 += 16;
            }
            bad
        }
    }

    /// `acc[i][v] += Σ_j p[(r + i)·k + j] · wt[j·cols + at[v]..][..16]`, `j` in order, each step
    /// one `mac` (an f32 FMA, or a bf16 pair's dot product): the patch product's inner loop,
    /// shared by the blockwise kernel and the sweep (kamera-ops `stream.rs`).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn accumulate<const R: usize, const V: usize>(
        acc: &mut [[__m512; V]; R],
        p: *const u32,
        r: usize,
        k: usize,
        wt: *const u32,
        cols: usize,
        at: [usize; V],
        mac: impl Fn(__m512, __m512, __m512) -> __m512,
    ) {
        // SAFETY: the caller's shapes: p holds rows r..r + R of k lanes, wt k rows of cols with
        // at[v] + 16 <= cols.
        unsafe {
            for j in 0..k {
                let w: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(wt.add(j * cols + at[v]) as *const f32));
                for (i, a) in acc.iter_mut().enumerate() {
                    let s = _mm512_castsi512_ps(_mm512_set1_epi32(*p.add((r + i) * k + j) as i32));
                    for (x, &wv) in a.iter_mut().zip(&w) {
                        *x = mac(*x, s, wv);
                    }
                }
            }
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<const R: usize, const V: usize>(
        c: *mut f32,
        p: *const u32,
        wt: *const u32,
        r: usize,
        c0: usize,
        cols: usize,
        k: usize,
        mac: impl Fn(__m512, __m512, __m512) -> __m512,
    ) -> u16 {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            for (i, a) in acc.iter_mut().enumerate() {
                for (v, x) in a.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(c.add((r + i) * cols + c0 + 16 * v));
                }
            }
            accumulate(&mut acc, p, r, k, wt, cols, std::array::from_fn(|v| c0 + 16 * v), mac);
            // Lanes that hold a non-finite value.
            let mut bad: __mmask16 = 0;
            for (i, a) in acc.iter().enumerate() {
                for (v, &x) in a.iter().enumerate() {
                    _mm512_storeu_ps(c.add((r + i) * cols + c0 + 16 * v), x);
                    bad |= crate::lanes::non_finite(x);
                }
            }
            bad
        }
    }
}

#[cfg(test)]
mod tests {
    /// `c + p · wt` in f64, and the largest distance of `got` from it.
    fn max_err(got: &[f32], c: &[f32], p: &[f32], wt: &[f32], cols: usize, m: usize) -> f64 {
        got.iter()
            .enumerate()
            .map(|(i, &g)| {
                let (r, k) = (i / cols, i % cols);
                let want = c[i] as f64
                    + (0..m)
                        .map(|j| p[r * m + j] as f64 * wt[j * cols + k] as f64)
                        .sum::<f64>();
                (g as f64 - want).abs()
            })
            .fold(0f64, f64::max)
    }

    fn wave(n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + s).sin()).collect()
    }

    /// bf16 factors through `VDPBF16PS` against f64 sums of the same bf16 values (where the CPU
    /// has AVX512_BF16; the f32 path otherwise), for row counts past a multiple of 4 and column
    /// counts past 64, from the first row and from a later one.
    #[test]
    fn bf16_factors_match_f64() {
        use crate::tensor::{DType, Mat};
        for (bn, cols, m) in [(1, 16, 2), (7, 80, 6), (64, 192, 32), (13, 256, 18)] {
            let p = Mat::from_f32(bn, m, wave(bn * m, 0.2)).unwrap().to_dtype(DType::Bf16);
            let wt = Mat::from_f32(m, cols, wave(m * cols, 0.3))
                .unwrap()
                .to_dtype(DType::Bf16);
            let (pv, wv) = (p.to_f32_vec(), wt.to_f32_vec());
            let factors = super::Factors::new(&p, &wt);
            assert_eq!(matches!(factors, super::Factors::Bf16 { .. }), super::bf16_available());
            let c = wave(bn * cols, 0.1);
            let mut got = c.clone();
            assert!(factors.add(&mut got, 0));
            let err = max_err(&got, &c, &pv, &wv, cols, m);
            assert!(err < 1e-5, "{bn}x{cols}, rank {m}: {err}");
            if bn > 1 {
                let half = bn / 2;
                let mut tail = c[half * cols..].to_vec();
                assert!(factors.add(&mut tail, half));
                let err = max_err(&tail, &c[half * cols..], &pv[half * m..], &wv, cols, m);
                assert!(err < 1e-5, "{bn}x{cols}, rank {m}, rows from {half}: {err}");
            }
        }
    }

    /// Against f64 sums, for row counts past a multiple of 4 and column counts past 64; a
    /// non-finite result is reported.
    #[test]
    fn add_product_matches_f64() {
        for (bn, cols, m) in [(1, 16, 1), (7, 80, 5), (64, 192, 32), (13, 256, 17), (5, 20, 3)] {
            let (c, p, wt) = (wave(bn * cols, 0.1), wave(bn * m, 0.2), wave(m * cols, 0.3));
            let mut got = c.clone();
            assert!(super::add_product(&mut got, bn, cols, &p, &wt, m));
            let err = max_err(&got, &c, &p, &wt, cols, m);
            assert!(err < 1e-5, "{bn}x{cols}, rank {m}: {err}");
            let mut huge = c.clone();
            huge[bn * cols - 1] = f32::MAX;
            let big = vec![f32::MAX; m * cols];
            assert!(!super::add_product(
                &mut huge,
                bn,
                cols,
                &p.iter().map(|x| x.abs() + 1.0).collect::<Vec<_>>(),
                &big,
                m
            ));
        }
    }
}
