//! Dense weights held in bf16 (a Hugging Face checkpoint's own type): half the bytes of f32.
//! Two kinds of arithmetic on the same storage:
//! - *tiles* (the bf16 prefill precision, AVX512_BF16 only): products of 2+ input rows run on
//!   AMX where the CPU has it (the weight rows are AMX's A operand as they lie, the input is
//!   packed instead; `amx::dense`), else on the AVX512_BF16 tiles of `bf16.rs` (the rows
//!   transposed into tiles per product), the input rounded to bf16 too;
//! - *f32* (any CPU; a checkpoint stored in bf16 is held so, exactly, whatever the precision):
//!   panels of rows widened to f32 into the f32 GEMM (`matmul::panels`), the input unrounded,
//!   so the products equal those of the f32 matrix; up to [`FEW_ROWS`] input rows on AVX2,
//!   register tiles straight from the pairs instead (a hit's or a question's prompt: 2.7x the
//!   panels at 14 rows, 5x at 4).
//!
//! One-row products are dot products over the pairs in f32 either way (AVX2 where the CPU has
//! it).

use rayon::prelude::*;

use super::{Aligned, Epilogue};

/// Rows are stored this many pairs apart at least (a whole AMX tile row), and the row count
/// padded to a multiple of [`ROW_BLOCK`], with zeros: every AMX load is a whole tile.
const PAIR_BLOCK: usize = 16;
const ROW_BLOCK: usize = 32;

/// A `[rows, cols]` weight in bf16, row-major, two values a `u32` (the even column low), rows
/// `stride` pairs apart (zeros past `cols / 2`), zero rows up to a multiple of 32.
#[derive(Debug)]
pub(crate) struct Bf16Matrix {
    pub rows: usize,
    pub cols: usize,
    stride: usize,
    pairs: Aligned<u32>,
    /// Products of 2+ rows on the bf16 tiles (the input rounded to bf16), else in f32.
    tiles: bool,
}

impl Bf16Matrix {
    /// `w` (`rows · cols` f32, row-major) rounded to bf16 (nearest even), multiplied on the
    /// tiles; `None` where the bf16 kernel does not take it (an odd column count, or a CPU
    /// without AVX512_BF16).
    pub fn from_f32(w: &[f32], rows: usize, cols: usize) -> Option<Bf16Matrix> {
        if cols % 2 != 0 || w.len() != rows * cols || !super::PrefillPrecision::Bf16.available() {
            return None;
        }
        let mut m = Bf16Matrix::zeroed(rows, cols, true);
        let stride = m.stride;
        #[cfg(target_arch = "x86_64")]
        m.pairs
            .par_chunks_mut(stride)
            .zip(w.par_chunks(cols))
            .for_each(|(o, r)| super::bf16::round_pairs(r, &mut o[..cols / 2]));
        Some(m)
    }

    /// `w` held in bf16 without rounding, multiplied in f32 (any CPU): `None` unless every value
    /// is a bf16 (a checkpoint stored in bf16, widened on load) and the column count even.
    pub fn exact(w: &[f32], rows: usize, cols: usize) -> Option<Bf16Matrix> {
        if cols % 2 != 0 || w.len() != rows * cols || w.par_iter().any(|v| v.to_bits() & 0xffff != 0) {
            return None;
        }
        let mut m = Bf16Matrix::zeroed(rows, cols, false);
        let stride = m.stride;
        m.pairs
            .par_chunks_mut(stride)
            .zip(w.par_chunks(cols))
            .for_each(|(o, r)| {
                for (p, v) in o.iter_mut().zip(r.chunks_exact(2)) {
                    *p = (v[0].to_bits() >> 16) | (v[1].to_bits() & 0xffff_0000);
                }
            });
        Some(m)
    }

