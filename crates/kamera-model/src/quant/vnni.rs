//! Decode products with int8 activations, after llama.cpp: the input row is quantized once per
//! product to int8 (`x ≈ dx_b · q`, `dx_b = max|x_b| / 127`), and `Σ code · q` is an integer
//! dot product (AVX512-VNNI `vpdpbusd`, 64 codes per instruction) whose 16 lanes of 4 products
//! each are scaled by their group's `scale` and their block's `dx` before they are summed.
//! Against the f32 path (`dot.rs`), which converts every code to f32, this halves the
//! instructions per weight; the price is the rounding of `x` (its KL is printed by `kamera
//! bench model`). The offsets' term `offset · Σ x` is taken on the same rounded `x`.
//!
//! Two roundings of `x`. Byte codes read it in blocks of 4 (one lane: every lane is scaled on
//! its own anyway, and 4 values' largest sets a smaller error than 32's). 4- and 5-bit codes
//! read it in blocks of 32, ggml's Q8_0 activations: a group's low and high nibbles then meet
//! one `dx`, so their two `vpdpbusd` sum as integers and one conversion, one scale and one FMA
//! serve 128 codes instead of 64 (`avx512::row_paired`). Streaming from memory on one
//! Zen 4 core (`decode_rows_speed`) Q4_1 went from 26-27 to 31-36 G weights/s and Q4_K from 28-30
//! to 30-35; SmolLM2's decode KL to f32 (Q4_1 codes) from 1.8e-4 to 1.4e-3 nats.

use super::{Codes, QMatrix, U5_GROUP_BYTES};

/// Input values per quantization block: one `vpdpbusd` lane.
const BLOCK: usize = 4;
/// Input values per block of the rounding 4- and 5-bit codes read ([`Q8Input`]'s `wide`): one
/// group, ggml's Q8_0 activations.
const WIDE_BLOCK: usize = 32;
/// Input values per 64-byte step of the kernel.
const STEP: usize = 64;
/// Input values per chunk of the paired 4- and 5-bit kernels: four groups of 32.
const CHUNK: usize = 128;

/// An input row quantized for [`code_rows`]: zero-padded to whole 64-value steps. Two
/// roundings: in blocks of 4 (`fine`, what byte codes read) and in blocks of 32 (`wide`, what
/// 4- and 5-bit codes read, so that a group's low- and high-nibble products share one `dx` and
/// are summed as integers: `avx512::row_paired`), each made only where a matrix reads it
/// ([`Q8Input::fill`]); the buffers are kept from one fill to the next (a decode step fills one
/// per product phase and layer, and allocating them there showed as malloc-lock waits between
/// the team's workers).
#[derive(Debug, Default)]
pub(crate) struct Q8Input {
    fine: Form,
    wide: Form,
    /// `wide`'s values in the paired kernels' order: per chunk of four groups, the first 16
    /// values of each group, then the last 16 of each (each group's low nibbles, then its high
    /// ones); padded to whole chunks with zeros.
    paired: Vec<i8>,
    /// Per chunk, 16 lanes: lane `l` is group `l / 4`'s `dx` (zeros past the row).
    paired_dx: Vec<f32>,
    /// Values of the unpadded row.
    cols: usize,
}

/// One rounding of the input, in its order: `x ≈ dx_b · q` per block.
#[derive(Debug, Default)]
pub(crate) struct Form {
    /// `round(x / dx)` per block (ties to even), in −127..=127.
    q: Vec<i8>,
    /// Each block's `dx`, per lane of 4 values (16 per 64-value step: the kernel's lanes).
    dxv: Vec<f32>,
    /// Per step, 16 lanes: 128 · the sum of the 4 values of `q` each `vpdpbusd` lane reads
    /// (signed codes are offset by 128 to be read as unsigned; this takes it off again).
    lane128: Vec<i32>,
    /// Whether the last fill made this rounding.
    filled: bool,
}

impl Form {
    /// `x` rounded in blocks of `block`, zero-padded to `padded` values.
    fn fill(&mut self, x: &[f32], block: usize, padded: usize) {
        self.dxv.clear();
        self.dxv.resize(padded / BLOCK, 0.0);
        self.q.clear();
        self.q.resize(padded, 0);
        self.lane128.clear();
        self.lane128.resize(padded / BLOCK, 0);
        quantize_into(x, block, &mut self.q, &mut self.dxv, &mut self.lane128);
        self.filled = true;
    }

