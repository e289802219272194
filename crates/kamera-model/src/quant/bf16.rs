//! Prefill products in bf16 on AVX512_BF16: the input rounded to bf16 once, each panel of weight
//! rows dequantized into bf16 pairs, and `VDPBF16PS` tiles (8 input rows × 48 weight rows)
//! accumulating in f32. Twice the f32 kernel's multiply-adds per instruction; both operands
//! carry 8 significant bits (llama.cpp's own CPU path rounds the input to 8-bit integers).
//! Where the CPU has AMX, whole 16 x 16 blocks of a product run on it instead (`amx.rs`).

use rayon::prelude::*;

use super::{Out, QMatrix};

/// Weight rows per tile: three vectors of 16 lanes.
const TILE: usize = 48;
/// Input rows per tile.
const MR: usize = 8;
/// Column pairs per pass over a tile (its 128 · 48 pairs, 24 KiB, stay in L1).
const KC: usize = 128;

/// Whether this CPU runs the kernel (AVX-512F and AVX512_BF16).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether [`matmul`] takes this weight (an even number of columns, on a CPU that has the kernel).
pub(crate) fn fits(q: &QMatrix) -> bool {
    q.cols % 2 == 0 && available()
}

/// `y = x Wᵀ` for `x: [n, cols]`, `y: [n, rows]`, row-major, with both operands rounded to bf16
/// (round to nearest even) and f32 accumulation. Tiles of weight rows are the parallel tasks.
/// Callers check [`fits`].
pub(crate) fn matmul(q: &QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
    assert!(fits(q), "bf16::matmul needs AVX512_BF16 and an even column count");
    matmul_tiles(q.rows, q.cols, x, n, y, |r0, tile| pack_tile(q, r0, tile));
}

/// [`matmul`] for a weight whose tiles `pack(r0, tile)` writes (weight rows `r0..r0 + 48` as
/// `[pair][48 rows]`, see [`pack_tile`]).
pub(crate) fn matmul_tiles(
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    pack: impl Fn(usize, &mut [u32]) + Sync,
) {
    assert_eq!((x.len(), y.len()), (n * cols, n * rows), "bf16::matmul shapes");
    assert!(
        cols % 2 == 0 && available(),
        "bf16::matmul needs AVX512_BF16 and an even column count"
    );
    let pairs = cols / 2;
    let xa = to_pairs(x);
    let tiles = rows.div_ceil(TILE);
    let threads = rayon::current_num_threads().max(1);
    // A few tasks per thread so a busy core does not hold the product back.
    let per_task = tiles.div_ceil(threads * 3).max(1);
    let out = Out(y.as_mut_ptr());
    (0..tiles.div_ceil(per_task)).into_par_iter().for_each(|t| {
        let (t0, t1) = (t * per_task, ((t + 1) * per_task).min(tiles));
        // This thread's tile buffer, reused: packing overwrites every lane a product reads but
        // the lanes past the last weight row, which feed only columns `product` never writes.
        // Nothing below waits on other rayon tasks, so the borrow cannot be taken twice.
        PACKED_TILES.with_borrow_mut(|buf| {
            let len = (t1 - t0) * pairs * TILE;
            if buf.len() < len {
                *buf = super::Aligned::zeroed(len);
            }
            let packed = &mut buf[..len];
            for (i, tile) in packed.chunks_exact_mut(pairs * TILE).enumerate() {
                pack((t0 + i) * TILE, tile);
            }
            let r0 = t0 * TILE;
            // SAFETY: this task alone writes columns r0..r0 + its tiles' rows of y's n rows.
            unsafe { product(&xa, n, pairs, packed, (t1 * TILE).min(rows) - r0, out.at(r0), rows) };
        });
    });
}