    /// A bf16 tensor's bytes (`rows · cols · 2`, little-endian, row-major: a safetensors
    /// file's) held as they are, on the tiles where `tiles` asks and the CPU has them: a pair is
    /// one little-endian `u32` of the bytes. `None` for an odd or zero column count or a byte
    /// count that is not the shape's.
    pub fn from_bf16_bytes(bytes: &[u8], rows: usize, cols: usize, tiles: bool) -> Option<Bf16Matrix> {
        if cols == 0 || cols % 2 != 0 || Some(bytes.len()) != rows.checked_mul(cols).and_then(|n| n.checked_mul(2)) {
            return None;
        }
        let mut m = Bf16Matrix::zeroed(rows, cols, tiles && super::PrefillPrecision::Bf16.available());
        let stride = m.stride;
        m.pairs
            .par_chunks_mut(stride)
            .zip(bytes.par_chunks(cols * 2))
            .for_each(|(o, r)| {
                for (p, b) in o.iter_mut().zip(r.chunks_exact(4)) {
                    *p = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            });
        Some(m)
    }

    fn zeroed(rows: usize, cols: usize, tiles: bool) -> Bf16Matrix {
        let mut stride = (cols / 2).next_multiple_of(PAIR_BLOCK);
        // Rows a multiple of 4 KiB apart would all fall in one L1 set: one tile load's 16 rows
        // would evict each other.
        if stride % 1024 == 0 {
            stride += PAIR_BLOCK;
        }
        Bf16Matrix {
            rows,
            cols,
            stride,
            pairs: Aligned::zeroed(rows.next_multiple_of(ROW_BLOCK) * stride),
            tiles,
        }
    }

    /// Whether products of 2+ rows run on the bf16 tiles.
    pub fn tiles(&self) -> bool {
        self.tiles
    }

    /// Multiplies on the bf16 tiles (`true`, where the CPU has AVX512_BF16: whether it took it)
    /// or in f32 from now on; the stored values stay as they are.
    pub fn set_tiles(&mut self, tiles: bool) -> bool {
        self.tiles = tiles && super::PrefillPrecision::Bf16.available();
        self.tiles == tiles
    }

    /// Resident bytes.
    pub fn bytes(&self) -> usize {
        self.pairs.len() * 4
    }

    fn row(&self, r: usize) -> &[u32] {
        &self.pairs[r * self.stride..r * self.stride + self.cols / 2]
    }

    /// Row `r` in f32 into `out` (`cols` values).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        for (o, &p) in out.chunks_exact_mut(2).zip(self.row(r)) {
            (o[0], o[1]) = unpack(p);
        }
    }

    /// The whole matrix in f32.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        out.par_chunks_mut(self.cols)
            .enumerate()
            .for_each(|(r, row)| self.row_into(r, row));
        out
    }

    /// `x` in the order the AVX2 one-row products read it, where the CPU has AVX2 + FMA (else
    /// `None`): once per input, shared by every call of [`Bf16Matrix::rows_into`] on it.
    pub fn lane_input(x: &[f32]) -> Option<Vec<f32>> {
        #[cfg(target_arch = "x86_64")]
        if super::avx2::available() {
            return Some(avx2::lane_order(x));
        }
        let _ = x;
        None
    }

    /// Rows `r0..r0 + out.len()` of `W x` for one input row, on the calling thread (decode);
    /// `lanes` = [`Bf16Matrix::lane_input`] of `x`.
    pub fn rows_into(&self, x: &[f32], lanes: Option<&[f32]>, r0: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(lanes) = lanes {
            for (i, o) in out.iter_mut().enumerate() {
                // SAFETY: `lanes` exists only where the CPU has AVX2 and FMA; the row holds
                // `cols / 2` pairs, `lanes` and `x` `cols` values.
                *o = unsafe { avx2::dot(self.row(r0 + i), lanes, x) };
            }
            return;
        }
        let _ = lanes;
        for (i, o) in out.iter_mut().enumerate() {
            // Eight partial sums, so the loop vectorizes.
            let mut acc = [0f32; 8];
            for (ps, xs) in self.row(r0 + i).chunks(4).zip(x.chunks(8)) {
                for (j, &p) in ps.iter().enumerate() {
                    let (a, b) = unpack(p);
                    acc[2 * j] += a * xs[2 * j];
                    acc[2 * j + 1] += b * xs[2 * j + 1];
                }
            }
            *o = acc.iter().sum();
        }
    }

    /// `y = x Wᵀ` for `x: [n, cols]`: one row as dot products over the pool; more on AMX or
    /// the bf16 tiles (the input rounded to bf16 too) when [`Bf16Matrix::tiles`], else on f32
    /// panels.
    #[cfg(test)]
    pub fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        self.forward_into(x, n, y, Epilogue::default());
    }

    /// [`Bf16Matrix::forward`] with a bias and/or added to `y` (`then`), in the same pass
    /// where AMX writes the output.
    pub fn forward_into(&self, x: &[f32], n: usize, y: &mut [f32], then: Epilogue<'_>) {
        assert_eq!(
            (x.len(), y.len()),
            (n * self.cols, n * self.rows),
            "Bf16Matrix::forward shapes"
        );
        #[cfg(target_arch = "x86_64")]
        if n > 1 && self.tiles && super::amx::available() {
            super::amx::dense(&self.pairs, (self.rows, self.cols, self.stride), x, n, y, then);
            return;
        }
        let prev = then.add.then(|| y.to_vec());
        if n == 1 {
            let chunk = self.rows.div_ceil(rayon::current_num_threads() * 4).max(16);
            let lanes = Bf16Matrix::lane_input(x);
            y.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(c, out)| self.rows_into(x, lanes.as_deref(), c * chunk, out));
        } else if !self.tiles && few(n) {
            #[cfg(target_arch = "x86_64")]
            self.few_rows(x, n, y);
        } else if !self.tiles {
            super::matmul::panels((self.rows, self.cols), x, n, y, |r, row| self.row_into(r, row));
        } else {
            #[cfg(target_arch = "x86_64")]
            {
                let dims = (self.cols / 2, self.stride);
                super::bf16::matmul_tiles(self.rows, self.cols, x, n, y, |r0, tile| {
                    super::bf16::pack_pairs_tile(&self.pairs, dims, self.rows, r0, tile)
                });
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("a Bf16Matrix exists only where the bf16 kernel runs");
        }
        then.apply(y, self.rows, prev.as_deref());
    }

    /// `y = x Wᵀ` for a few input rows in f32 ([`FEW_ROWS`] at most, the CPU with AVX2 + FMA):
    /// weight rows in chunks over the pool, each multiplied straight from its pairs.
    #[cfg(target_arch = "x86_64")]
    fn few_rows(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let lanes: Vec<f32> = x.chunks_exact(self.cols).flat_map(avx2::lane_order).collect();
        let chunk = self
            .rows
            .div_ceil(rayon::current_num_threads() * 4)
            .next_multiple_of(4)
            .max(16);
        let out = super::Out(y.as_mut_ptr());
        let m = (&self.pairs[..], self.stride, self.cols);
        (0..self.rows.div_ceil(chunk)).into_par_iter().for_each(|c| {
            let rows = (c * chunk, ((c + 1) * chunk).min(self.rows));
            // SAFETY: `few_rows` runs only where the CPU has AVX2 and FMA; each task writes its
            // own columns of every output row; `lanes` holds `n` inputs in lane order.
            unsafe { avx2::few_rows(m, &lanes, x, n, rows, out, self.rows) }
        });
    }
}

