//! Weights kept in their GGUF quantisation: every block format is repacked once, exactly, into
//! codes with a scale (and offset) per group of 16 or 32 weights, `w = scale · code + offset`,
//! the scales f16 or f32 as the block holds them (`table.rs`).
//! Decode multiplies on the codes (`dot.rs`), short prefills too (`rows.rs`); long prefills
//! dequantize cache-sized panels into a GEMM (`matmul.rs`), or into bf16 tiles where the CPU
//! has AVX512_BF16 and the model asks for it (`bf16.rs`). Decode may quantize its input row to
//! int8 and multiply with VNNI (`vnni.rs`) or AVX2 (`avx2_int8.rs`); the other code products
//! have AVX2 kernels for hosts without AVX-512 (`avx2.rs`).

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_int8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod bf16;
mod dense;
mod dot;
pub(crate) mod matmul;
mod repack;
mod rows;
pub(crate) mod table;
#[cfg(test)]
mod tests;
mod vnni;

use candle_core::Tensor;

use crate::error::{CandleCtx, Result};

pub(crate) use dense::Bf16Matrix;
#[cfg(target_arch = "x86_64")]
pub(crate) type AlignedPairs = Aligned<u32>;
pub(crate) use repack::repack;
pub(crate) use table::Table;
pub(crate) use vnni::Q8Input;

/// A product's output shared by parallel tasks that each write their own elements (row blocks:
/// a weight row's column; panels: a block of columns).
#[derive(Clone, Copy)]
pub(crate) struct Out(pub(crate) *mut f32);
// SAFETY: every task writes only its own elements of the output, which outlives the tasks.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// Element `i` (a method, so closures capture the whole `Out`, not its raw pointer).
    pub(crate) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// The codes of a [`QMatrix`], row-major, groups contiguous.
#[derive(Debug)]
pub(crate) enum Codes {
    /// One unsigned byte per weight.
    U8(Vec<u8>),
    /// One signed byte per weight (formats with a zero point: the code minus it).
    I8(Vec<i8>),
    /// Two 4-bit codes per byte, groups of 32: byte `j` of a group holds code `j` in its low
    /// nibble and code `j + 16` in its high one (GGUF's Q4_0 / Q4_1 order).
    U4(Vec<u8>),
    /// 5-bit codes 0..=31, groups of 32 in 20 bytes: the low 4 bits as [`Codes::U4`]'s 16
    /// bytes, then a little-endian `u32` whose bit `j` is code `j`'s fifth bit (GGUF's Q5_0 /
    /// Q5_1 order, without the scale).
    U5(Vec<u8>),
}

/// A zeroed buffer that starts on a 64-byte boundary: AMX tile loads from any other alignment
/// run at about a third of the speed (measured on this project's Xeon: 1.1 against 2.8 TFLOP/s a
/// core for L1-resident operands).
#[derive(Debug)]
pub(crate) struct Aligned<T> {
    buf: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Copy + Default> Aligned<T> {
    pub fn zeroed(len: usize) -> Aligned<T> {
        let size = std::mem::size_of::<T>();
        let buf = vec![T::default(); len + 64 / size];
        let start = (buf.as_ptr() as usize)
            .next_multiple_of(64)
            .wrapping_sub(buf.as_ptr() as usize)
            / size;
        Aligned { buf, start, len }
    }

    /// The first `len` values, the buffer replaced by a larger zeroed one where it is shorter
    /// (a reused scratch: what it held before is not cleared).
    pub fn grown(&mut self, len: usize) -> &mut [T] {
        if self.len < len {
            *self = Aligned::zeroed(len);
        }
        &mut self[..len]
    }
}

impl<T: Copy + Default> Default for Aligned<T> {
    fn default() -> Aligned<T> {
        Aligned::zeroed(0)
    }
}

impl<T> std::ops::Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl<T> std::ops::DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// What a product does with each output value as it writes it: adds the output row's bias, and
/// adds the value to what `y` holds (a residual) instead of overwriting it.
#[derive(Clone, Copy, Default)]
pub(crate) struct Epilogue<'a> {
    pub bias: Option<&'a [f32]>,
    pub add: bool,
}

