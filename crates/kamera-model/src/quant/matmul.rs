//! Prefill products on quantized weights: panels of rows dequantized into a cache-sized f32
//! buffer (both cores), each multiplied by the `gemm` crate's f32 kernels straight into the output.

use rayon::prelude::*;

use super::QMatrix;

/// f32 values per dequantized panel (1 MiB: it stays in L2 while the GEMM reads it).
const PANEL_VALUES: usize = 1 << 18;

/// `y = x Wᵀ` for `x: [n, cols]`, `y: [n, rows]`, row-major.
pub(crate) fn matmul(q: &QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
    let (rows, cols) = (q.rows, q.cols);
    debug_assert_eq!((x.len(), y.len()), (n * cols, n * rows));
    let panel_rows = (PANEL_VALUES / cols).clamp(16, rows);
    let mut panel = vec![0f32; panel_rows * cols];
    let threads = rayon::current_num_threads();
    for r0 in (0..rows).step_by(panel_rows) {
        let pr = panel_rows.min(rows - r0);
        panel[..pr * cols]
            .par_chunks_mut(cols)
            .enumerate()
            .for_each(|(i, row)| q.dequantize_row(r0 + i, row));
        // SAFETY: dst is the n x pr block of y at column r0 (row stride `rows`), lhs is x
        // (n x cols), rhs is the panel read as its transpose (cols x pr); all in bounds.
        unsafe {
            gemm::gemm(
                n,
                pr,
                cols,
                y.as_mut_ptr().add(r0),
                1,
                rows as isize,
                false,
                x.as_ptr(),
                1,
                cols as isize,
                panel.as_ptr(),
                cols as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(threads),
            );
        }
    }
}