/// Input rows up to which f32 products skip the panels (below it the widening and the GEMM's
/// packing cost more than the products; `dense_speed` measures both sides).
const FEW_ROWS: usize = 64;

/// Whether `n` input rows multiply through [`Bf16Matrix::few_rows`] on this CPU.
fn few(n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return n <= FEW_ROWS && super::avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = n;
        false
    }
}

/// The one-row products on AVX2 + FMA: eight pairs at a time, their even and odd columns
/// widened by a shift and a mask, multiplied by the input in the same lane order.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::avx2::hsum;

    /// `x` in the order the kernel reads it: per 16 values, the 8 even columns then the 8 odd.
    pub fn lane_order(x: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; x.len() / 16 * 16];
        for (o, c) in out.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
            for i in 0..8 {
                o[i] = c[2 * i];
                o[8 + i] = c[2 * i + 1];
            }
        }
        out
    }

    /// `Σ w·x` over one row's pairs; `lanes` = [`lane_order`] of `x` (the tail past its
    /// whole blocks read from `x`).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(pairs: &[u32], lanes: &[f32], x: &[f32]) -> f32 {
        let blocks = lanes.len() / 16;
        unsafe {
            let (mut ae, mut ao) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mask = _mm256_set1_epi32(0xffff_0000u32 as i32);
            for b in 0..blocks {
                let p = _mm256_loadu_si256(pairs.as_ptr().add(8 * b) as *const __m256i);
                let even = _mm256_castsi256_ps(_mm256_slli_epi32(p, 16));
                let odd = _mm256_castsi256_ps(_mm256_and_si256(p, mask));
                ae = _mm256_fmadd_ps(even, _mm256_loadu_ps(lanes.as_ptr().add(16 * b)), ae);
                ao = _mm256_fmadd_ps(odd, _mm256_loadu_ps(lanes.as_ptr().add(16 * b + 8)), ao);
            }
            hsum(_mm256_add_ps(ae, ao)) + tail(pairs, x, blocks)
        }
    }

    /// `Σ w·x` over the pairs past the first `blocks` whole blocks of eight.
    fn tail(pairs: &[u32], x: &[f32], blocks: usize) -> f32 {
        let mut sum = 0f32;
        for (i, &p) in pairs.iter().enumerate().skip(8 * blocks) {
            let (a, b) = super::unpack(p);
            sum += a * x[2 * i] + b * x[2 * i + 1];
        }
        sum
    }

    /// Weight rows and input rows per register tile of [`few_rows`] (8 accumulators, the two
    /// inputs' 16 columns, one weight row's and the mask: 15 of the 16 registers).
    const TILE_W: usize = 4;
    const TILE_X: usize = 2;
    /// Blocks of 16 columns per pass over the inputs: a chunk of four weight rows (2 KiB) and
    /// of every input row (1 KiB each) stays in L1 while the input pairs go by.
    const CHUNK_BLOCKS: usize = 16;

    /// Products of a few input rows (`n`, up to a few dozen) with weight rows `r0..r1`, straight
    /// from the pairs (the panels' widening and the GEMM's packing cost more than the products
    /// at so few rows): `y[i · y_stride + r] = W[r] · x[i]`. `lanes` holds the `n` inputs in
    /// [`lane_order`], `cols / 16 · 16` values each; `x` the same inputs as they are.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `pairs` holds rows `r0..r1` `stride` pairs apart, `cols / 2`
    /// each; `y` addresses `n` rows of `y_stride` values, columns `r0..r1` written by this call
    /// alone.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn few_rows(
        (pairs, stride, cols): (&[u32], usize, usize),
        lanes: &[f32],
        x: &[f32],
        n: usize,
        (r0, r1): (usize, usize),
        y: super::super::Out,
        y_stride: usize,
    ) {
        let blocks = cols / 16;
        let ln = blocks * 16;
        let groups = n.div_ceil(TILE_X);
        let mut acc = vec![_mm256_setzero_ps(); groups * TILE_W * TILE_X];
        for g0 in (r0..r1).step_by(TILE_W) {
            let rw = (r1 - g0).min(TILE_W);
            acc.fill(_mm256_setzero_ps());
            let w = pairs.as_ptr().wrapping_add(g0 * stride);
            for c0 in (0..blocks).step_by(CHUNK_BLOCKS) {
                let c = (c0, (c0 + CHUNK_BLOCKS).min(blocks));
                for g in 0..groups {
                    let i0 = g * TILE_X;
                    let xs = lanes.as_ptr().wrapping_add(i0 * ln);
                    let a = &mut acc[g * TILE_W * TILE_X..(g + 1) * TILE_W * TILE_X];
                    // SAFETY: rows g0..g0 + rw and inputs i0..i0 + nx exist; blocks c.
                    unsafe {
                        match (rw, (n - i0).min(TILE_X)) {
                            (4, 2) => tile::<4, 2>(w, stride, xs, ln, c, a),
                            (4, _) => tile::<4, 1>(w, stride, xs, ln, c, a),
                            (3, 2) => tile::<3, 2>(w, stride, xs, ln, c, a),
                            (3, _) => tile::<3, 1>(w, stride, xs, ln, c, a),
                            (2, 2) => tile::<2, 2>(w, stride, xs, ln, c, a),
                            (2, _) => tile::<2, 1>(w, stride, xs, ln, c, a),
                            (_, 2) => tile::<1, 2>(w, stride, xs, ln, c, a),
                            _ => tile::<1, 1>(w, stride, xs, ln, c, a),
                        }
                    }
                }
            }
            for i in 0..n {
                let (g, j) = (i / TILE_X, i % TILE_X);
                let xi = &x[i * cols..(i + 1) * cols];
                for r in 0..rw {
                    let row = &pairs[(g0 + r) * stride..(g0 + r) * stride + cols / 2];
                    // SAFETY: the caller's contract on `y`.
                    unsafe {
                        *y.at(i * y_stride + g0 + r) = hsum(acc[(g * TILE_W + r) * TILE_X + j]) + tail(row, xi, blocks);
                    }
                }
            }
        }
    }

    /// `acc[r · TILE_X + j] += W[r] · x[j]` over blocks `c0..c1`, `R` weight rows from `w`
    /// (`stride` pairs apart), `N` inputs from `xs` (`ln` apart, lane order).
    #[inline(always)]
    unsafe fn tile<const R: usize, const N: usize>(
        w: *const u32,
        stride: usize,
        xs: *const f32,
        ln: usize,
        (c0, c1): (usize, usize),
        acc: &mut [__m256],
    ) {
        unsafe {
            let mask = _mm256_set1_epi32(0xffff_0000u32 as i32);
            let mut a = [[_mm256_setzero_ps(); N]; R];
            for r in 0..R {
                for j in 0..N {
                    a[r][j] = acc[r * TILE_X + j];
                }
            }
            for b in c0..c1 {
                let mut xe = [_mm256_setzero_ps(); N];
                let mut xo = [_mm256_setzero_ps(); N];
                for j in 0..N {
                    xe[j] = _mm256_loadu_ps(xs.add(j * ln + 16 * b));
                    xo[j] = _mm256_loadu_ps(xs.add(j * ln + 16 * b + 8));
                }
                for r in 0..R {
                    let p = _mm256_loadu_si256(w.add(r * stride + 8 * b) as *const __m256i);
                    let even = _mm256_castsi256_ps(_mm256_slli_epi32(p, 16));
                    let odd = _mm256_castsi256_ps(_mm256_and_si256(p, mask));
                    for j in 0..N {
                        a[r][j] = _mm256_fmadd_ps(even, xe[j], a[r][j]);
                        a[r][j] = _mm256_fmadd_ps(odd, xo[j], a[r][j]);
                    }
                }
            }
            for r in 0..R {
                for j in 0..N {
                    acc[r * TILE_X + j] = a[r][j];
                }
            }
        }
    }
}