impl Epilogue<'_> {
    /// Applies it to `y` (`[n, rows]`) after a product that writes plainly wrote it; `prev`
    /// holds `y` from before the product when `add`.
    fn apply(self, y: &mut [f32], rows: usize, prev: Option<&[f32]>) {
        for (r, row) in y.chunks_exact_mut(rows).enumerate() {
            if let Some(b) = self.bias {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
            if let Some(p) = prev {
                row.iter_mut()
                    .zip(&p[r * rows..(r + 1) * rows])
                    .for_each(|(v, p)| *v += p);
            }
        }
    }
}

/// Bytes of a [`Codes::U5`] group.
pub(crate) const U5_GROUP_BYTES: usize = 20;

/// Code `j` (0..32) of the [`Codes::U5`] group at `g` (20 bytes).
#[inline(always)]
pub(crate) fn u5_code(g: &[u8], j: usize) -> u8 {
    let high = u32::from_le_bytes([g[16], g[17], g[18], g[19]]);
    let low = if j < 16 { g[j] & 15 } else { g[j - 16] >> 4 };
    low | ((((high >> j) & 1) as u8) << 4)
}

/// The offsets of a [`QMatrix`]'s groups.
#[derive(Debug)]
pub(crate) enum Offsets {
    /// No offset (signed codes: Q8_0, Q5_0, Q6_K).
    None,
    /// `offset = −zero · scale` (Q4_0's 4-bit codes).
    Zero(f32),
    /// One offset per group (Q4_1, Q5_1, Q4_K, Q5_K), of the scales' element type.
    PerGroup(Table),
}

/// The arithmetic of long prefills on quantized weights ([`crate::Model::set_prefill_precision`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefillPrecision {
    /// Dequantized f32 panels into an f32 GEMM: the reference.
    #[default]
    F32,
    /// Input and dequantized weights rounded to bf16, products accumulated in f32 (AVX512_BF16
    /// only): twice the multiply-adds per instruction.
    Bf16,
}

impl PrefillPrecision {
    /// Whether this CPU runs it.
    pub fn available(self) -> bool {
        match self {
            PrefillPrecision::F32 => true,
            #[cfg(target_arch = "x86_64")]
            PrefillPrecision::Bf16 => bf16::available(),
            #[cfg(not(target_arch = "x86_64"))]
            PrefillPrecision::Bf16 => false,
        }
    }

    /// The fastest this CPU runs: bf16 where it has AVX512_BF16, else f32.
    pub fn fastest() -> PrefillPrecision {
        if PrefillPrecision::Bf16.available() {
            PrefillPrecision::Bf16
        } else {
            PrefillPrecision::F32
        }
    }
}

impl std::str::FromStr for PrefillPrecision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(PrefillPrecision::F32),
            "bf16" => Ok(PrefillPrecision::Bf16),
            other => Err(format!("prefill precision {other:?}: expected f32 or bf16")),
        }
    }
}

impl std::fmt::Display for PrefillPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PrefillPrecision::F32 => "f32",
            PrefillPrecision::Bf16 => "bf16",
        })
    }
}

/// The arithmetic of decode products on quantized weights ([`crate::Model::set_decode_precision`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecodePrecision {
    /// Codes converted to f32 and multiplied by the f32 input: the reference.
    #[default]
    F32,
    /// The input row quantized to int8 in blocks of 4 values, integer dot products with
    /// AVX512-VNNI (`vnni.rs`) or AVX2 (`avx2_int8.rs`), each lane scaled by its group's scale
    /// and its block's (after llama.cpp): about half the instructions per weight, at the
    /// input's rounding.
    Int8,
}

impl DecodePrecision {
    /// Whether this CPU runs it.
    pub fn available(self) -> bool {
        match self {
            DecodePrecision::F32 => true,
            DecodePrecision::Int8 => vnni::available(),
        }
    }
}

impl std::str::FromStr for DecodePrecision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(DecodePrecision::F32),
            "int8" => Ok(DecodePrecision::Int8),
            other => Err(format!("decode precision {other:?}: expected f32 or int8")),
        }
    }
}

