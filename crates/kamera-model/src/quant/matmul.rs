//! Prefill products on weights not held in f32 (quantized codes, or bf16 multiplied in f32):
//! panels of rows widened into a cache-sized f32 buffer, each multiplied by the `gemm` crate's
//! f32 kernels straight into the output, panels over the rayon pool.

use rayon::prelude::*;

use super::{Out, QMatrix};

/// f32 values per dequantized panel (1 MiB: it stays in L2 while the GEMM reads it).
const PANEL_VALUES: usize = 1 << 18;

/// `y = x Wᵀ` for `x: [n, cols]`, `y: [n, rows]`, row-major. Panels are the parallel tasks:
/// each thread dequantizes its own panel and multiplies it on its own, so no GEMM waits for
/// the other core.
pub(crate) fn matmul(q: &QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
    panels((q.rows, q.cols), x, n, y, |r, row| q.dequantize_row(r, row));
}

/// [`matmul`] for any weight of `rows x cols` whose row `r` `widen` writes in f32.
pub(crate) fn panels(
    (rows, cols): (usize, usize),
    x: &[f32],
    n: usize,
    y: &mut [f32],
    widen: impl Fn(usize, &mut [f32]) + Sync,
) {
    assert_eq!((x.len(), y.len()), (n * cols, n * rows), "matmul shapes");
    let threads = rayon::current_num_threads().max(1);
    // Enough panels for every thread, each of 1 MiB (in L2 while the GEMM reads it) but at least
    // 128 rows: the GEMM packs the whole input again for every panel, so the 23-row panels of a
    // down projection's 11008 columns ran at 122-127 GFLOP/s against 144-166 with 128 rows
    // (`dense_speed`, [2048, 11008] x 252 rows, Zen 3, 2 threads).
    let panel_rows = (PANEL_VALUES / cols).max(128).min(rows.div_ceil(threads).max(16));
    let out = Out(y.as_mut_ptr());
    let panels = rows.div_ceil(panel_rows);
    (0..panels).into_par_iter().for_each_init(
        || vec![0f32; panel_rows * cols],
        |panel, p| {
            let r0 = p * panel_rows;
            let pr = panel_rows.min(rows - r0);
            for (i, row) in panel[..pr * cols].chunks_exact_mut(cols).enumerate() {
                widen(r0 + i, row);
            }
            // SAFETY: dst is the n x pr block of y at column r0 (row stride `rows`), written by
            // this task alone; lhs is x (n x cols), rhs is the panel read as its transpose
            // (cols x pr); all in bounds.
            unsafe {
                gemm_f32(
                    (n, pr, cols),
                    (out.at(r0), rows as isize, 1),
                    (x.as_ptr(), cols as isize, 1),
                    (panel.as_ptr(), 1, cols as isize),
                );
            }
        },
    );
}

/// A matrix operand of [`gemm_f32`]: its first element and its row and column strides (elements).
pub(crate) type Strided<P> = (P, isize, isize);

/// `dst = lhs · rhs` (`[m, k] x [k, n]`) in f32 with the `gemm` crate's kernels on the calling
/// thread, every operand read or written through its strides (transposes and interleaved
/// layouts without a copy).
///
/// # Safety
/// Every element the shapes and strides address lies in its operand's allocation, and no other
/// thread touches `dst`'s elements during the call.
pub(crate) unsafe fn gemm_f32(
    (m, n, k): (usize, usize, usize),
    (dst, dst_rs, dst_cs): Strided<*mut f32>,
    (lhs, lhs_rs, lhs_cs): Strided<*const f32>,
    (rhs, rhs_rs, rhs_cs): Strided<*const f32>,
) {
    // SAFETY: the caller's contract; alpha 0 with read_dst false: dst is only written.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_cs,
            dst_rs,
            false,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