/// Rows `r0..r0 + 48` (those below `rows`) of a row-major matrix of bf16 pairs (`pairs` a row,
/// rows `stride` pairs apart) as a tile for [`product`]: a transpose, 16 x 16 pairs at a time.
/// Lanes past the last row are left as they were (see [`matmul_tiles`]).
pub(crate) fn pack_pairs_tile(data: &[u32], (pairs, stride): (usize, usize), rows: usize, r0: usize, tile: &mut [u32]) {
    assert!(pairs <= stride && data.len() >= rows * stride && tile.len() >= pairs * TILE && r0 < rows);
    // SAFETY: callers checked `available()`; rows r0.. of `data` are in bounds (asserted).
    unsafe { avx512::pack_pairs_tile(data, (pairs, stride), TILE.min(rows - r0), r0, tile) }
}

thread_local! {
    /// [`matmul`]'s packed weight tiles, per thread (not zeroed again for every product).
    static PACKED_TILES: std::cell::RefCell<super::Aligned<u32>> = std::cell::RefCell::new(super::Aligned::zeroed(0));
}

/// `c[i, j] = Σ_p a[i, p] · b[j, p]` over pairs of bf16 (f32 sums), on the calling thread: `a`
/// is `m` rows of `pairs` pairs, `b` the packed tiles of `width` rows ([`pack_rows_into`],
/// [`pack_value_pairs_into`], or weights); `c` has row stride `ldc` and gets `width` columns per row.
///
/// # Safety
/// `c` must be valid for writes of `m` rows of `width` values at stride `ldc`, which no other
/// thread touches; the CPU must have the kernel ([`available`]).
pub(crate) unsafe fn product(a: &[u32], m: usize, pairs: usize, b: &[u32], width: usize, c: *mut f32, ldc: usize) {
    assert!(a.len() >= m * pairs && b.len() >= width.div_ceil(TILE) * pairs * TILE);
    // Whole blocks of 16 pairs on AMX where this process has it, the pairs' tail here. Every
    // row takes the same kernels whatever the number of rows (the last rows padded to a whole
    // AMX block), so a row's result does not depend on the rows it came with: a chunk
    // prefilled alone and inside a longer prefill get the same bits.
    let k16 = if super::amx::available() { pairs / 16 * 16 } else { 0 };
    // SAFETY: (caller) c takes m rows of width values; the parts below cover them once each,
    // the pairs' tail added to the AMX blocks' rows.
    unsafe {
        if k16 == 0 {
            avx512_part(a, pairs, (0, m), (0, pairs), b, width, c, ldc, false);
            return;
        }
        let m16 = m / 16 * 16;
        if m16 > 0 {
            super::amx::blocks(a, pairs, (m16, k16), b, pairs, width, c, ldc);
        }
        if m16 < m {
            let rest = m - m16;
            let mut pa = super::Aligned::<u32>::zeroed(16 * pairs);
            pa[..rest * pairs].copy_from_slice(&a[m16 * pairs..m * pairs]);
            let mut pc = super::Aligned::<f32>::zeroed(16 * width);
            super::amx::blocks(&pa, pairs, (16, k16), b, pairs, width, pc.as_mut_ptr(), width);
            for (r, row) in pc.chunks_exact(width).take(rest).enumerate() {
                std::ptr::copy_nonoverlapping(row.as_ptr(), c.add((m16 + r) * ldc), width);
            }
        }
        if k16 < pairs {
            avx512_part(a, pairs, (0, m), (k16, pairs), b, width, c, ldc, true);
        }
    }
}

/// [`product`] for input rows `r0..r1` over pairs `p0..p1` on the AVX512_BF16 tiles, added to
/// `c` with `acc` (else written).
///
/// # Safety
/// As [`product`].
#[allow(clippy::too_many_arguments)]
unsafe fn avx512_part(
    a: &[u32],
    pairs: usize,
    (r0, r1): (usize, usize),
    (p0, p1): (usize, usize),
    b: &[u32],
    width: usize,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    for k0 in (p0..p1).step_by(KC) {
        let kc = KC.min(p1 - k0);
        for (i, tile) in b.chunks_exact(pairs * TILE).take(width.div_ceil(TILE)).enumerate() {
            let j0 = i * TILE;
            let w = TILE.min(width - j0);
            for m0 in (r0..r1).step_by(MR) {
                let mr = MR.min(r1 - m0);
                // SAFETY: rows m0..m0 + mr, columns j0..j0 + w of c (the caller's); a and b hold
                // mr rows / kc pairs from these offsets.
                unsafe {
                    avx512::Tile {
                        a: a.as_ptr().add(m0 * pairs + k0),
                        lda: pairs,
                        b: tile.as_ptr().add(k0 * TILE),
                        kc,
                        c: c.add(m0 * ldc + j0),
                        ldc,
                        width: w,
                        acc: acc || k0 > p0,
                    }
                    .run_rows(mr);
                }
            }
        }
    }
}