    /// `Σ dx · q` over each `group` (16 or 32) of the row's `cols` values.
    fn group_sums(&self, cols: usize, group: usize) -> Vec<f32> {
        let lanes = cols / BLOCK;
        self.lane128[..lanes]
            .chunks_exact(group / BLOCK)
            .zip(self.dxv[..lanes].chunks_exact(group / BLOCK))
            .map(|(l, dx)| l.iter().zip(dx).map(|(&l, dx)| dx * (l / 128) as f32).sum())
            .collect()
    }
}

/// `f` (of blocks of `block`) where the last fill made it.
fn made(f: &Form, block: usize) -> &Form {
    assert!(
        f.filled,
        "the int8 input was not rounded in blocks of {block} for these codes"
    );
    f
}

/// Whether `m`'s codes read the input rounded in blocks of 32 (4- and 5-bit codes).
fn reads_wide(m: &QMatrix) -> bool {
    matches!(m.codes, Codes::U4(_) | Codes::U5(_))
}

impl Q8Input {
    /// `x` quantized in both roundings; `None` unless its length is whole groups of 32.
    #[cfg(test)]
    pub(crate) fn quantize(x: &[f32]) -> Option<Q8Input> {
        let mut q = Q8Input::default();
        q.fill(x, true, true).then_some(q)
    }

    /// `x` quantized into this input's buffers in the roundings asked for (`fine`: blocks of
    /// 4, `wide`: of 32; [`Q8Input::needs`] says which a set of matrices reads); false (and
    /// nothing filled) unless its length is whole groups of 32 (every quantized matrix's rows
    /// but a few with groups of 16, which then run in f32).
    pub(crate) fn fill(&mut self, x: &[f32], fine: bool, wide: bool) -> bool {
        self.fine.filled = false;
        self.wide.filled = false;
        self.cols = 0;
        if x.is_empty() || x.len() % WIDE_BLOCK != 0 {
            return false;
        }
        let padded = x.len().next_multiple_of(STEP);
        if fine {
            self.fine.fill(x, BLOCK, padded);
        }
        if wide {
            self.wide.fill(x, WIDE_BLOCK, padded);
            let chunks = x.len().div_ceil(CHUNK);
            self.paired.clear();
            self.paired.resize(chunks * CHUNK, 0);
            self.paired_dx.clear();
            self.paired_dx.resize(chunks * 16, 0.0);
            for (gi, (q, dx)) in self.wide.q[..x.len()]
                .chunks_exact(WIDE_BLOCK)
                .zip(self.wide.dxv.iter().step_by(WIDE_BLOCK / BLOCK))
                .enumerate()
            {
                let (c, j) = (gi / 4, gi % 4);
                let at = c * CHUNK + 16 * j;
                self.paired[at..at + 16].copy_from_slice(&q[..16]);
                self.paired[at + 64..at + 80].copy_from_slice(&q[16..]);
                self.paired_dx[c * 16 + 4 * j..c * 16 + 4 * j + 4].fill(*dx);
            }
        }
        self.cols = x.len();
        true
    }

    /// Which roundings (`fine`, `wide`) the int8 kernel reads for `ms`.
    pub(crate) fn needs<'a>(ms: impl IntoIterator<Item = &'a QMatrix>) -> (bool, bool) {
        ms.into_iter()
            .filter(|m| reads(m))
            .fold((false, false), |(f, w), m| (f || !reads_wide(m), w || reads_wide(m)))
    }

    /// The rounding `m`'s codes read: blocks of 32 for 4- and 5-bit codes, of 4 for bytes.
    ///
    /// # Panics
    /// Where the last [`Q8Input::fill`] did not make it (the kernels read it through pointers).
    pub(crate) fn form(&self, m: &QMatrix) -> &Form {
        if reads_wide(m) {
            made(&self.wide, WIDE_BLOCK)
        } else {
            made(&self.fine, BLOCK)
        }
    }

    /// `Σ dx · q` over each of `m`'s groups, on the rounding its codes read: the offsets' input
    /// sums, taken from the quantized row so that an offset and its codes see the same input
    /// (Q4_0's `scale · (code − 8)`: an exact sum beside a rounded code term would not cancel).
    pub(crate) fn group_sums(&self, m: &QMatrix) -> Vec<f32> {
        self.form(m).group_sums(self.cols, m.group)
    }

    /// Each lane's `128 · Σ q` in the rounding `m` reads (for tests).
    #[cfg(test)]
    pub(crate) fn lanes128(&self, m: &QMatrix) -> &[i32] {
        &self.form(m).lane128[..self.cols / BLOCK]
    }

    /// The dequantized value `i` in the rounding `m` reads (for tests).
    #[cfg(test)]
    pub(crate) fn value(&self, m: &QMatrix, i: usize) -> f32 {
        let f = self.form(m);
        f.q[i] as f32 * f.dxv[i / BLOCK]
    }
}