impl std::fmt::Display for DecodePrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecodePrecision::F32 => "f32",
            DecodePrecision::Int8 => "int8",
        })
    }
}

/// Input rows from which a bf16 product goes through the bf16 tiles (fewer stay on the codes in
/// row blocks). Measured as the product runs it, whole-model prefills of 2-48 tokens
/// (`kamera bench model --prefill N`, Zen 4 EPYC with AVX512_BF16, 2 threads, 2026-12-07): the
/// tiles 1.0-1.3x the row blocks at 4-8 rows on SmolLM2-135M and Qwen2.5-0.5B, 1.7-2.4x at
/// 16-31 (Qwen at 31 rows: 107 -> 255 tokens/s); the row blocks ahead only at 2-4 rows on Qwen.
/// 32 before (the `quant::tests::matvec_speed` probe's crossing on one 4864 x 1024 matrix).
const BF16_MIN_ROWS: usize = 8;

/// A `[rows, cols]` weight matrix as codes with a scale and an offset per `group` weights of a row.
#[derive(Debug)]
pub(crate) struct QMatrix {
    pub rows: usize,
    pub cols: usize,
    /// Weights per scale: 16 or 32.
    pub group: usize,
    pub codes: Codes,
    /// `rows · cols / group`, f16 or f32 as the block stored them ([`Table`]).
    pub scales: Table,
    pub offsets: Offsets,
    /// The GGUF block type it came from (for messages and the README's table).
    pub source: &'static str,
    /// How products of more than a few input rows compute.
    pub precision: PrefillPrecision,
}

impl QMatrix {
    fn groups_per_row(&self) -> usize {
        self.cols / self.group
    }

    /// Resident bytes.
    pub fn bytes(&self) -> usize {
        let codes = match &self.codes {
            Codes::U8(c) | Codes::U4(c) | Codes::U5(c) => c.len(),
            Codes::I8(c) => c.len(),
        };
        let offsets = match &self.offsets {
            Offsets::None | Offsets::Zero(_) => 0,
            Offsets::PerGroup(o) => o.bytes(),
        };
        codes + self.scales.bytes() + offsets
    }

    /// Appends the rows of `more` (same columns, group and block type) below these.
    pub fn append(&mut self, more: QMatrix) {
        debug_assert_eq!(
            (self.cols, self.group, self.source),
            (more.cols, more.group, more.source)
        );
        self.rows += more.rows;
        self.scales.append(more.scales);
        match (&mut self.codes, more.codes) {
            (Codes::U8(a), Codes::U8(b)) | (Codes::U4(a), Codes::U4(b)) | (Codes::U5(a), Codes::U5(b)) => a.extend(b),
            (Codes::I8(a), Codes::I8(b)) => a.extend(b),
            _ => unreachable!("rows of one tensor share their code type"),
        }
        if let (Offsets::PerGroup(a), Offsets::PerGroup(b)) = (&mut self.offsets, more.offsets) {
            a.append(b);
        }
    }

    /// Row `r` dequantized into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "dequantize_row: output length");
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            // SAFETY: the CPU has AVX2 and FMA; `out` holds one row; `r` is checked here.
            assert!(r < self.rows, "dequantize_row: row {r} of {}", self.rows);
            unsafe { avx2::dequantize_row(self, r, out) };
            return;
        }
        self.dequantize_row_portable(r, out);
    }

    /// [`QMatrix::dequantize_row`] in plain loops (the reference; CPUs without AVX2).
    pub fn dequantize_row_portable(&self, r: usize, out: &mut [f32]) {
        let (g, gpr) = (self.group, self.groups_per_row());
        for (j, o) in out.chunks_exact_mut(g).enumerate() {
            let gi = r * gpr + j;
            let (s, off) = rows::scale_offset(self, gi);
            match &self.codes {
                Codes::U8(c) => {
                    for (o, &c) in o.iter_mut().zip(&c[gi * g..(gi + 1) * g]) {
                        *o = s * c as f32 + off;
                    }
                }
                Codes::I8(c) => {
                    for (o, &c) in o.iter_mut().zip(&c[gi * g..(gi + 1) * g]) {
                        *o = s * c as f32 + off;
                    }
                }
                Codes::U4(c) => {
                    let b = &c[gi * 16..gi * 16 + 16];
                    for t in 0..16 {
                        o[t] = s * (b[t] & 15) as f32 + off;
                        o[t + 16] = s * (b[t] >> 4) as f32 + off;
                    }
                }
                Codes::U5(c) => {
                    let b = &c[gi * U5_GROUP_BYTES..(gi + 1) * U5_GROUP_BYTES];
                    for (t, o) in o.iter_mut().enumerate() {
                        *o = s * u5_code(b, t) as f32 + off;
                    }
                }
            }
        }
    }

    /// The whole matrix in f32 (`rows · cols`), e.g. for the device transformer.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }
}

