//! A context: the per-layer K/V of tokens laid out contiguously from a start position, built
//! from cached chunks (each relocated to its slot and optionally patched) or grown by prefill.
//! K and V are kept head-first in buffers with spare capacity, so appending tokens
//! ([`crate::Model::extend`], [`Context::push`]) writes only the new rows instead of copying the
//! whole context each step.

use candle_core::{Device, Tensor};
use kamera_ops::{ChunkKv, DType, KvLayout, LayerKv, Mat, Placement, RopeSpec, assemble};
use rayon::prelude::*;

use crate::error::{CandleCtx, Error, OpsCtx, Result};

mod rows;
use rows::{PlaceRows, PutRow};

const OP: &str = "Context";
/// Rows a context's buffers hold at least once it holds anything.
const MIN_CAPACITY: usize = 256;

/// Per-layer K/V at positions `offset..offset + len`: each channel a `[kv_heads, capacity,
/// width]` f32 buffer whose first `len` rows are valid.
#[derive(Debug)]
pub struct Context {
    layout: KvLayout,
    offset: i64,
    len: usize,
    capacity: usize,
    layers: Vec<(Tensor, Tensor)>,
    /// `(row, shift)`: from `row` on, a token's rotary position is its row position + `shift`
    /// (M-RoPE: text after an image resumes at the image's span, not its token count).
    shifts: Vec<(usize, i64)>,
}

/// `[rows, groups·width]` -> `[groups, rows, width]`, contiguous.
pub(crate) fn heads_first(x: &Tensor, groups: usize) -> Result<Tensor> {
    let (rows, cols) = x.dims2().ctx(OP)?;
    x.reshape((rows, groups, cols / groups.max(1)))
        .ctx(OP)?
        .transpose(0, 1)
        .ctx(OP)?
        .contiguous()
        .ctx(OP)
}

impl Clone for Context {
    /// A deep copy of the valid rows: the copy and the original can then grow apart (appends
    /// write into a buffer in place, so two contexts must never share one).
    fn clone(&self) -> Context {
        let mut c = Context::empty(self.layout, self.offset);
        if self.len > 0 {
            let copy = |t: &Tensor| t.narrow(1, 0, self.len).and_then(|v| v.copy());
            let layers: candle_core::Result<Vec<_>> =
                self.layers.iter().map(|(k, v)| Ok((copy(k)?, copy(v)?))).collect();
            // A copy of tensors that already exist cannot fail short of running out of memory.
            c.layers = layers.expect("copying a context's K/V");
            c.len = self.len;
            c.capacity = self.len;
            c.shifts = self.shifts.clone();
        }
        c
    }
}

impl Context {
    /// An empty context whose next token sits at `offset`.
    pub fn empty(layout: KvLayout, offset: i64) -> Context {
        Context {
            layout,
            offset,
            len: 0,
            capacity: 0,
            layers: Vec::new(),
            shifts: Vec::new(),
        }
    }