/// A pair's two values (the even column first).
#[inline(always)]
fn unpack(p: u32) -> (f32, f32) {
    (f32::from_bits(p << 16), f32::from_bits(p & 0xffff_0000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.2)
            .collect()
    }

    /// f64 sums of the bf16-rounded operands: what the tiles compute up to f32 accumulation.
    fn reference(w: &[f32], x: &[f32], rows: usize, cols: usize, n: usize) -> Vec<f32> {
        let r = |v: f32| super::super::bf16::round_bf16(v) as f64;
        let mut y = vec![0f32; n * rows];
        for i in 0..n {
            for j in 0..rows {
                let s: f64 = (0..cols).map(|k| r(w[j * cols + k]) * r(x[i * cols + k])).sum();
                y[i * rows + j] = s as f32;
            }
        }
        y
    }

    #[test]
    fn products_match_the_rounded_reference_for_every_shape() {
        if !super::super::PrefillPrecision::Bf16.available() {
            kamera_ops::testkit::skip(
                "quant::dense::tests::products_match_the_rounded_reference_for_every_shape",
                "this CPU has no AVX512_BF16",
            );
            return;
        }
        // Rows past a tile, columns not a multiple of 32 (the tower's 3420), 1 to 40 input rows.
        for &(rows, cols) in &[(50, 64), (97, 1710), (3, 38), (130, 92)] {
            let w = weights(rows, cols);
            let m = Bf16Matrix::from_f32(&w, rows, cols).unwrap();
            let mut back = vec![0f32; cols];
            m.row_into(rows - 1, &mut back);
            for (b, &v) in back.iter().zip(&w[(rows - 1) * cols..]) {
                assert_eq!(*b, super::super::bf16::round_bf16(v));
            }
            for n in [1, 2, 9, 40, FEW_ROWS, FEW_ROWS + 1, 300] {
                let x: Vec<f32> = (0..n * cols).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
                let mut y = vec![0f32; n * rows];
                m.forward(&x, n, &mut y);
                // The AVX512_BF16 tiles too, which run instead of AMX where the CPU lacks it.
                let mut tiles = vec![0f32; n * rows];
                if n > 1 {
                    let dims = (cols / 2, m.stride);
                    super::super::bf16::matmul_tiles(rows, cols, &x, n, &mut tiles, |r0, tile| {
                        super::super::bf16::pack_pairs_tile(&m.pairs, dims, rows, r0, tile)
                    });
                }
                let want = if n == 1 {
                    // One row multiplies the f32 input: round only the weights.
                    let wr: Vec<f32> = w.iter().map(|&v| super::super::bf16::round_bf16(v)).collect();
                    (0..rows)
                        .map(|j| (0..cols).map(|k| wr[j * cols + k] as f64 * x[k] as f64).sum::<f64>() as f32)
                        .collect()
                } else {
                    reference(&w, &x, rows, cols, n)
                };
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{rows}x{cols}, n {n}: {a} vs {b}"
                    );
                    if n > 1 {
                        let t = tiles[i];
                        assert!(
                            (t - b).abs() <= 1e-4 * (1.0 + b.abs()),
                            "tiles {rows}x{cols}, n {n}: {t} vs {b}"
                        );
                    }
                }
            }
        }
        // Bias and residual in the product's pass: y0 + (x Wᵀ + b), every path (1 row, AMX or
        // tiles, partial blocks).
        for &(rows, cols, n) in &[(50, 64, 1), (97, 1710, 40), (130, 92, 17)] {
            check_epilogue(&Bf16Matrix::from_f32(&weights(rows, cols), rows, cols).unwrap(), n);
        }
        assert!(
            Bf16Matrix::from_f32(&weights(4, 5), 4, 5).is_none(),
            "odd columns refused"
        );
    }

    /// `forward_into` with a bias and the residual equals `y0 + (x Wᵀ + b)` from `forward`.
    fn check_epilogue(m: &Bf16Matrix, n: usize) {
        let (rows, cols) = (m.rows, m.cols);
        let x: Vec<f32> = (0..n * cols).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
        let bias: Vec<f32> = (0..rows).map(|j| j as f32 * 0.01 - 0.3).collect();
        let mut plain = vec![0f32; n * rows];
        m.forward(&x, n, &mut plain);
        let y0: Vec<f32> = (0..n * rows).map(|i| (i % 7) as f32).collect();
        let mut y = y0.clone();
        let then = Epilogue {
            bias: Some(&bias),
            add: true,
        };
        m.forward_into(&x, n, &mut y, then);
        for (i, &v) in y.iter().enumerate() {
            let want = y0[i] + plain[i] + bias[i % rows];
            assert!(
                (v - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{rows}x{cols} n {n} at {i}: {v} vs {want}"
            );
        }
    }

    /// `weights` rounded to bf16: what a bf16 checkpoint holds.
    fn bf16_weights(rows: usize, cols: usize) -> Vec<f32> {
        weights(rows, cols)
            .iter()
            .map(|v| f32::from_bits(v.to_bits() & 0xffff_0000))
            .collect()
    }

    #[test]
    fn exact_bf16_weights_multiply_like_their_f32_matrix_on_every_cpu() {
        // Columns not a multiple of 16 (the kernels' tail), 1 to 300 input rows (dots, a few
        // rows from the pairs up to FEW_ROWS on AVX2, panels past it).
        for &(rows, cols) in &[(50, 64), (97, 1710), (3, 38), (130, 92)] {
            let w = bf16_weights(rows, cols);
            let m = Bf16Matrix::exact(&w, rows, cols).expect("every value is a bf16");
            assert!(!m.tiles(), "exact matrices multiply in f32");
            assert_eq!(m.to_f32(), w, "held without rounding");
            for n in [1, 2, 9, 40, FEW_ROWS, FEW_ROWS + 1, 300] {
                let x: Vec<f32> = (0..n * cols).map(|i| ((i % 17) as f32 - 8.0) / 8.0 + 0.01).collect();
                let mut y = vec![0f32; n * rows];
                m.forward(&x, n, &mut y);
                for i in 0..n {
                    for j in 0..rows {
                        let want: f64 = (0..cols).map(|k| w[j * cols + k] as f64 * x[i * cols + k] as f64).sum();
                        let got = y[i * rows + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{rows}x{cols}, n {n}, [{i}, {j}]: {got} vs {want}"
                        );
                    }
                }
            }
            // Bias and residual on the panels' path, a few rows' and the dots'.
            check_epilogue(&m, 100);
            check_epilogue(&m, 17);
            check_epilogue(&m, 1);
        }
        let mut w = bf16_weights(4, 6);
        w[5] = 0.1;
        assert!(
            Bf16Matrix::exact(&w, 4, 6).is_none(),
            "a value that is not a bf16 is refused"
        );
        assert!(
            Bf16Matrix::exact(&bf16_weights(4, 5), 4, 5).is_none(),
            "odd columns refused"
        );
    }

    #[test]
    fn a_bf16_tensors_bytes_make_the_matrix_its_widened_values_make() {
        for &(rows, cols) in &[(50, 64), (3, 38), (33, 2)] {
            let w = bf16_weights(rows, cols);
            let bytes: Vec<u8> = w
                .iter()
                .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                .collect();
            let from_bytes = Bf16Matrix::from_bf16_bytes(&bytes, rows, cols, false).expect("an even shape");
            let widened = Bf16Matrix::exact(&w, rows, cols).expect("every value is a bf16");
            assert_eq!(from_bytes.stride, widened.stride);
            assert_eq!(
                &from_bytes.pairs[..],
                &widened.pairs[..],
                "{rows}x{cols}: the same pairs, padding included"
            );
            assert!(!from_bytes.tiles());
            let tiled = Bf16Matrix::from_bf16_bytes(&bytes, rows, cols, true).expect("an even shape");
            assert_eq!(tiled.tiles(), super::super::PrefillPrecision::Bf16.available());
        }
        let bytes = vec![0u8; 4 * 5 * 2];
        assert!(
            Bf16Matrix::from_bf16_bytes(&bytes, 4, 5, false).is_none(),
            "odd columns refused"
        );
        for n in [31, 33, 40] {
            assert!(
                Bf16Matrix::from_bf16_bytes(&bytes[..n], 4, 4, false).is_none(),
                "{n} bytes for a 4x4 matrix refused"
            );
        }
        assert!(
            Bf16Matrix::from_bf16_bytes(&[], 0, 0, false).is_none(),
            "no columns refused"
        );
    }

    /// Speed probe (`cargo test --release -p kamera-model dense_speed -- --ignored --nocapture`):
    /// the tower's and the 3B text model's shapes, bf16 tiles (or, without AVX512_BF16, the f32
    /// panels of an exact bf16 matrix) against candle's f32 GEMM.
    #[test]
    #[ignore = "a speed probe, not a check"]
    fn dense_speed() {
        use candle_core::{Device, Tensor};
        for &(rows, cols, n) in &[
            (3420, 1280, 1016),
            (3840, 1280, 1016),
            (11008, 2048, 256),
            (2048, 11008, 252),
            (2048, 2048, 256),
            (11008, 2048, 4),
            (11008, 2048, 14),
            (2048, 2048, 14),
            (11008, 2048, 32),
            (11008, 2048, 64),
            (11008, 2048, 96),
            (11008, 2048, 128),
            (11008, 2048, 192),
        ] {
            let w = bf16_weights(rows, cols);
            let m = Bf16Matrix::from_f32(&w, rows, cols).unwrap_or_else(|| Bf16Matrix::exact(&w, rows, cols).unwrap());
            let x: Vec<f32> = (0..n * cols).map(|i| (i as f32).cos()).collect();
            let mut y = vec![0f32; n * rows];
            let best_of_6 = |f: &mut dyn FnMut()| {
                (0..6)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        f();
                        t.elapsed().as_secs_f64()
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            let gf = |s: f64| 2.0 * (n * rows * cols) as f64 / s / 1e9;
            let b = best_of_6(&mut || m.forward(&x, n, &mut y));
            let bias = vec![0.5f32; rows];
            let then = Epilogue {
                bias: Some(&bias),
                add: true,
            };
            let e = best_of_6(&mut || m.forward_into(&x, n, &mut y, then));
            // Without the tiles, a few rows' two ways: straight from the pairs and on the panels.
            #[cfg(target_arch = "x86_64")]
            let few = if !m.tiles() && crate::quant::avx2::available() && n <= 256 {
                let f = best_of_6(&mut || m.few_rows(&x, n, &mut y));
                let p = best_of_6(&mut || {
                    crate::quant::matmul::panels((rows, cols), &x, n, &mut y, |r, row| m.row_into(r, row))
                });
                format!(", {n} rows from the pairs {:.1} / on the panels {:.1}", gf(f), gf(p))
            } else {
                String::new()
            };
            #[cfg(not(target_arch = "x86_64"))]
            let few = String::new();
            let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
            let xt = Tensor::from_vec(x, (n, cols), &Device::Cpu).unwrap();
            let _ = xt.matmul(&wt.t().unwrap()).unwrap();
            let t = std::time::Instant::now();
            let _ = xt.matmul(&wt.t().unwrap()).unwrap();
            let f = t.elapsed().as_secs_f64();
            println!(
                "[{rows}, {cols}] x {n} rows: {} (best of 6) {:.1} GFLOP/s, with bias and residual {:.1}, candle f32 {:.1} GFLOP/s{few}",
                if m.tiles() { "bf16 tiles" } else { "f32" },
                gf(b),
                gf(e),
                gf(f)
            );
        }
    }
}