/// Fills `q`, `dxv` (per lane of 4) and `lane128` for `x` (whole groups of 32) rounded in
/// blocks of `block` (4 or 32): AVX-512 where the CPU has it, else [`quantize_portable`]; the
/// same bits either way.
fn quantize_into(x: &[f32], block: usize, q: &mut [i8], dxv: &mut [f32], lane128: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU has AVX-512 F/BW; x is whole groups of 32 and the outputs are sized
        // for its padded length.
        return unsafe {
            if block == BLOCK {
                avx512::quantize(x, q, dxv, lane128)
            } else {
                avx512::quantize32(x, q, dxv, lane128)
            }
        };
    }
    quantize_portable(x, block, q, dxv, lane128)
}

/// [`Q8Input::quantize`]'s loop in plain code (the AVX-512 one gives the same bits): each
/// block's `dx = max|x| / 127`, `q = round(x · (1 / dx))` with ties to even, and per lane of 4
/// its block's `dx` and `128 · Σ q`.
pub(crate) fn quantize_portable(x: &[f32], block: usize, q: &mut [i8], dxv: &mut [f32], lane128: &mut [i32]) {
    for ((xb, qb), (dxb, lb)) in x.chunks_exact(block).zip(q.chunks_exact_mut(block)).zip(
        dxv.chunks_exact_mut(block / BLOCK)
            .zip(lane128.chunks_exact_mut(block / BLOCK)),
    ) {
        let dx = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        let inv = if dx > 0.0 { 1.0 / dx } else { 0.0 };
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
        dxb.fill(dx);
        for (l, ql) in lb.iter_mut().zip(qb.chunks_exact(BLOCK)) {
            *l = 128 * ql.iter().map(|&v| v as i32).sum::<i32>();
        }
    }
}

/// Whether the kernel reads `m`'s codes: 4- and 5-bit codes in groups of 32, bytes in groups of
/// 16 or 32.
pub(crate) fn reads(m: &QMatrix) -> bool {
    match m.codes {
        Codes::U4(_) | Codes::U5(_) => m.group == 32,
        Codes::U8(_) | Codes::I8(_) => m.group == 32 || m.group == 16,
    }
}

/// Whether this CPU has AVX-512 F/BW and VNNI (`vpdpbusd`).
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// Whether this CPU runs an int8 kernel: AVX512-VNNI, or AVX2 + FMA.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_vnni() || super::avx2::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[i] = Σ_g scale_g · Σ_{i∈g} code_i · dx_i q_i` over rows `r0 + i` of `m` (≈ the rows'
/// `Σ_g scale_g Σ code_i x_i`), plus the offsets' term on `xsum` ([`Q8Input::group_sums`];
/// none where it is empty). The caller checked [`available`] and that `x` has `m.cols` values.
pub(crate) fn code_rows(m: &QMatrix, r0: usize, x: &Q8Input, xsum: &[f32], out: &mut [f32]) {
    // The kernels read through pointers: a caller's shape error stops here, not in memory.
    assert!(
        x.cols == m.cols && r0 + out.len() <= m.rows,
        "rows {r0}..{} of a [{}, {}] matrix against an int8 input of {}",
        r0 + out.len(),
        m.rows,
        m.cols,
        x.cols
    );
    x.form(m); // asserts the rounding these codes read was made
    #[cfg(target_arch = "x86_64")]
    {
        if has_vnni() {
            // SAFETY: the CPU has AVX-512 F/BW and VNNI; rows r0.. of `m` (checked above) and
            // `x` is padded to whole 64-value steps.
            unsafe { avx512::code_rows(m, r0, x, xsum, out) };
            return;
        }
        // SAFETY: the caller checked `available()`, so without VNNI the CPU has AVX2 + FMA;
        // bounds as above.
        unsafe { super::avx2_int8::code_rows(m, r0, x, xsum, out) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (i, o) in out.iter_mut().enumerate() {
        *o = reference(m, r0 + i, x)
            + if xsum.is_empty() {
                0.0
            } else {
                super::dot::offset_dot(m, r0 + i, xsum)
            };
    }
}

/// [`code_rows`] as a VNNI CPU without VBMI runs it (5-bit codes by the byte-step rows), for
/// tests on CPUs that have VBMI; false where the CPU has no VNNI.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn code_rows_without_vbmi(m: &QMatrix, r0: usize, x: &Q8Input, xsum: &[f32], out: &mut [f32]) -> bool {
    assert!(
        x.cols == m.cols && r0 + out.len() <= m.rows,
        "rows and input of the matrix"
    );
    x.form(m);
    if !has_vnni() {
        return false;
    }
    // SAFETY: the CPU has AVX-512 F/BW and VNNI; bounds checked above.
    unsafe { avx512::code_rows_steps(m, r0, x, xsum, out) };
    true
}

/// The parts of a [`Q8Input`] a kernel reads for `m`: the rounded values, each lane's `dx`.
#[cfg(target_arch = "x86_64")]
pub(super) fn parts<'a>(x: &'a Q8Input, m: &QMatrix) -> (&'a [i8], &'a [f32]) {
    let f = x.form(m);
    (&f.q, &f.dxv)
}