/// `n` rows of `cols` f32 values (row `r` at `src[r · stride..]`, `cols` a multiple of 16) as
/// packed bf16 tiles for [`product`] in `out` (grown as needed, its start overwritten): the
/// keys of an attention block. Lanes past row `n` of the last tile are left as they were;
/// they only feed output columns past `width`, which [`product`] never writes.
pub(crate) fn pack_rows_into(src: &[f32], stride: usize, n: usize, cols: usize, out: &mut super::Aligned<u32>) {
    assert!(cols % 16 == 0 && (n == 0 || src.len() >= (n - 1) * stride + cols));
    let pairs = cols / 2;
    let out = out.grown(n.div_ceil(TILE) * pairs * TILE);
    for (t, tile) in out.chunks_exact_mut(pairs * TILE).enumerate() {
        // SAFETY: callers checked `available()`; rows t·48.. of src are in bounds (asserted).
        unsafe { avx512::pack_f32_tile(src, stride, t * TILE, n, cols, tile) };
    }
}

/// The transpose of `n` rows of `cols` values (row `r` at `src[r · stride..]`), packed for
/// [`product`] with the rows as the summed dimension into `out` (as [`pack_rows_into`]): tiles
/// of 48 columns, a pair holding rows `2p` and `2p + 1` (a zero row past an odd `n`).
/// Attention's values: `out = P · V`.
/// The rows' pairs are [`key_pairs`]`(n)`: zero pairs past row `n`.
pub(crate) fn pack_value_pairs_into(src: &[f32], stride: usize, n: usize, cols: usize, out: &mut super::Aligned<u32>) {
    assert!(cols % 16 == 0 && (n == 0 || src.len() >= (n - 1) * stride + cols));
    let pairs = key_pairs(n);
    let out = out.grown(cols.div_ceil(TILE) * pairs * TILE);
    for (t, tile) in out.chunks_exact_mut(pairs * TILE).enumerate() {
        // SAFETY: callers checked `available()`; rows 0..n of src are in bounds (asserted).
        unsafe { avx512::pack_value_tile(src, stride, n, t * TILE, cols, tile) };
        tile[n.div_ceil(2) * TILE..].fill(0);
    }
}

/// The pairs a product over `n` keys (attention's P · V) runs on: `n` rounded up to whole
/// pairs, and with AMX to whole 16-pair blocks (zeros past `n`), so that every key's term goes
/// through the same kernel whatever the number of keys: a query's output does not depend on how
/// many masked keys its block also holds.
pub(crate) fn key_pairs(n: usize) -> usize {
    if super::amx::available() {
        n.div_ceil(32) * 16
    } else {
        n.div_ceil(2)
    }
}

/// The first `len` values of a reused buffer, grown with zeros where it is shorter.
pub(crate) fn grown<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}

/// `x` rounded to bf16, two per `u32` (the even column in the low half), on a 64-byte boundary
/// as AMX wants its operands.
pub(crate) fn to_pairs(x: &[f32]) -> super::Aligned<u32> {
    let mut out = super::Aligned::zeroed(x.len() / 2);
    let chunk = 1 << 14;
    out.par_chunks_mut(chunk / 2)
        .zip(x.par_chunks(chunk))
        .for_each(|(o, x)| round_pairs(x, o));
    out
}