    /// Lays `parts` out contiguously from `start`, each relocated to its slot and patched
    /// (`kamera_ops::assemble`).
    pub fn from_chunks(parts: &[Placement<'_>], rope: &RopeSpec, start: i64) -> Result<Context> {
        let Some(first) = parts.first() else {
            return Err(Error::Invalid {
                op: "Context::from_chunks",
                detail: "no chunks given".into(),
            });
        };
        let layout = *first.chunk.layout();
        let kv = assemble(parts, rope, start, DType::F32).ops("Context::from_chunks")?;
        let mut ctx = Context::empty(layout, start);
        ctx.push(&kv)?;
        Ok(ctx)
    }

    /// Appends `parts` at the context's next positions, each relocated to its slot and patched,
    /// computed straight into the context's buffers (kamera-ops' fused rows, one pass per layer
    /// and channel, layers in parallel): no intermediate chunk, no copy. On error the context
    /// keeps its valid rows (the partly written ones are not counted).
    pub fn place(&mut self, parts: &[Placement<'_>], rope: &RopeSpec) -> Result<()> {
        const OP: &str = "Context::place";
        let total: usize = parts.iter().map(|p| p.chunk.n_tokens()).sum();
        if total == 0 {
            return Ok(());
        }
        let mut jobs = Vec::with_capacity(parts.len());
        let mut row = self.len;
        for p in parts {
            let to = self.offset.saturating_add(row as i64);
            let delta = kamera_ops::check_place(OP, p.chunk, p.patch, rope, &self.layout, to).ops(OP)?;
            jobs.push((*p, row, delta));
            row += p.chunk.n_tokens();
        }
        self.write_parts(&jobs, Some(rope), OP)
    }

    /// Writes placed chunks (each with its first row and shift) after the valid rows, every layer
    /// and channel in place (layers in parallel), then counts them. `rope` is needed only for
    /// shifted or patched parts.
    fn write_parts(
        &mut self,
        jobs: &[(Placement<'_>, usize, i64)],
        rope: Option<&RopeSpec>,
        op: &'static str,
    ) -> Result<()> {
        let total: usize = jobs.iter().map(|j| j.0.chunk.n_tokens()).sum();
        self.reserve(total)?;
        let (g, cap) = (self.layout.kv_heads(), self.capacity);
        self.layers
            .par_iter()
            .enumerate()
            .try_for_each(|(l, (k, v))| -> Result<()> {
                for (t, v_channel) in [(k, false), (v, true)] {
                    let rows = PlaceRows {
                        jobs,
                        rope,
                        layer: l,
                        v_channel,
                        groups: g,
                        cap,
                    };
                    t.inplace_op1(&rows).ctx(op)?;
                }
                Ok(())
            })?;
        self.len += total;
        Ok(())
    }

    /// Wraps one chunk, as is (no relocation).
    pub fn from_chunk(chunk: &ChunkKv) -> Result<Context> {
        let mut ctx = Context::empty(*chunk.layout(), chunk.offset());
        ctx.push(chunk)?;
        Ok(ctx)
    }

    /// Appends a chunk that occupies `span` positions for its `n_tokens` rows (an image under
    /// M-RoPE spans fewer positions than it has tokens); what follows it rotates from its
    /// start + `span`.
    pub fn push_spanned(&mut self, chunk: &ChunkKv, span: i64) -> Result<()> {
        if span <= 0 {
            return Err(Error::Invalid {
                op: "Context::push_spanned",
                detail: format!("span {span} must be positive"),
            });
        }
        self.push(chunk)?;
        self.mark_span(chunk.n_tokens(), span)
    }

    /// Records that the last `rows` rows (appended by [`crate::Model::extend_rotary`]) occupy
    /// `span` positions: what follows rotates from their start + `span`.
    pub fn mark_span(&mut self, rows: usize, span: i64) -> Result<()> {
        if rows > self.len || span <= 0 {
            return Err(Error::Invalid {
                op: "Context::mark_span",
                detail: format!("{rows} rows spanning {span} positions (the context holds {})", self.len),
            });
        }
        let extra = span - rows as i64;
        if extra != 0 {
            let shift = self.shift() + extra;
            self.shifts.push((self.len, shift));
        }
        Ok(())
    }

    /// Rotary position minus row position of the next token appended.
    fn shift(&self) -> i64 {
        self.shifts.last().map_or(0, |s| s.1)
    }

    /// Rotary position minus row position of row `row`.
    fn shift_at(&self, row: usize) -> i64 {
        self.shifts.iter().rev().find(|s| s.0 <= row).map_or(0, |s| s.1)
    }

    /// Rotary position of the next token appended: [`Context::end`] unless the context holds a
    /// chunk pushed with [`Context::push_spanned`] whose span is not its token count.
    pub fn rotary_end(&self) -> i64 {
        self.end() + self.shift()
    }

    /// Appends a chunk that starts where this context ends (at [`Context::rotary_end`]).
    pub fn push(&mut self, chunk: &ChunkKv) -> Result<()> {
        if *chunk.layout() != self.layout {
            return Err(Error::Shape {
                op: "Context::push",
                detail: format!("chunk layout {:?} != context layout {:?}", chunk.layout(), self.layout),
            });
        }
        if self.len > 0 && chunk.offset() != self.rotary_end() {
            return Err(Error::Invalid {
                op: "Context::push",
                detail: format!(
                    "chunk at position {} does not start at the context end {}",
                    chunk.offset(),
                    self.rotary_end()
                ),
            });
        }
        if self.len == 0 {
            self.offset = chunk.offset();
        }
        // In place, no intermediate tensor: the rows as they are (no shift, no patch).
        self.write_parts(
            &[(Placement { chunk, patch: None }, self.len, 0)],
            None,
            "Context::push",
        )
    }

    /// Makes room for `n` more rows in every layer (doubling, so appends cost amortised O(n)).
    /// A layer's old buffers are dropped as soon as its rows are copied, so growing holds one
    /// layer twice, not the whole cache (old and new together were 1.5x a doubled cache's KV).
    /// Should an allocation fail midway, the context is left empty (length 0) and says so.
    pub(crate) fn reserve(&mut self, n: usize) -> Result<()> {
        let need = self.len + n;
        if need <= self.capacity && !self.layers.is_empty() {
            return Ok(());
        }
        let cap = need.max(2 * self.capacity).max(MIN_CAPACITY);
        let mut old = std::mem::take(&mut self.layers).into_iter();
        let mut layers = Vec::with_capacity(self.layout.n_layers);
        for _ in 0..self.layout.n_layers {
            match self.grown_layer(old.next(), cap) {
                Ok(kv) => layers.push(kv),
                Err(e) => {
                    self.truncate(0);
                    self.capacity = 0;
                    return Err(Error::Invalid {
                        op: OP,
                        detail: format!("growing the KV cache to {cap} rows failed, the context was cleared: {e}"),
                    });
                }
            }
        }
        self.layers = layers;
        self.capacity = cap;
        Ok(())
    }

    /// One layer's buffers of `cap` rows holding the valid rows of `old` (which is dropped).
    fn grown_layer(&self, old: Option<(Tensor, Tensor)>, cap: usize) -> Result<(Tensor, Tensor)> {
        let g = self.layout.kv_heads();
        let (kw, vw) = (self.layout.k_features() / g, self.layout.v_features() / g);
        let dev = Device::Cpu;
        let (k, v) = (
            Tensor::zeros((g, cap, kw), candle_core::DType::F32, &dev).ctx(OP)?,
            Tensor::zeros((g, cap, vw), candle_core::DType::F32, &dev).ctx(OP)?,
        );
        if self.len > 0
            && let Some((ok, ov)) = old
        {
            k.slice_set(&ok.narrow(1, 0, self.len).ctx(OP)?.contiguous().ctx(OP)?, 1, 0)
                .ctx(OP)?;
            v.slice_set(&ov.narrow(1, 0, self.len).ctx(OP)?.contiguous().ctx(OP)?, 1, 0)
                .ctx(OP)?;
        }
        Ok((k, v))
    }

    /// Writes the rows-first K and V of new tokens (`[n, features]`) after the valid rows of
    /// `layer` (not yet counted: see [`Context::commit`]; [`Context::reserve`] first, since
    /// growing keeps only counted rows) and returns that layer's K and V up to and including
    /// them, head-first (`[kv_heads, len + n, width]`, views of the buffers).
    pub(crate) fn write(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = k.dim(0).ctx(OP)?;
        if self.len + n > self.capacity {
            return Err(Error::Invalid {
                op: "Context::write",
                detail: format!("{n} rows after {} exceed the reserved {}", self.len, self.capacity),
            });
        }
        let g = self.layout.kv_heads();
        let (bk, bv) = self.layers.get(layer).ok_or_else(|| Error::Shape {
            op: "Context::write",
            detail: format!("layer {layer} of {}", self.layout.n_layers),
        })?;
        bk.slice_set(&heads_first(k, g)?, 1, self.len).ctx(OP)?;
        bv.slice_set(&heads_first(v, g)?, 1, self.len).ctx(OP)?;
        Ok((
            bk.narrow(1, 0, self.len + n).ctx(OP)?,
            bv.narrow(1, 0, self.len + n).ctx(OP)?,
        ))
    }

    /// [`Context::write`] of one new row given as plain values (`k_features` and `v_features`),
    /// written head by head into the buffers without a tensor (decode).
    pub(crate) fn write_row(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        const W: &str = "Context::write_row";
        if self.len >= self.capacity {
            return Err(Error::Invalid {
                op: W,
                detail: format!("a row after {} exceeds the reserved {}", self.len, self.capacity),
            });
        }
        let (bk, bv) = self.layers.get(layer).ok_or_else(|| Error::Shape {
            op: W,
            detail: format!("layer {layer} of {}", self.layout.n_layers),
        })?;
        let (groups, cap, row) = (self.layout.kv_heads(), self.capacity, self.len);
        for (t, src) in [(bk, k), (bv, v)] {
            t.inplace_op1(&PutRow { src, groups, cap, row }).ctx(W)?;
        }
        Ok(())
    }

    /// Calls `f` with every layer's whole K and V buffers (`[kv_heads, capacity, width]` each,
    /// the first [`Context::len`] rows valid) and the capacity, read in place.
    pub(crate) fn with_buffers<R>(&self, f: impl FnOnce(&[(&[f32], &[f32])], usize) -> R) -> Result<R> {
        const W: &str = "Context::with_buffers";
        let guards: Vec<_> = self
            .layers
            .iter()
            .map(|(k, v)| (k.storage_and_layout().0, v.storage_and_layout().0))
            .collect();
        let mut bufs = Vec::with_capacity(guards.len());
        for (gk, gv) in &guards {
            match (&**gk, &**gv) {
                (
                    candle_core::Storage::Cpu(candle_core::CpuStorage::F32(k)),
                    candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)),
                ) => bufs.push((k.as_slice(), v.as_slice())),
                _ => {
                    return Err(Error::Invalid {
                        op: W,
                        detail: "the context's buffers are not f32 on the CPU".into(),
                    });
                }
            }
        }
        if bufs.len() != self.layout.n_layers {
            return Err(Error::Shape {
                op: W,
                detail: format!(
                    "{} layers of buffers, the layout has {}",
                    bufs.len(),
                    self.layout.n_layers
                ),
            });
        }
        Ok(f(&bufs, self.capacity))
    }

    /// Counts `n` rows written to every layer by [`Context::write`].
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Keeps the first `len` tokens (no-op when it holds fewer): the rows after them are
    /// overwritten by the next append, nothing is copied or freed. This is how a runtime drops a
    /// question after answering it, or the chunks after the first one that moved.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        let len = self.len;
        self.shifts.retain(|s| s.0 <= len);
    }

    /// Position of the first token.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the context holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Position one past the last token.
    pub fn end(&self) -> i64 {
        self.offset + self.len as i64
    }

    /// The layout of the K/V held.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// K and V of `layer`, head-first (`[kv_heads, len, width]` views), or `None` while empty.
    pub(crate) fn layer(&self, layer: usize) -> Result<Option<(Tensor, Tensor)>> {
        match self.layers.get(layer) {
            Some((k, v)) if self.len > 0 => Ok(Some((
                k.narrow(1, 0, self.len).ctx(OP)?,
                v.narrow(1, 0, self.len).ctx(OP)?,
            ))),
            _ => Ok(None),
        }
    }

    /// The whole context as one chunk.
    pub fn to_chunk(&self) -> Result<ChunkKv> {
        self.rows_chunk(0, self.len)
    }

    /// The whole context as one chunk, each layer's buffers freed once its rows are copied out
    /// (a long prefill's end: [`crate::Model::prefill`] in slices), so at most one layer is held
    /// twice.
    pub(crate) fn into_chunk(mut self) -> Result<ChunkKv> {
        if self.len == 0 {
            return self.rows_chunk(0, 0);
        }
        let start = self.offset + self.shift_at(0);
        let mut layers = Vec::with_capacity(self.layout.n_layers);
        for (k, v) in std::mem::take(&mut self.layers) {
            layers.push(LayerKv {
                k: rows_first(&k.narrow(1, 0, self.len).ctx(OP)?)?,
                v: rows_first(&v.narrow(1, 0, self.len).ctx(OP)?)?,
            });
        }
        ChunkKv::new(self.layout, start, layers).ops("Context::into_chunk")
    }

    /// Rows `start..start + n` copied out as one chunk at the rotary position of row `start`
    /// ([`Context::offset`] + `start`, shifted past any spanned chunk before it), so a prefix
    /// cache can keep a run of tokens' KV this way and push it back with [`Context::push`] (or
    /// [`Context::push_spanned`] for an image's rows). Errors when the rows are not all valid.
    pub fn rows_chunk(&self, start: usize, n: usize) -> Result<ChunkKv> {
        if start.checked_add(n).is_none_or(|end| end > self.len) {
            return Err(Error::Invalid {
                op: "Context::rows_chunk",
                detail: format!("rows {start}..{start}+{n} of a context holding {}", self.len),
            });
        }
        let mut layers = Vec::with_capacity(self.layout.n_layers);
        for l in 0..self.layout.n_layers {
            let rows = match self.layers.get(l) {
                Some((k, v)) if n > 0 => Some((k.narrow(1, start, n).ctx(OP)?, v.narrow(1, start, n).ctx(OP)?)),
                _ => None,
            };
            let (k, v) = match rows {
                Some((k, v)) => (rows_first(&k)?, rows_first(&v)?),
                None => (
                    Mat::zeros(0, self.layout.k_features(), DType::F32),
                    Mat::zeros(0, self.layout.v_features(), DType::F32),
                ),
            };
            layers.push(LayerKv { k, v });
        }
        ChunkKv::new(self.layout, self.offset + start as i64 + self.shift_at(start), layers).ops("Context::rows_chunk")
    }
}

/// A head-first `[groups, rows, width]` K or V as a rows-first `[rows, groups·width]` matrix.
fn rows_first(t: &Tensor) -> Result<Mat> {
    let (g, n, w) = t.dims3().ctx(OP)?;
    tensor_to_mat(
        &t.transpose(0, 1)
            .ctx(OP)?
            .contiguous()
            .ctx(OP)?
            .reshape((n, g * w))
            .ctx(OP)?,
    )
}

/// A `[rows, cols]` f32 tensor as a kamera-ops matrix.
pub(crate) fn tensor_to_mat(t: &Tensor) -> Result<Mat> {
    let (r, c) = t.dims2().ctx(OP)?;
    let v = t.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?;
    Mat::from_f32(r, c, v).ops("tensor_to_mat")
}

#[cfg(test)]
mod tests {
    use super::Context;
    use kamera_ops::{
        ChunkKv, DType, KvLayout, LayerKv, LayerPatch, LowRank, Mat, PairLayout, Patch, Placement, RopeSpec,
    };