/// A linear layer's weight `[out, in]`: dense f32 (f32 safetensors, f32/f16 GGUF tensors and
/// block types without a repacking), dense bf16 (bf16 safetensors, or any with the bf16 prefill
/// precision) or quantized.
#[derive(Debug)]
pub(crate) enum Linear {
    Dense(Tensor),
    Bf16(Bf16Matrix),
    Quant(QMatrix),
}

impl Linear {
    /// Resident bytes of the weight.
    pub fn bytes(&self) -> usize {
        match self {
            Linear::Dense(t) => t.elem_count() * 4,
            Linear::Bf16(m) => m.bytes(),
            Linear::Quant(q) => q.bytes(),
        }
    }

    /// A dense weight for the given prefill precision: rounded to bf16 on the tiles where it
    /// asks for bf16 and the kernel takes the matrix; else held in bf16 exactly where every
    /// value is one (a bf16 checkpoint: half the bytes, the same products), else f32.
    pub fn dense(w: Tensor, precision: PrefillPrecision) -> Result<Linear> {
        const OP: &str = "Linear::dense";
        let (rows, cols) = w.dims2().ctx(OP)?;
        if precision == PrefillPrecision::Bf16
            && let Some(m) = with_f32(&w, OP, |d| Bf16Matrix::from_f32(d, rows, cols))?
        {
            return Ok(Linear::Bf16(m));
        }
        Ok(match with_f32(&w, OP, |d| Bf16Matrix::exact(d, rows, cols))? {
            Some(m) => Linear::Bf16(m),
            None => Linear::Dense(w),
        })
    }

    /// A weight stored in bf16 (`bytes`: little-endian, row-major, as a safetensors file holds
    /// it) kept as it is for `precision`: [`Linear::dense`]'s matrix for the widened values,
    /// without making them. `None` where that would not be bf16 (an odd column count) or the
    /// byte count is not the shape's.
    pub fn bf16_bytes(bytes: &[u8], rows: usize, cols: usize, precision: PrefillPrecision) -> Option<Linear> {
        Bf16Matrix::from_bf16_bytes(bytes, rows, cols, precision == PrefillPrecision::Bf16).map(Linear::Bf16)
    }