/// The paired input (`Q8Input::paired`, `paired_dx`) the 4-bit kernels read.
#[cfg(target_arch = "x86_64")]
pub(super) fn paired(x: &Q8Input) -> (*const i8, *const f32) {
    made(&x.wide, WIDE_BLOCK);
    (x.paired.as_ptr(), x.paired_dx.as_ptr())
}

/// [`code_rows`] for one row in plain integer loops: the reference the kernel is tested against.
#[cfg(any(test, not(target_arch = "x86_64")))]
pub(crate) fn reference(m: &QMatrix, r: usize, x: &Q8Input) -> f32 {
    let (g, gpr) = (m.group, m.cols / m.group);
    let x = x.form(m);
    let mut total = 0f32;
    for j in 0..gpr {
        let gi = r * gpr + j;
        let mut dot = 0f32;
        for t in 0..g {
            let code = match &m.codes {
                Codes::U8(c) => c[gi * g + t] as i32,
                Codes::I8(c) => c[gi * g + t] as i32,
                Codes::U4(c) => {
                    let b = c[gi * 16 + t % 16];
                    (if t < 16 { b & 15 } else { b >> 4 }) as i32
                }
                Codes::U5(c) => super::u5_code(&c[gi * U5_GROUP_BYTES..(gi + 1) * U5_GROUP_BYTES], t) as i32,
            };
            let i = j * g + t;
            dot += (code * x.q[i] as i32) as f32 * x.dxv[i / BLOCK];
        }
        total += m.scales.get(gi) * dot;
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::super::avx2::{I8, PREFETCH_ROWS, U4, U5, U8, by_kind, group_bytes, prefetch_row};
    use super::super::table::{Scale, with_table, x86::RowOffsets, x86::load16};
    use super::{Codes, Q8Input, QMatrix, U5_GROUP_BYTES};

    /// [`Q8Input::quantize`]'s loop, 16 values (4 blocks) at a time: the same operations, so
    /// the same bits (the blocks' largest magnitude, `dx = max / 127`, `round(x · (1 / dx))`
    /// with ties to even, clamped), and each block's `128 · Σ q`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW; `x.len()` is a multiple of 16; `q`, `dxv` and `lane128` hold
    /// at least `x.len()`, `x.len() / 4` and `x.len() / 4` values.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn quantize(x: &[f32], q: &mut [i8], dxv: &mut [f32], lane128: &mut [i32]) {
        unsafe {
            debug_assert!(x.len() % 16 == 0 && q.len() >= x.len() && 4 * dxv.len() >= x.len());
            let (lim, zero) = (_mm512_set1_ps(127.0), _mm512_setzero_ps());
            for i in (0..x.len()).step_by(16) {
                let v = _mm512_loadu_ps(x.as_ptr().add(i));
                // abs, not andnot (AVX512DQ: outside these features, it would stay a call).
                let a = _mm512_abs_ps(v);
                // Each lane the largest of its block of 4 (swap pairs, then halves).
                let m = _mm512_max_ps(a, _mm512_permute_ps::<0b1011_0001>(a));
                let m = _mm512_max_ps(m, _mm512_permute_ps::<0b0100_1110>(m));
                let dx = _mm512_div_ps(m, lim);
                let inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(dx, zero), _mm512_set1_ps(1.0), dx);
                let r =
                    _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(v, inv));
                let r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0)), lim);
                let qi = _mm512_cvtps_epi32(r);
                _mm_storeu_si128(q.as_mut_ptr().add(i) as *mut __m128i, _mm512_cvtepi32_epi8(qi));
                let s = _mm512_add_epi32(qi, _mm512_shuffle_epi32::<0b1011_0001>(qi));
                let s = _mm512_add_epi32(s, _mm512_shuffle_epi32::<0b0100_1110>(s));
                let b = i / 4;
                _mm512_mask_compressstoreu_ps(dxv.as_mut_ptr().add(b), 0x1111, dx);
                _mm512_mask_compressstoreu_epi32(lane128.as_mut_ptr().add(b), 0x1111, _mm512_slli_epi32::<7>(s));
            }
        }
    }

    /// [`super::quantize_portable`] in blocks of 32, a block (two registers) at a time: the
    /// same operations, so the same bits; each lane's `dx` and `128 · Σ q` of its 4 values.
    ///
    /// # Safety
    /// As [`quantize`], with `x.len()` a multiple of 32.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn quantize32(x: &[f32], q: &mut [i8], dxv: &mut [f32], lane128: &mut [i32]) {
        unsafe {
            debug_assert!(x.len() % 32 == 0 && q.len() >= x.len() && 4 * dxv.len() >= x.len());
            let lim = _mm512_set1_ps(127.0);
            for i in (0..x.len()).step_by(32) {
                let (v0, v1) = (
                    _mm512_loadu_ps(x.as_ptr().add(i)),
                    _mm512_loadu_ps(x.as_ptr().add(i + 16)),
                );
                let m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
                let dx = m / 127.0;
                let inv = _mm512_set1_ps(if dx > 0.0 { 1.0 / dx } else { 0.0 });
                for (h, v) in [(0, v0), (16, v1)] {
                    let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
                        v, inv,
                    ));
                    let r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0)), lim);
                    let qi = _mm512_cvtps_epi32(r);
                    _mm_storeu_si128(q.as_mut_ptr().add(i + h) as *mut __m128i, _mm512_cvtepi32_epi8(qi));
                    let s = _mm512_add_epi32(qi, _mm512_shuffle_epi32::<0b1011_0001>(qi));
                    let s = _mm512_add_epi32(s, _mm512_shuffle_epi32::<0b0100_1110>(s));
                    _mm512_mask_compressstoreu_epi32(
                        lane128.as_mut_ptr().add((i + h) / 4),
                        0x1111,
                        _mm512_slli_epi32::<7>(s),
                    );
                }
                _mm256_storeu_ps(dxv.as_mut_ptr().add(i / 4), _mm256_set1_ps(dx));
            }
        }
    }

    /// The low nibbles of 2 x 16 bytes `[a, b]` then their high nibbles, as
    /// `[a & 15, a >> 4, b & 15, b >> 4]`: two groups' 4-bit codes in order.
    #[inline(always)]
    unsafe fn nibbles(ab: __m256i) -> __m512i {
        unsafe {
            let z = _mm512_shuffle_i64x2::<0x50>(_mm512_castsi256_si512(ab), _mm512_castsi256_si512(ab));
            let z = _mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
            _mm512_and_si512(z, _mm512_set1_epi8(15))
        }
    }

    /// Rows `r0 + i` of `m` into `out[i]` ([`super::code_rows`]): one dispatch for the rows,
    /// each row's bytes asked for [`PREFETCH_ROWS`] ahead, as the AVX2 kernels do. Streaming a
    /// matrix from memory on one Zen 4 core (`decode_rows_speed`): Q5_0 18-21 G weights/s and
    /// Q8_0 12-17, against 13.4 and 8.9 with a call per row that matched the code kind at every
    /// step, kept its accumulators on the stack and prefetched nothing.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW and VNNI; `r0 + out.len() <= m.rows`; `x` has `m.cols` values
    /// (padded to whole 64-value steps).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn code_rows(m: &QMatrix, r0: usize, x: &Q8Input, xsum: &[f32], out: &mut [f32]) {
        unsafe {
            if matches!(m.codes, Codes::U5(_)) && std::arch::is_x86_feature_detected!("avx512vbmi") {
                return code_rows_u5(m, r0, x, xsum, out);
            }
            code_rows_steps(m, r0, x, xsum, out)
        }
    }

    /// [`code_rows`] by [`row`]: every kind but 5-bit codes on CPUs with VBMI.
    ///
    /// # Safety
    /// As [`code_rows`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn code_rows_steps(m: &QMatrix, r0: usize, x: &Q8Input, xsum: &[f32], out: &mut [f32]) {
        unsafe { with_table!(&m.scales, s => by_kind!(&m.codes, rows_kind::<_>(m, s, r0, x, xsum, out))) }
    }

    /// [`code_rows`] for 5-bit codes on CPUs with AVX512-VBMI ([`row_paired`]).
    ///
    /// # Safety
    /// As [`code_rows`], and the CPU has AVX512-VBMI; `m`'s codes are 5-bit.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi")]
    unsafe fn code_rows_u5(m: &QMatrix, r0: usize, x: &Q8Input, xsum: &[f32], out: &mut [f32]) {
        unsafe { with_table!(&m.scales, s => rows_u5(m, s, r0, x, xsum, out)) }
    }

    // This loop is rows_kind's with row_paired::<U5> for the row: not one loop taking the row as a
    // closure, whose intrinsics would stay calls (see avx2_int8.rs).
    #[inline(always)]
    unsafe fn rows_u5<T: Scale>(m: &QMatrix, scales: &[T], r0: usize, x: &Q8Input, xsum: &[f32], out: &mut [f32]) {
        unsafe {
            let offsets = RowOffsets::new(m, scales, xsum);
            for (i, o) in out.iter_mut().enumerate() {
                prefetch_row::<U5>(m, r0 + i + PREFETCH_ROWS);
                *o = row_paired::<U5, T>(m, scales, r0 + i, x) + offsets.avx512(r0 + i);
            }
        }
    }

    #[inline(always)]
    unsafe fn rows_kind<const K: u8, T: Scale>(
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
                prefetch_row::<K>(m, r0 + i + PREFETCH_ROWS);
                *o = row::<K, T>(m, scales, r0 + i, x) + offsets.avx512(r0 + i);
            }
        }
    }

    /// The codes of `groups` groups of `g` from `c` (a whole step: 64 codes) as bytes in the
    /// input's order; the rest of a partial step zeros.
    #[inline(always)]
    unsafe fn step_codes<const K: u8>(c: *const u8, g: usize, groups: usize) -> __m512i {
        unsafe {
            let full = groups * g == 64;
            match K {
                U4 => unreachable!("4-bit codes run in row_paired"),
                U5 => {
                    let a = _mm_loadu_si128(c as *const __m128i);
                    let ha = (c.add(16) as *const u32).read_unaligned() as u64;
                    let (b, hb) = if full {
                        let bt = c.add(U5_GROUP_BYTES);
                        (
                            _mm_loadu_si128(bt as *const __m128i),
                            (bt.add(16) as *const u32).read_unaligned() as u64,
                        )
                    } else {
                        (_mm_setzero_si128(), 0)
                    };
                    let z = nibbles(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b));
                    _mm512_mask_add_epi8(z, ha | hb << 32, z, _mm512_set1_epi8(16))
                }
                _ if full => _mm512_loadu_si512(c as *const _),
                _ => _mm512_maskz_loadu_epi8((1u64 << (groups * g)) - 1, c as *const i8),
            }
        }
    }

    /// Row `r`: each 64-value step's codes times the rounded input by `vpdpbusd`, its 16 lanes
    /// scaled by their group's scale and their block's `dx`; two accumulators in registers.
    #[inline(always)]
    unsafe fn row<const K: u8, T: Scale>(m: &QMatrix, scales: &[T], r: usize, x: &Q8Input) -> f32 {
        unsafe {
            if K == U4 {
                return row_paired::<U4, T>(m, scales, r, x);
            }
            let f = x.form(m);
            let (g, cols) = (m.group, m.cols);
            let gpr = cols / g;
            let gb = group_bytes::<K>(g);
            let per_step = 64 / g;
            let c = super::super::dot::row_codes(m, r).as_ptr();
            let scales = scales.as_ptr().add(r * gpr);
            // The lanes' group: 32-wide groups fill 8 lanes, 16-wide 4.
            let idx = if g == 32 {
                _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
            } else {
                _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
            };
            let at = Step {
                c,
                gb,
                xq: f.q.as_ptr(),
                dxv: f.dxv.as_ptr(),
                lane128: f.lane128.as_ptr(),
                g,
                per_step,
            };
            let mut sc = Scales16 {
                at: scales,
                groups: gpr,
                per_step,
                idx,
                block: _mm512_setzero_ps(),
                lanes: idx,
            };
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            if K == U5 {
                // (5-bit codes on CPUs without VBMI; 4-bit ones returned above.) Whole steps two
                // at a time, then a step of fewer groups: 8% faster than the loop below (Q5_0
                // from memory on one Zen 4 core: 19.2 against 17.7 G weights/s); byte codes 10%
                // slower (Q8_0: 11.4 against 12.7).
                let whole = gpr / per_step;
                let mut p = 0;
                while p + 2 <= whole {
                    let (d0, s0) = at.lanes::<K>(p, per_step, sc.step(p));
                    let (d1, s1) = at.lanes::<K>(p + 1, per_step, sc.step(p + 1));
                    a0 = _mm512_fmadd_ps(d0, s0, a0);
                    a1 = _mm512_fmadd_ps(d1, s1, a1);
                    p += 2;
                }
                if p < whole {
                    let (d, s) = at.lanes::<K>(p, per_step, sc.step(p));
                    a0 = _mm512_fmadd_ps(d, s, a0);
                    p += 1;
                }
                if p * per_step < gpr {
                    let (d, s) = at.lanes::<K>(p, gpr - p * per_step, sc.step(p));
                    a1 = _mm512_fmadd_ps(d, s, a1);
                }
            } else {
                for p in 0..cols.div_ceil(64) {
                    let (d, s) = at.lanes::<K>(p, per_step.min(gpr - p * per_step), sc.step(p));
                    if p % 2 == 0 {
                        a0 = _mm512_fmadd_ps(d, s, a0);
                    } else {
                        a1 = _mm512_fmadd_ps(d, s, a1);
                    }
                }
            }
            _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
        }
    }

    /// Row `r` of 4- or 5-bit codes in groups of 32, four groups (128 codes) a chunk: the
    /// chunk's low nibbles are each group's first 16 codes and its high nibbles the last 16, so
    /// `z & 15` and `(z >> 4) & 15` meet the input in [`Q8Input`]'s paired order, and since the
    /// input is rounded in blocks of one group, lane `l` of both products is group `l / 4`
    /// under one `dx`: the two `vpdpbusd` sum into one register, and one conversion, one scale
    /// and one FMA serve 128 codes (the byte-code loop takes two of each per 128). 5-bit codes
    /// (`Codes::U5`: per group 16 bytes of nibbles as Q4_0's, then 4 bytes of fifth bits) come
    /// out of their 80 bytes by two VBMI byte permutes ([`u5_chunk`]); the caller of that
    /// instance runs with AVX512-VBMI.
    #[inline(always)]
    unsafe fn row_paired<const K: u8, T: Scale>(m: &QMatrix, scales: &[T], r: usize, x: &Q8Input) -> f32 {
        unsafe {
            let gpr = m.cols / 32;
            let c = super::super::dot::row_codes(m, r).as_ptr();
            let (xq, xdx) = (x.paired.as_ptr(), x.paired_dx.as_ptr());
            let mut sc = Scales16 {
                at: scales.as_ptr().add(r * gpr),
                groups: gpr,
                per_step: 4,
                idx: _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                block: _mm512_setzero_ps(),
                lanes: _mm512_setzero_si512(),
            };
            let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for p in 0..gpr.div_ceil(4) {
                // Groups in this chunk: 4, or the row's last 1-3 (bytes past the row not read,
                // their codes zero).
                let groups = (gpr - 4 * p).min(4);
                let (lo, hi) = if K == U4 {
                    u4_chunk(c.add(64 * p), groups)
                } else {
                    u5_chunk(c.add(4 * U5_GROUP_BYTES * p), groups)
                };
                let dp = _mm512_dpbusd_epi32(
                    _mm512_setzero_si512(),
                    lo,
                    _mm512_loadu_si512(xq.add(128 * p) as *const _),
                );
                let dp = _mm512_dpbusd_epi32(dp, hi, _mm512_loadu_si512(xq.add(128 * p + 64) as *const _));
                let s = _mm512_mul_ps(sc.step(p), _mm512_loadu_ps(xdx.add(16 * p)));
                if p % 2 == 0 {
                    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), s, a0);
                } else {
                    a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), s, a1);
                }
            }
            _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
        }
    }

    /// A chunk of `groups ≤ 4` groups of 4-bit codes at `c` (16 bytes a group): its low and
    /// high nibbles as bytes.
    #[inline(always)]
    unsafe fn u4_chunk(c: *const u8, groups: usize) -> (__m512i, __m512i) {
        unsafe {
            let z = if groups == 4 {
                _mm512_loadu_si512(c as *const _)
            } else {
                _mm512_maskz_loadu_epi8((1u64 << (16 * groups)) - 1, c as *const i8)
            };
            let low = _mm512_set1_epi8(15);
            (
                _mm512_and_si512(z, low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(z), low),
            )
        }
    }

    /// A chunk of `groups ≤ 4` groups of 5-bit codes at `c` (20 bytes a group) as
    /// [`u4_chunk`]'s two halves: one `vpermt2b` gathers the 64 nibble bytes out of the 80,
    /// another each group's fifth bits of its first and last 16 codes into two 64-bit masks,
    /// which add 16 to the codes they mark. Needs AVX512-VBMI.
    #[inline(always)]
    unsafe fn u5_chunk(c: *const u8, groups: usize) -> (__m512i, __m512i) {
        unsafe {
            // Byte o of the nibbles: group o / 16's byte o % 16; of the masks, bytes 0-7 each
            // group's bits of codes 0-15 (its bytes 16, 17), bytes 8-15 of codes 16-31 (18, 19).
            let nib = _mm512_set_epi8(
                75, 74, 73, 72, 71, 70, 69, 68, 67, 66, 65, 64, 63, 62, 61, 60, //
                55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, //
                35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, //
                15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0,
            );
            let bits = _mm512_set_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
                79, 78, 59, 58, 39, 38, 19, 18, 77, 76, 57, 56, 37, 36, 17, 16,
            );
            let (a, b) = if groups == 4 {
                (
                    _mm512_loadu_si512(c as *const _),
                    _mm512_maskz_loadu_epi8(0xffff, c.add(64) as *const i8),
                )
            } else {
                let n = U5_GROUP_BYTES * groups; // < 64
                (
                    _mm512_maskz_loadu_epi8((1u64 << n) - 1, c as *const i8),
                    _mm512_setzero_si512(),
                )
            };
            let z = _mm512_permutex2var_epi8(a, nib, b);
            let h = _mm512_castsi512_si128(_mm512_permutex2var_epi8(a, bits, b));
            let (lo_bits, hi_bits) = (_mm_cvtsi128_si64(h) as u64, _mm_extract_epi64::<1>(h) as u64);
            let (low, sixteen) = (_mm512_set1_epi8(15), _mm512_set1_epi8(16));
            let lo = _mm512_and_si512(z, low);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(z), low);
            (
                _mm512_mask_add_epi8(lo, lo_bits, lo, sixteen),
                _mm512_mask_add_epi8(hi, hi_bits, hi, sixteen),
            )
        }
    }

    /// A row's scales for [`row`]'s steps, taken in order: 16 groups at a time into a register
    /// (f16 widened there), each step's lanes permuted out of it: one widening per 16 groups
    /// instead of one per step (on the two-thread model bench Q8_0's int8 decode went from
    /// 0.88-1.03x to 1.07-1.24x llama.cpp's between the runs before and after; the one-core
    /// probe showed no difference, so part of that may be the VM's run-to-run spread).
    struct Scales16<T> {
        at: *const T,
        /// Groups in the row.
        groups: usize,
        per_step: usize,
        /// Each lane's group within its step.
        idx: __m512i,
        block: __m512,
        /// Each lane's group within `block` at the current step.
        lanes: __m512i,
    }

    impl<T: Scale> Scales16<T> {
        /// Step `p`'s scale per lane (`p` one past the last call's, from 0).
        #[inline(always)]
        unsafe fn step(&mut self, p: usize) -> __m512 {
            unsafe {
                let first = p * self.per_step;
                if first % 16 == 0 {
                    self.block = load16(self.at.add(first), (self.groups - first).min(16));
                    self.lanes = self.idx;
                } else {
                    self.lanes = _mm512_add_epi32(self.lanes, _mm512_set1_epi32(self.per_step as i32));
                }
                _mm512_permutexvar_ps(self.lanes, self.block)
            }
        }
    }

    /// One row's pointers for [`row`]'s steps.
    struct Step {
        c: *const u8,
        gb: usize,
        xq: *const i8,
        dxv: *const f32,
        lane128: *const i32,
        g: usize,
        per_step: usize,
    }

    impl Step {
        /// Step `p` (its first `groups` groups, scaled by `sv`): `Σ code · q` per lane as f32,
        /// and each lane's scale (its group's `scale` times its block's `dx`).
        #[inline(always)]
        unsafe fn lanes<const K: u8>(&self, p: usize, groups: usize, sv: __m512) -> (__m512, __m512) {
            unsafe {
                let w = step_codes::<K>(self.c.add(p * self.per_step * self.gb), self.g, groups);
                let xs = _mm512_loadu_si512(self.xq.add(64 * p) as *const _);
                let zero = _mm512_setzero_si512();
                let dp = if K == I8 {
                    // Signed codes + 128 read as unsigned; 128 · Σ q taken off per lane.
                    let w = _mm512_xor_si512(w, _mm512_set1_epi8(-128));
                    let dp = _mm512_dpbusd_epi32(zero, w, xs);
                    _mm512_sub_epi32(dp, _mm512_loadu_si512(self.lane128.add(16 * p) as *const _))
                } else {
                    _mm512_dpbusd_epi32(zero, w, xs)
                };
                (
                    _mm512_cvtepi32_ps(dp),
                    _mm512_mul_ps(sv, _mm512_loadu_ps(self.dxv.add(16 * p))),
                )
            }
        }
    }
}