    fn mat(rows: usize, cols: usize, seed: usize) -> Mat {
        Mat::from_f32(
            rows,
            cols,
            (0..rows * cols)
                .map(|i| (((i + seed) * 2654435761) % 1000) as f32 / 500.0 - 1.0)
                .collect(),
        )
        .unwrap()
    }

    /// Placing chunks straight into the context equals assembling them and pushing the result,
    /// for heads of 8 (scalar rotation) and 64 (the vector kernels).
    #[test]
    fn place_equals_assemble_then_push() {
        for hd in [8, 64] {
            place_equals_assemble_then_push_with(hd);
        }
    }

    fn place_equals_assemble_then_push_with(hd: usize) {
        let layout = KvLayout::gqa(2, 4, 2, hd);
        let rope = RopeSpec::new(hd, 1e4, PairLayout::HalfSplit);
        let cols = 2 * hd;
        let chunk = |n: usize, at: i64, seed: usize| {
            let layers = (0..2)
                .map(|l| LayerKv {
                    k: mat(n, cols, seed + l),
                    v: mat(n, cols, seed + 10 + l),
                })
                .collect();
            ChunkKv::new(layout, at, layers).unwrap()
        };
        let patch = |n: usize, seed: usize| {
            let lr = |s: usize| LowRank {
                p: mat(n, 3, s),
                wt: mat(3, cols, s + 1).to_dtype(DType::Bf16),
                spectrum: Vec::new(),
            };
            Patch::new(
                layout,
                n,
                (0..2)
                    .map(|l| LayerPatch {
                        k: lr(seed + l),
                        v: lr(seed + 5 + l),
                    })
                    .collect(),
            )
            .unwrap()
        };
        let (a, b, c) = (
            chunk(70, 0, 1),
            chunk(5, 100, 2),
            chunk(130, 7, 3).to_dtype(DType::Bf16),
        );
        let (pa, pc) = (patch(70, 4), patch(130, 9));
        let parts = [
            Placement {
                chunk: &a,
                patch: Some(&pa),
            },
            Placement { chunk: &b, patch: None },
            Placement {
                chunk: &c,
                patch: Some(&pc),
            },
        ];
        let prefix = chunk(9, 3, 20);
        let mut want = Context::from_chunk(&prefix).unwrap();
        want.push(&kamera_ops::assemble(&parts, &rope, 12, DType::F32).unwrap())
            .unwrap();
        let mut got = Context::from_chunk(&prefix).unwrap();
        got.place(&parts, &rope).unwrap();
        assert_eq!((got.len(), got.end()), (want.len(), want.end()));
        let (w, g) = (want.to_chunk().unwrap(), got.to_chunk().unwrap());
        for (x, y) in w.layers().iter().zip(g.layers()) {
            for (p, q) in [(&x.k, &y.k), (&x.v, &y.v)] {
                let d = p
                    .to_f32_vec()
                    .iter()
                    .zip(q.to_f32_vec())
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(d < 1e-5, "head dim {hd}: placed rows differ by {d}");
            }
        }
        // A mismatched patch is an error and leaves the context as it was.
        let bad = [Placement {
            chunk: &b,
            patch: Some(&pa),
        }];
        assert!(got.place(&bad, &rope).is_err());
        assert_eq!(got.len(), want.len());
    }