    /// `x @ wᵀ` for `x: [n, in]`: one row on the codes, up to [`rows::max_rows`] rows by
    /// blocks of rows on the codes, more by a GEMM over dequantized panels.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        const OP: &str = "linear";
        match self {
            Linear::Dense(w) => x.matmul(&w.t().ctx(OP)?).ctx(OP),
            Linear::Bf16(_) | Linear::Quant(_) => {
                let n = x.dim(0).ctx(OP)?;
                let rows = self.dims()?.0;
                Tensor::from_vec(self.forward_vec(x)?, (n, rows), x.device()).ctx(OP)
            }
        }
    }

    /// `x @ wᵀ + b`: a bf16 weight writes the bias as it writes its output; others add it
    /// after.
    pub fn forward_bias(&self, x: &Tensor, b: &Tensor) -> Result<Tensor> {
        const OP: &str = "linear";
        let Linear::Bf16(m) = self else {
            return self.forward(x)?.broadcast_add(b).ctx("linear bias");
        };
        let bias = b.to_vec1::<f32>().ctx(OP)?;
        let y = bf16_forward(
            m,
            x,
            Epilogue {
                bias: Some(&bias),
                add: false,
            },
        )?;
        Tensor::from_vec(y, (x.dim(0).ctx(OP)?, m.rows), x.device()).ctx(OP)
    }

    /// [`Linear::forward`]'s values, row-major `[n, out]`.
    pub fn forward_vec(&self, x: &Tensor) -> Result<Vec<f32>> {
        const OP: &str = "linear";
        match self {
            Linear::Dense(w) => x
                .matmul(&w.t().ctx(OP)?)
                .ctx(OP)?
                .flatten_all()
                .ctx(OP)?
                .to_vec1()
                .ctx(OP),
            Linear::Bf16(m) => bf16_forward(m, x, Epilogue::default()),
            Linear::Quant(q) => {
                let (n, k) = x.dims2().ctx(OP)?;
                if k != q.cols {
                    return Err(crate::error::Error::Shape {
                        op: OP,
                        detail: format!("input has {k} columns, weight [{}, {}]", q.rows, q.cols),
                    });
                }
                let xs = x.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?;
                let mut y = vec![0f32; n * q.rows];
                if n == 1 {
                    dot::matvec(q, &xs, &mut y);
                } else if q.precision == PrefillPrecision::Bf16 && n >= BF16_MIN_ROWS {
                    bf16_matmul(q, &xs, n, &mut y)?;
                } else if n <= rows::max_rows(q) {
                    rows::product(q, &xs, n, &mut y);
                } else {
                    matmul::matmul(q, &xs, n, &mut y);
                }
                Ok(y)
            }
        }
    }

    /// The arithmetic of this weight's long products (dense f32 weights, and bf16 ones off the
    /// tiles: f32).
    pub fn precision(&self) -> PrefillPrecision {
        match self {
            Linear::Quant(q) => q.precision,
            Linear::Bf16(m) if m.tiles() => PrefillPrecision::Bf16,
            Linear::Bf16(_) | Linear::Dense(_) => PrefillPrecision::F32,
        }
    }

    /// Sets the arithmetic of this weight's long products; whether it took it. With `dense`, an
    /// f32 weight becomes bf16 (rounded, half the bytes) on the tiles; a bf16 weight moves on or
    /// off the tiles, its values as they are (off: f32 products of the bf16 values, exactly);
    /// one the bf16 kernel does not take (odd columns) stays f32. Without, dense weights stay
    /// as they are (f32 takes, bf16 does not).
    pub fn set_precision(&mut self, p: PrefillPrecision, dense: bool) -> Result<bool> {
        let tiles = p == PrefillPrecision::Bf16;
        Ok(match self {
            Linear::Quant(q) => {
                q.precision = p;
                true
            }
            Linear::Bf16(m) if tiles && !dense => m.tiles(),
            Linear::Bf16(m) => m.set_tiles(tiles),
            Linear::Dense(_) if tiles && !dense => false,
            Linear::Dense(w) if tiles => {
                *self = Linear::dense(w.clone(), p)?;
                matches!(self, Linear::Bf16(m) if m.tiles())
            }
            Linear::Dense(_) => true,
        })
    }

    /// `[out, in]`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Linear::Dense(w) => w.dims2().ctx("Linear::dims"),
            Linear::Bf16(m) => Ok((m.rows, m.cols)),
            Linear::Quant(q) => Ok((q.rows, q.cols)),
        }
    }

    /// Row `r` (an embedding lookup) into `out` (`in` values).
    pub fn row_into(&self, r: usize, out: &mut [f32]) -> Result<()> {
        const OP: &str = "Linear::row_into";
        let (rows, cols) = self.dims()?;
        if r >= rows || out.len() != cols {
            return Err(crate::error::Error::Shape {
                op: OP,
                detail: format!("row {r} into {} values of a weight [{rows}, {cols}]", out.len()),
            });
        }
        match self {
            Linear::Quant(q) => q.dequantize_row(r, out),
            Linear::Bf16(m) => m.row_into(r, out),
            Linear::Dense(w) => with_f32(w, OP, |d| out.copy_from_slice(&d[r * cols..(r + 1) * cols]))?,
        }
        Ok(())
    }

    /// Rows `ids` (an embedding lookup), `[ids.len(), in]`.
    pub fn rows(&self, ids: &[u32]) -> Result<Tensor> {
        const OP: &str = "Linear::rows";
        match self {
            Linear::Dense(w) => {
                let idx = Tensor::from_slice(ids, ids.len(), w.device()).ctx(OP)?;
                w.index_select(&idx, 0).ctx(OP)
            }
            Linear::Bf16(_) | Linear::Quant(_) => {
                let cols = self.dims()?.1;
                let mut out = vec![0f32; ids.len() * cols];
                for (&id, row) in ids.iter().zip(out.chunks_exact_mut(cols)) {
                    self.row_into(id as usize, row)?;
                }
                Tensor::from_vec(out, (ids.len(), cols), &candle_core::Device::Cpu).ctx(OP)
            }
        }
    }

    /// The weight in f32, row-major.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match self {
            Linear::Dense(t) => t
                .flatten_all()
                .ctx("Linear::to_f32")?
                .to_vec1::<f32>()
                .ctx("Linear::to_f32"),
            Linear::Bf16(m) => Ok(m.to_f32()),
            Linear::Quant(q) => Ok(q.dequantize()),
        }
    }
}