/// [`to_pairs`] into `out` (`x.len() / 2` values), on the calling thread.
pub(crate) fn round_pairs(x: &[f32], out: &mut [u32]) {
    assert_eq!(out.len(), x.len() / 2, "bf16::round_pairs lengths");
    // SAFETY: callers checked `available()`; `out` holds half of `x`'s values (asserted).
    unsafe { avx512::round_pairs(x, out) }
}

/// Weight rows `r0..r0 + 48` (zeros past the last row) as bf16 pairs, `[pair][48 rows]`:
/// dequantized in registers, 16 rows × 16 pairs at a time, transposed into place.
fn pack_tile(q: &QMatrix, r0: usize, tile: &mut [u32]) {
    // SAFETY: callers checked `available()` (AVX-512F + AVX512_BF16); `tile` holds
    // `cols / 2 · 48` pairs.
    unsafe { avx512::pack_tile(q, r0, tile) }
}

#[cfg(test)]
pub(super) fn pack_tile_for_test(q: &QMatrix, r0: usize, tile: &mut [u32]) {
    pack_tile(q, r0, tile)
}

/// [`pack_tile`] row by row through [`QMatrix::dequantize_row`]: the reference in tests.
#[cfg(test)]
pub(super) fn pack_tile_reference(q: &QMatrix, r0: usize, tile: &mut [u32]) {
    let mut row = vec![0f32; q.cols];
    let mut half = vec![0u32; q.cols / 2];
    for l in 0..TILE.min(q.rows - r0) {
        q.dequantize_row(r0 + l, &mut row);
        // SAFETY: callers checked `available()`.
        unsafe { avx512::round_pairs(&row, &mut half) };
        for (p, &h) in half.iter().enumerate() {
            tile[p * TILE + l] = h;
        }
    }
}

