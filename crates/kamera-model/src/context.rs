//! A context: the per-layer K/V of tokens laid out contiguously from a start position, built
//! from cached chunks (each relocated to its slot and optionally patched) or grown by prefill.

use candle_core::{Device, Tensor};
use kamera_ops::{ChunkKv, DType, KvLayout, LayerKv, Mat, Placement, RopeSpec, assemble};

use crate::error::{CandleCtx, Error, OpsCtx, Result};

const OP: &str = "Context";

/// Per-layer K/V (`[len, kv_dim]` candle tensors) at positions `offset..offset + len`.
#[derive(Debug, Clone)]
pub struct Context {
    layout: KvLayout,
    offset: i64,
    len: usize,
    layers: Vec<(Tensor, Tensor)>,
}

impl Context {
    /// An empty context whose next token sits at `offset`.
    pub fn empty(layout: KvLayout, offset: i64) -> Context {
        Context {
            layout,
            offset,
            len: 0,
            layers: Vec::new(),
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

    /// Wraps one chunk, as is (no relocation).
    pub fn from_chunk(chunk: &ChunkKv) -> Result<Context> {
        let mut ctx = Context::empty(*chunk.layout(), chunk.offset());
        ctx.push(chunk)?;
        Ok(ctx)
    }

    /// Appends a chunk that starts where this context ends.
    pub fn push(&mut self, chunk: &ChunkKv) -> Result<()> {
        if *chunk.layout() != self.layout {
            return Err(Error::Shape {
                op: "Context::push",
                detail: format!("chunk layout {:?} != context layout {:?}", chunk.layout(), self.layout),
            });
        }
        if self.len > 0 && chunk.offset() != self.end() {
            return Err(Error::Invalid {
                op: "Context::push",
                detail: format!(
                    "chunk at position {} does not start at the context end {}",
                    chunk.offset(),
                    self.end()
                ),
            });
        }
        if self.len == 0 {
            self.offset = chunk.offset();
        }
        let dev = Device::Cpu;
        let n = chunk.n_tokens();
        let to_t = |m: &Mat| Tensor::from_vec(m.to_f32_vec(), (n, m.cols()), &dev).ctx(OP);
        let mut layers = Vec::with_capacity(chunk.layers().len());
        for (i, l) in chunk.layers().iter().enumerate() {
            let (k, v) = (to_t(&l.k)?, to_t(&l.v)?);
            layers.push(match self.layers.get(i) {
                Some((pk, pv)) if self.len > 0 => {
                    (Tensor::cat(&[pk, &k], 0).ctx(OP)?, Tensor::cat(&[pv, &v], 0).ctx(OP)?)
                }
                _ => (k, v),
            });
        }
        self.layers = layers;
        self.len += n;
        Ok(())
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

    /// K and V of `layer`, or `None` while empty.
    pub(crate) fn layer(&self, layer: usize) -> Option<(&Tensor, &Tensor)> {
        self.layers.get(layer).filter(|_| self.len > 0).map(|(k, v)| (k, v))
    }

    /// The whole context as one chunk.
    pub fn to_chunk(&self) -> Result<ChunkKv> {
        let mut layers = Vec::with_capacity(self.layout.n_layers);
        for l in 0..self.layout.n_layers {
            let (k, v) = match self.layer(l) {
                Some((k, v)) => (tensor_to_mat(k)?, tensor_to_mat(v)?),
                None => (
                    Mat::zeros(0, self.layout.k_features(), DType::F32),
                    Mat::zeros(0, self.layout.v_features(), DType::F32),
                ),
            };
            layers.push(LayerKv { k, v });
        }
        ChunkKv::new(self.layout, self.offset, layers).ops("Context::to_chunk")
    }
}

/// A `[rows, cols]` f32 tensor as a kamera-ops matrix.
pub(crate) fn tensor_to_mat(t: &Tensor) -> Result<Mat> {
    let (r, c) = t.dims2().ctx(OP)?;
    let v = t.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?;
    Mat::from_f32(r, c, v).ops("tensor_to_mat")
}