/// A weight read in place for a decode step (see [`Linear::with_views`]): codes, or dense rows.
#[derive(Clone, Copy)]
pub(crate) enum View<'a> {
    Codes(&'a QMatrix),
    Bf16(&'a Bf16Matrix),
    Dense { w: &'a [f32], cols: usize },
}

impl View<'_> {
    pub fn rows(&self) -> usize {
        match self {
            View::Codes(q) => q.rows,
            View::Bf16(m) => m.rows,
            View::Dense { w, cols } => w.len() / cols.max(&1),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            View::Codes(q) => q.cols,
            View::Bf16(m) => m.cols,
            View::Dense { cols, .. } => *cols,
        }
    }

    /// What the products of one input `x` share: the group sums for the offsets, and `x8`
    /// ([`quantize_input`]) where the int8 kernel reads these codes (else the products are f32,
    /// on `x` in lane order where the AVX2 kernel for 4- and 5-bit codes reads it).
    pub fn prepare<'a>(&self, x: &[f32], x8: Option<&'a Q8Input>) -> Prepared<'a> {
        match self {
            View::Codes(q) => {
                let q8 = x8.filter(|_| vnni::reads(q));
                let sums = match (q8, &q.offsets) {
                    (Some(x8), Offsets::Zero(_) | Offsets::PerGroup(_)) => x8.group_sums(q),
                    _ => dot::group_sums(q, x),
                };
                let lanes = if q8.is_none() { dot::lane_input(q, x) } else { None };
                Prepared { sums, q8, lanes }
            }
            View::Bf16(_) => Prepared {
                sums: Vec::new(),
                q8: None,
                lanes: Bf16Matrix::lane_input(x),
            },
            View::Dense { .. } => Prepared {
                sums: Vec::new(),
                q8: None,
                lanes: None,
            },
        }
    }

    /// Rows `r0..r0 + out.len()` of `W x`, on the calling thread; `prep` from [`View::prepare`].
    pub fn rows_into(&self, x: &[f32], prep: &Prepared, r0: usize, out: &mut [f32]) {
        match self {
            View::Codes(q) => match prep.q8 {
                Some(x8) => dot::rows_into_q8(q, x8, &prep.sums, r0, out),
                None => dot::rows_into(q, x, prep.lanes.as_deref(), &prep.sums, r0, out),
            },
            View::Bf16(m) => m.rows_into(x, prep.lanes.as_deref(), r0, out),
            View::Dense { w, cols } => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = crate::lanes::dot(&w[(r0 + i) * cols..(r0 + i + 1) * cols], x);
                }
            }
        }
    }
}

/// One input row made ready for a weight's products ([`View::prepare`]).
pub(crate) struct Prepared<'a> {
    sums: Vec<f32>,
    q8: Option<&'a Q8Input>,
    /// `x` in lane order where the f32 kernel reads it so ([`dot::lane_input`],
    /// [`Bf16Matrix::lane_input`]).
    lanes: Option<Vec<f32>>,
}