    /// Rows copied out with `rows_chunk` and pushed back in order rebuild the context exactly,
    /// each piece at its own position; rows past the valid ones are an error.
    #[test]
    fn rows_chunk_splits_and_rebuilds() {
        let layout = KvLayout::gqa(2, 4, 2, 8);
        let layers = (0..2)
            .map(|l| LayerKv {
                k: mat(10, 16, l),
                v: mat(10, 16, 7 + l),
            })
            .collect();
        let whole = ChunkKv::new(layout, 5, layers).unwrap();
        let ctx = Context::from_chunk(&whole).unwrap();
        let (a, b) = (ctx.rows_chunk(0, 4).unwrap(), ctx.rows_chunk(4, 6).unwrap());
        assert_eq!((a.offset(), a.n_tokens(), b.offset(), b.n_tokens()), (5, 4, 9, 6));
        let mut back = Context::from_chunk(&a).unwrap();
        back.push(&b).unwrap();
        assert_eq!(back.to_chunk().unwrap(), whole);
        // After a spanned chunk (4 rows over 2 positions), rows carry their rotary positions:
        // text, the image's rows, text after it, pushed back piece by piece.
        let mut spanned = Context::from_chunk(&a).unwrap();
        spanned.push_spanned(&ctx.rows_chunk(4, 4).unwrap(), 2).unwrap();
        let tail = ChunkKv::new(
            layout,
            spanned.rotary_end(),
            ctx.rows_chunk(8, 2).unwrap().layers().to_vec(),
        )
        .unwrap();
        spanned.push(&tail).unwrap();
        let (t, i, r) = (
            spanned.rows_chunk(0, 4).unwrap(),
            spanned.rows_chunk(4, 4).unwrap(),
            spanned.rows_chunk(8, 2).unwrap(),
        );
        assert_eq!(
            (t.offset(), i.offset(), r.offset()),
            (5, 9, 11),
            "rows after the image start at its span's end"
        );
        let mut rebuilt = Context::from_chunk(&t).unwrap();
        rebuilt.push_spanned(&i, 2).unwrap();
        rebuilt.push(&r).unwrap();
        assert_eq!((rebuilt.len(), rebuilt.rotary_end()), (10, 13));
        assert_eq!(rebuilt.rows_chunk(8, 2).unwrap(), r);
        assert!(ctx.rows_chunk(4, 7).is_err());
        assert!(ctx.rows_chunk(usize::MAX, 2).is_err());
    }
}