/// The same rounding in plain code, for tests: round to nearest even, NaN kept quiet.
#[cfg(test)]
pub(crate) fn round_bf16(v: f32) -> f32 {
    let b = v.to_bits();
    if v.is_nan() {
        return f32::from_bits((b | 0x0040_0000) & 0xffff_0000);
    }
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    f32::from_bits(r & 0xffff_0000)
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use std::arch::x86_64::*;

    use super::super::dot::avx512::{b8x16, u5x32};
    use super::super::table::{Scale, with_table, x86::get};
    use super::super::{Codes, Offsets, QMatrix};
    use super::{MR, TILE};

    /// The codes' kinds, as [`pair`]'s const parameter.
    const U8: u8 = 0;
    const I8: u8 = 1;
    const U4: u8 = 2;
    const U5: u8 = 3;
    /// The offsets' kinds: none, `−zero · scale`, one per group.
    const NO_OFFSET: u8 = 0;
    const ZERO_POINT: u8 = 1;
    const PER_GROUP: u8 = 2;

    /// A weight matrix's raw parts, read by [`pair`]; scales and offsets of element `T`.
    struct Parts<T> {
        codes: *const u8,
        scales: *const T,
        offsets: *const T,
        zero: f32,
        groups_per_row: usize,
        cols: usize,
    }
    impl<T> Clone for Parts<T> {
        fn clone(&self) -> Self {
            *self
        }
    }
    impl<T> Copy for Parts<T> {}

    /// Columns `c..c + 32` of row `r` dequantized (`c` a multiple of 32; the upper 16 zero
    /// past the last column), for codes of kind `K`, groups of `G` and offsets of kind `O`
    /// known at compile time: no per-piece dispatch, one load per group.
    #[inline(always)]
    unsafe fn pair<const K: u8, const G: usize, const O: u8, T: Scale>(
        w: Parts<T>,
        r: usize,
        c: usize,
    ) -> (__m512, __m512) {
        unsafe {
            let gi = r * w.groups_per_row + c / G;
            let whole = c + 16 < w.cols;
            // The same columns 16 rows on (the next block of the tile, or the next tile's first):
            // each block walks 16 rows at once, more streams than the hardware prefetcher follows.
            let ahead = |p: *const u8, row_bytes: usize| {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * row_bytes) as *const i8)
            };
            ahead(w.scales.add(gi) as *const u8, T::BYTES * w.groups_per_row);
            if O == PER_GROUP {
                ahead(w.offsets.add(gi) as *const u8, T::BYTES * w.groups_per_row);
            }
            let (lo, hi) = match K {
                U4 => {
                    // Group of 32 in 16 bytes: columns 0..16 in the low nibbles, 16..32 high.
                    ahead(w.codes.add(gi * 16), w.cols / 2);
                    let v = _mm_loadu_si128(w.codes.add(gi * 16) as *const __m128i);
                    let m = _mm_set1_epi8(15);
                    (
                        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, m))),
                        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), m))),
                    )
                }
                U5 => {
                    ahead(w.codes.add(gi * 20), w.cols / 32 * 20);
                    u5x32(w.codes.add(gi * 20))
                }
                _ => {
                    let at = w.codes.add(r * w.cols + c);
                    ahead(at, w.cols);
                    let hi = if !whole {
                        _mm512_setzero_ps()
                    } else if K == I8 {
                        b8x16::<true>(at.add(16))
                    } else {
                        b8x16::<false>(at.add(16))
                    };
                    (if K == I8 { b8x16::<true>(at) } else { b8x16::<false>(at) }, hi)
                }
            };
            let scaled = |x: __m512, g: usize| {
                let s = get(w.scales.add(g));
                let off = match O {
                    NO_OFFSET => 0.0,
                    ZERO_POINT => -w.zero * s,
                    _ => get(w.offsets.add(g)),
                };
                _mm512_fmadd_ps(x, _mm512_set1_ps(s), _mm512_set1_ps(off))
            };
            let hi = if !whole {
                _mm512_setzero_ps()
            } else {
                scaled(hi, if G == 16 { gi + 1 } else { gi })
            };
            (scaled(lo, gi), hi)
        }
    }

    /// [`pack`] of a weight tile with [`pair`] for its codes, group and offsets.
    #[inline(always)]
    unsafe fn pack_weights<const K: u8, const G: usize, T: Scale>(
        q: &QMatrix,
        w: Parts<T>,
        r0: usize,
        tile: &mut [u32],
    ) {
        unsafe {
            let live = TILE.min(q.rows - r0);
            match q.offsets {
                Offsets::None => pack(live, q.cols, tile, |l, c| pair::<K, G, NO_OFFSET, T>(w, r0 + l, c)),
                Offsets::Zero(_) => pack(live, q.cols, tile, |l, c| pair::<K, G, ZERO_POINT, T>(w, r0 + l, c)),
                Offsets::PerGroup(_) => pack(live, q.cols, tile, |l, c| pair::<K, G, PER_GROUP, T>(w, r0 + l, c)),
            }
        }
    }

    /// `out[j][i] = a[i][j]` for a 16 × 16 matrix of 32-bit values in place.
    #[inline(always)]
    pub(in crate::quant) unsafe fn transpose16(a: &mut [__m512i; 16]) {
        unsafe {
            let mut t = [_mm512_setzero_si512(); 16];
            for k in 0..8 {
                t[2 * k] = _mm512_unpacklo_epi32(a[2 * k], a[2 * k + 1]);
                t[2 * k + 1] = _mm512_unpackhi_epi32(a[2 * k], a[2 * k + 1]);
            }
            // u[4k + m], lane L: column 4L + m of rows 4k..4k + 4.
            let mut u = [_mm512_setzero_si512(); 16];
            for k in 0..4 {
                u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
                u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
                u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
                u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
            }
            for m in 0..4 {
                let x0 = _mm512_shuffle_i32x4::<0x88>(u[m], u[4 + m]);
                let x1 = _mm512_shuffle_i32x4::<0xDD>(u[m], u[4 + m]);
                let y0 = _mm512_shuffle_i32x4::<0x88>(u[8 + m], u[12 + m]);
                let y1 = _mm512_shuffle_i32x4::<0xDD>(u[8 + m], u[12 + m]);
                a[m] = _mm512_shuffle_i32x4::<0x88>(x0, y0);
                a[4 + m] = _mm512_shuffle_i32x4::<0x88>(x1, y1);
                a[8 + m] = _mm512_shuffle_i32x4::<0xDD>(x0, y0);
                a[12 + m] = _mm512_shuffle_i32x4::<0xDD>(x1, y1);
            }
        }
    }

    /// See [`super::pack_tile`].
    #[target_feature(enable = "avx512f,avx512bf16,f16c")]
    pub(super) unsafe fn pack_tile(q: &QMatrix, r0: usize, tile: &mut [u32]) {
        // SAFETY: a QMatrix holds rows · cols codes in its kind's layout and a scale (and
        // offset) per group, both of one element type; U4 and U5 come in groups of 32, bytes in
        // groups of 16 or 32.
        unsafe { with_table!(&q.scales, s => pack_typed(q, s, r0, tile)) }
    }

    #[inline(always)]
    unsafe fn pack_typed<T: Scale>(q: &QMatrix, scales: &[T], r0: usize, tile: &mut [u32]) {
        let offsets = match &q.offsets {
            Offsets::PerGroup(t) => T::values(t).as_ptr(),
            _ => std::ptr::null(),
        };
        let w = Parts {
            codes: match &q.codes {
                Codes::U8(c) | Codes::U4(c) | Codes::U5(c) => c.as_ptr(),
                Codes::I8(c) => c.as_ptr() as *const u8,
            },
            scales: scales.as_ptr(),
            offsets,
            zero: match q.offsets {
                Offsets::Zero(z) => z,
                _ => 0.0,
            },
            groups_per_row: q.cols / q.group,
            cols: q.cols,
        };
        unsafe {
            match (&q.codes, q.group) {
                (Codes::U4(_), _) => pack_weights::<U4, 32, T>(q, w, r0, tile),
                (Codes::U5(_), _) => pack_weights::<U5, 32, T>(q, w, r0, tile),
                (Codes::U8(_), 16) => pack_weights::<U8, 16, T>(q, w, r0, tile),
                (Codes::U8(_), _) => pack_weights::<U8, 32, T>(q, w, r0, tile),
                (Codes::I8(_), 16) => pack_weights::<I8, 16, T>(q, w, r0, tile),
                (Codes::I8(_), _) => pack_weights::<I8, 32, T>(q, w, r0, tile),
            }
        }
    }

    /// Rows `r0..r0 + 48` (those below `n`) of f32 rows at `stride`, see [`super::pack_rows`].
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn pack_f32_tile(src: &[f32], stride: usize, r0: usize, n: usize, cols: usize, tile: &mut [u32]) {
        unsafe {
            let base = src.as_ptr();
            pack(TILE.min(n - r0), cols, tile, |l, c| {
                let row = base.add((r0 + l) * stride + c);
                // 16 rows on, as the weights' pack does.
                let ahead = row.wrapping_add(16 * stride);
                _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(16) as *const i8);
                let hi = if c + 16 < cols {
                    _mm512_loadu_ps(row.add(16))
                } else {
                    _mm512_setzero_ps()
                };
                (_mm512_loadu_ps(row), hi)
            })
        }
    }

    /// See [`super::pack_pairs_tile`]: `live` rows from `r0`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_pairs_tile(
        data: &[u32],
        (pairs, stride): (usize, usize),
        live: usize,
        r0: usize,
        tile: &mut [u32],
    ) {
        unsafe {
            for l0 in (0..live).step_by(16) {
                let nl = 16.min(live - l0);
                let rows_mask = ((1u32 << nl) - 1) as __mmask16;
                for p0 in (0..pairs).step_by(16) {
                    let np = 16.min(pairs - p0);
                    let pair_mask = ((1u32 << np) - 1) as __mmask16;
                    let mut v = [_mm512_setzero_si512(); 16];
                    for (i, vi) in v[..nl].iter_mut().enumerate() {
                        let src = data.as_ptr().add((r0 + l0 + i) * stride + p0);
                        *vi = _mm512_maskz_loadu_epi32(pair_mask, src as *const i32);
                    }
                    transpose16(&mut v);
                    for (j, &vj) in v[..np].iter().enumerate() {
                        let dst = tile.as_mut_ptr().add((p0 + j) * TILE + l0);
                        _mm512_mask_storeu_epi32(dst as *mut i32, rows_mask, vj);
                    }
                }
            }
        }
    }

    /// Tile rows `live`, `cols` columns; `pair(l, c)` gives columns `c..c + 32` of tile row `l`
    /// (zeros past `cols`).
    #[inline(always)]
    unsafe fn pack(live: usize, cols: usize, tile: &mut [u32], pair: impl Fn(usize, usize) -> (__m512, __m512)) {
        unsafe {
            let pairs = cols / 2;
            debug_assert!(tile.len() >= pairs * TILE);
            for l0 in (0..live).step_by(16) {
                let nl = 16.min(live - l0);
                let mask = ((1u32 << nl) - 1) as __mmask16;
                for c0 in (0..cols).step_by(32) {
                    let mut v = [_mm512_setzero_si512(); 16];
                    for (i, vi) in v[..nl].iter_mut().enumerate() {
                        let (lo, hi) = pair(l0 + i, c0);
                        *vi = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
                    }
                    transpose16(&mut v);
                    for (j, &vj) in v[..16.min(pairs - c0 / 2)].iter().enumerate() {
                        let dst = tile.as_mut_ptr().add((c0 / 2 + j) * TILE + l0);
                        _mm512_mask_storeu_epi32(dst as *mut i32, mask, vj);
                    }
                }
            }
        }
    }

    /// Columns `d0..d0 + 48` (those below `cols`) of rows `0..n` as pairs of rows, see
    /// [`super::pack_value_pairs`].
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_value_tile(
        src: &[f32],
        stride: usize,
        n: usize,
        d0: usize,
        cols: usize,
        tile: &mut [u32],
    ) {
        unsafe {
            // [a0..a15, b0..b15] -> [a0, b0, a1, b1, ..]
            let idx = _mm512_set_epi16(
                31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                17, 1, 16, 0,
            );
            let base = src.as_ptr();
            let groups = (TILE.min(cols - d0)) / 16;
            for p in 0..n.div_ceil(2) {
                let (r, r1) = (2 * p, 2 * p + 1);
                for j in 0..groups {
                    let d = d0 + 16 * j;
                    let a = _mm512_loadu_ps(base.add(r * stride + d));
                    let b = if r1 < n {
                        _mm512_loadu_ps(base.add(r1 * stride + d))
                    } else {
                        _mm512_setzero_ps()
                    };
                    let v = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(b, a));
                    let v = _mm512_permutexvar_epi16(idx, v);
                    _mm512_storeu_si512(tile.as_mut_ptr().add(p * TILE + 16 * j) as *mut _, v);
                }
            }
        }
    }

    /// `out[i]` = bf16(x[2i]) | bf16(x[2i + 1]) << 16, round to nearest even.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn round_pairs(x: &[f32], out: &mut [u32]) {
        unsafe {
            let whole = x.len() / 32 * 32;
            for i in (0..whole).step_by(32) {
                let lo = _mm512_loadu_ps(x.as_ptr().add(i));
                let hi = _mm512_loadu_ps(x.as_ptr().add(i + 16));
                // Elements of the second operand go to the low half.
                let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(out.as_mut_ptr().add(i / 2) as *mut _, v);
            }
            let rest = x.len() - whole;
            if rest > 0 {
                let mut buf = [0f32; 32];
                buf[..rest].copy_from_slice(&x[whole..]);
                let lo = _mm512_loadu_ps(buf.as_ptr());
                let hi = _mm512_loadu_ps(buf.as_ptr().add(16));
                let v: [u32; 16] = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                out[whole / 2..].copy_from_slice(&v[..rest / 2]);
            }
        }
    }

    /// One tile's operands: `a` input pairs (row stride `lda`), `b` packed weight pairs (`[kc][48]`),
    /// `c` the output (row stride `ldc`), its first `width` columns written (`acc`: added to).
    #[derive(Clone, Copy)]
    pub(super) struct Tile {
        pub(super) a: *const u32,
        pub(super) lda: usize,
        pub(super) b: *const u32,
        pub(super) kc: usize,
        pub(super) c: *mut f32,
        pub(super) ldc: usize,
        pub(super) width: usize,
        pub(super) acc: bool,
    }

    impl Tile {
        /// The tile for `m` input rows (1..=8), dispatched on them and the weight vectors (1..=3).
        #[target_feature(enable = "avx512f,avx512bf16")]
        pub(super) unsafe fn run_rows(self, m: usize) {
            let t = self;
            debug_assert!((1..=MR).contains(&m) && (1..=TILE).contains(&t.width));
            unsafe {
                match (m, t.width.div_ceil(16)) {
                    (8, 3) => t.run::<8, 3>(),
                    (8, 2) => t.run::<8, 2>(),
                    (8, _) => t.run::<8, 1>(),
                    (7, 3) => t.run::<7, 3>(),
                    (6, 3) => t.run::<6, 3>(),
                    (5, 3) => t.run::<5, 3>(),
                    (4, 3) => t.run::<4, 3>(),
                    (3, 3) => t.run::<3, 3>(),
                    (2, 3) => t.run::<2, 3>(),
                    (1, 3) => t.run::<1, 3>(),
                    (m, nb) => t.slow(m, nb),
                }
            }
        }

        /// The lanes of vector `j` that hold columns of the output.
        #[inline(always)]
        fn mask(&self, j: usize) -> __mmask16 {
            let live = self.width.saturating_sub(16 * j).min(16);
            ((1u32 << live) - 1) as __mmask16
        }

        #[inline(always)]
        unsafe fn run<const M: usize, const NB: usize>(&self) {
            unsafe {
                let mut c = [[_mm512_setzero_ps(); NB]; M];
                if self.acc {
                    for (i, ci) in c.iter_mut().enumerate() {
                        for (j, cij) in ci.iter_mut().enumerate() {
                            *cij = _mm512_maskz_loadu_ps(self.mask(j), self.c.add(i * self.ldc + 16 * j));
                        }
                    }
                }
                for p in 0..self.kc {
                    let bp = self.b.add(p * TILE);
                    let mut bv = [_mm512_setzero_ps(); NB];
                    for (j, v) in bv.iter_mut().enumerate() {
                        *v = _mm512_loadu_ps(bp.add(16 * j) as *const f32);
                    }
                    for (i, ci) in c.iter_mut().enumerate() {
                        let av = _mm512_set1_epi32(*self.a.add(i * self.lda + p) as i32);
                        let av: __m512bh = std::mem::transmute(av);
                        for (cij, &v) in ci.iter_mut().zip(&bv) {
                            *cij = _mm512_dpbf16_ps(*cij, av, std::mem::transmute::<__m512, __m512bh>(v));
                        }
                    }
                }
                for (i, ci) in c.iter().enumerate() {
                    for (j, &cij) in ci.iter().enumerate() {
                        _mm512_mask_storeu_ps(self.c.add(i * self.ldc + 16 * j), self.mask(j), cij);
                    }
                }
            }
        }

        /// Edge tiles (fewer input rows and a narrow last weight tile): one row at a time.
        #[inline(always)]
        unsafe fn slow(&self, m: usize, nb: usize) {
            for i in 0..m {
                let row = Tile {
                    a: self.a.wrapping_add(i * self.lda),
                    c: self.c.wrapping_add(i * self.ldc),
                    ..*self
                };
                unsafe {
                    match nb {
                        3 => row.run::<1, 3>(),
                        2 => row.run::<1, 2>(),
                        _ => row.run::<1, 1>(),
                    }
                }
            }
        }
    }
}