/// `x` rounded into `x8` for the int8 decode products when `precision` asks for them, in the
/// roundings `views` read: once per input, shared by every weight that input multiplies (Q, K
/// and V; gate and up).
pub(crate) fn quantize_input<'a, 'v>(
    x8: &'a mut Q8Input,
    x: &[f32],
    precision: DecodePrecision,
    views: impl IntoIterator<Item = View<'v>>,
) -> Option<&'a Q8Input> {
    if precision != DecodePrecision::Int8 {
        return None;
    }
    let (fine, wide) = Q8Input::needs(views.into_iter().filter_map(|v| match v {
        View::Codes(q) => Some(q),
        _ => None,
    }));
    ((fine || wide) && x8.fill(x, fine, wide)).then_some(&*x8)
}

impl Linear {
    /// Calls `f` with every weight of `ws` read in place (dense ones under their storage's
    /// read guard for the call).
    pub(crate) fn with_views<R>(ws: &[&Linear], f: impl FnOnce(&[View<'_>]) -> R) -> Result<R> {
        const OP: &str = "Linear::with_views";
        let guards: Vec<_> = ws
            .iter()
            .filter_map(|w| match w {
                Linear::Dense(t) => Some(t.storage_and_layout()),
                Linear::Bf16(_) | Linear::Quant(_) => None,
            })
            .collect();
        let mut dense = guards.iter();
        let mut views = Vec::with_capacity(ws.len());
        for w in ws {
            views.push(match w {
                Linear::Quant(q) => View::Codes(q),
                Linear::Bf16(m) => View::Bf16(m),
                Linear::Dense(t) => {
                    let (guard, layout) = dense.next().expect("one guard per dense weight");
                    let (_, cols) = t.dims2().ctx(OP)?;
                    match (&**guard, layout.contiguous_offsets()) {
                        (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(d)), Some((a, b))) => {
                            View::Dense { w: &d[a..b], cols }
                        }
                        _ => {
                            return Err(crate::error::Error::Invalid {
                                op: OP,
                                detail: "expected a contiguous f32 weight on the CPU".into(),
                            });
                        }
                    }
                }
            });
        }
        Ok(f(&views))
    }
}

#[cfg(target_arch = "x86_64")]
fn bf16_matmul(q: &QMatrix, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
    if !bf16::fits(q) {
        return Err(crate::error::Error::Invalid {
            op: "linear",
            detail: format!(
                "bf16 prefill needs AVX512_BF16 and an even column count (weight [{}, {}])",
                q.rows, q.cols
            ),
        });
    }
    bf16::matmul(q, x, n, y);
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn bf16_matmul(_: &QMatrix, _: &[f32], _: usize, _: &mut [f32]) -> Result<()> {
    Err(crate::error::Error::Invalid {
        op: "linear",
        detail: "bf16 prefill needs an x86-64 CPU with AVX512_BF16".into(),
    })
}

/// `x @ wᵀ` for a bf16 weight, `then` applied as the output is written; `[n, out]` row-major.
fn bf16_forward(m: &Bf16Matrix, x: &Tensor, then: Epilogue<'_>) -> Result<Vec<f32>> {
    const OP: &str = "linear";
    let (n, k) = x.dims2().ctx(OP)?;
    if k != m.cols {
        return Err(crate::error::Error::Shape {
            op: OP,
            detail: format!("input has {k} columns, weight [{}, {}]", m.rows, m.cols),
        });
    }
    let xs = x
        .contiguous()
        .ctx(OP)?
        .flatten_all()
        .ctx(OP)?
        .to_vec1::<f32>()
        .ctx(OP)?;
    let mut y = vec![0f32; n * m.rows];
    m.forward_into(&xs, n, &mut y, then);
    Ok(y)
}

/// Calls `f` with a contiguous f32 tensor's values, read in place.
pub(crate) fn with_f32<R>(t: &Tensor, op: &'static str, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (guard, layout) = t.storage_and_layout();
    match (&*guard, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(d)), Some((a, b))) => Ok(f(&d[a..b])),
        _ => Err(crate::error::Error::Invalid {
            op,
            detail: "expected a contiguous f32 tensor on the CPU".into(),
        }),
    }
}
