//! One chunk's cached KV: per layer a K and a V matrix (tokens x features) at a position offset.

use crate::error::{Result, shape};
use crate::layout::KvLayout;
use crate::tensor::{DType, Mat};

/// K and V of one layer. Keys are stored post-RoPE, at the chunk's positions.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerKv {
    pub k: Mat,
    pub v: Mat,
}

/// The KV of a chunk of `n_tokens` tokens whose first token sits at position `offset`.
/// The canonical KV of a chunk, KV(B|∅), is prefilled alone at offset 0.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkKv {
    layout: KvLayout,
    offset: i64,
    layers: Vec<LayerKv>,
}

impl ChunkKv {
    /// Checks every layer against the layout and that all layers hold the same token count.
    pub fn new(layout: KvLayout, offset: i64, layers: Vec<LayerKv>) -> Result<ChunkKv> {
        const OP: &str = "ChunkKv::new";
        layout.validate()?;
        if layers.len() != layout.n_layers {
            return Err(shape(OP, "layers", layout.n_layers, layers.len()));
        }
        let n = layers.first().map_or(0, |l| l.k.rows());
        for (i, l) in layers.iter().enumerate() {
            if l.k.rows() != n || l.v.rows() != n {
                return Err(shape(
                    OP,
                    format!("layer {i} token rows (k, v)"),
                    n,
                    format!("({}, {})", l.k.rows(), l.v.rows()),
                ));
            }
            if l.k.cols() != layout.k_features() {
                return Err(shape(
                    OP,
                    format!("layer {i} k features"),
                    layout.k_features(),
                    l.k.cols(),
                ));
            }
            if l.v.cols() != layout.v_features() {
                return Err(shape(
                    OP,
                    format!("layer {i} v features"),
                    layout.v_features(),
                    l.v.cols(),
                ));
            }
        }
        Ok(ChunkKv { layout, offset, layers })
    }

    /// A chunk of zeros (a destination buffer).
    pub fn zeros(layout: KvLayout, offset: i64, n_tokens: usize, dtype: DType) -> Result<ChunkKv> {
        let layers = (0..layout.n_layers)
            .map(|_| LayerKv {
                k: Mat::zeros(n_tokens, layout.k_features(), dtype),
                v: Mat::zeros(n_tokens, layout.v_features(), dtype),
            })
            .collect();
        ChunkKv::new(layout, offset, layers)
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }
    pub fn offset(&self) -> i64 {
        self.offset
    }
    pub fn n_tokens(&self) -> usize {
        self.layers.first().map_or(0, |l| l.k.rows())
    }
    pub fn layers(&self) -> &[LayerKv] {
        &self.layers
    }
    pub fn layers_mut(&mut self) -> &mut [LayerKv] {
        &mut self.layers
    }
    pub fn into_layers(self) -> Vec<LayerKv> {
        self.layers
    }
    pub(crate) fn set_offset(&mut self, offset: i64) {
        self.offset = offset;
    }

    /// Storage dtype of the first layer's keys.
    pub fn dtype(&self) -> DType {
        self.layers.first().map_or(DType::F32, |l| l.k.dtype())
    }

    /// Bytes of K and V over all layers.
    pub fn kv_bytes(&self) -> usize {
        self.layers.iter().map(|l| l.k.bytes() + l.v.bytes()).sum()
    }

    /// The same KV stored as `dtype`.
    /// Tokens `start..start + n` as a chunk of their own at `offset() + start` (a run of text
    /// prefilled in one call, handed out chunk by chunk). Errors past the end.
    pub fn rows(&self, start: usize, n: usize) -> Result<ChunkKv> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Some(LayerKv {
                    k: l.k.row_range(start, n)?,
                    v: l.v.row_range(start, n)?,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                shape(
                    "ChunkKv::rows",
                    "tokens taken",
                    format!("at most the chunk's {}", self.n_tokens()),
                    format!("{start}..{start}+{n}"),
                )
            })?;
        ChunkKv::new(self.layout, self.offset + start as i64, layers)
    }

    /// The largest |a − b| over every K and V value of two chunks of the same shape (layout,
    /// offset and tokens); `None` where they differ in shape.
    pub fn max_abs_diff(&self, other: &ChunkKv) -> Option<f32> {
        if (self.layout, self.offset, self.n_tokens()) != (other.layout, other.offset, other.n_tokens()) {
            return None;
        }
        let mut m = 0f32;
        for (x, y) in self.layers.iter().zip(&other.layers) {
            for (p, q) in [(&x.k, &y.k), (&x.v, &y.v)] {
                for (u, v) in p.to_f32_vec().iter().zip(q.to_f32_vec()) {
                    m = m.max((u - v).abs());
                }
            }
        }
        Some(m)
    }

    pub fn to_dtype(&self, dtype: DType) -> ChunkKv {
        ChunkKv {
            layout: self.layout,
            offset: self.offset,
            layers: self
                .layers
                .iter()
                .map(|l| LayerKv {
                    k: l.k.to_dtype(dtype),
                    v: l.v.to_dtype(dtype),
                })
                .collect(),
        }
    }

    /// Errors on the first NaN or infinity.
    pub fn check_finite(&self, op: &'static str) -> Result<()> {
        for (i, l) in self.layers.iter().enumerate() {
            l.k.check_finite(op, &format!("layer {i} k"))?;
            l.v.check_finite(op, &format!("layer {i} v"))?;
        }
        Ok(())
    }

    /// Checks that `other` has the same layout and token count.
    pub(crate) fn check_same_shape(&self, op: &'static str, what: &str, other: &ChunkKv) -> Result<()> {
        if self.layout != other.layout {
            return Err(shape(
                op,
                format!("{what} layout"),
                format!("{:?}", self.layout),
                format!("{:?}", other.layout),
            ));
        }
        if self.n_tokens() != other.n_tokens() {
            return Err(shape(op, format!("{what} tokens"), self.n_tokens(), other.n_tokens()));
        }
        Ok(())
    }
}
