//! The model side of the executor: an [`Encoder`] prefills chunks (alone, or after the window's
//! KV) and places stored KV (relocate + patch). kamera-model's runners implement it in the
//! runtime (kamera-agent's session encoder, on a live model context and a `Backend`); the tests
//! implement it over kamera-ops alone.

use kamera_ops::{ChunkKv, DType, KvLayout, Patch, Placement, RopeSpec};
use kamera_store::ChunkId;
use serde::{Deserialize, Serialize};

/// A boxed error of the model runner.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One resident chunk of the window's KV before a prefill: its id, the version the executor gave
/// this KV (derived from what it was computed from: equal versions, equal KV), and the KV itself.
#[derive(Debug, Clone, Copy)]
pub struct Part<'a> {
    pub chunk: ChunkId,
    pub version: u64,
    pub kv: &'a ChunkKv,
}

/// The window's KV of positions `0..end`: resident chunks tiling it exactly, in position order.
#[derive(Debug, Clone, Default)]
pub struct Prior<'a> {
    pub parts: Vec<Part<'a>>,
    pub end: i64,
}

impl Prior<'_> {
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
    /// The prior as one KV at positions `0..` in `dtype` (what a runner without a live context
    /// prefills after), or `None` when nothing precedes.
    pub fn assemble(&self, rope: &RopeSpec, dtype: DType) -> Result<Option<ChunkKv>, kamera_ops::Error> {
        if self.parts.is_empty() {
            return Ok(None);
        }
        let placements: Vec<Placement<'_>> = self
            .parts
            .iter()
            .map(|p| Placement {
                chunk: p.kv,
                patch: None,
            })
            .collect();
        kamera_ops::assemble(&placements, rope, 0, dtype).map(Some)
    }
}

/// What the executor asks of the model.
pub trait Encoder {
    fn layout(&self) -> KvLayout;
    fn rope(&self) -> &RopeSpec;
    /// Positions `chunk` occupies: its tokens, unless it declared fewer (an image under M-RoPE).
    fn span(&self, _chunk: &ChunkId, n_tokens: usize) -> i64 {
        n_tokens as i64
    }
    /// `chunk`'s canonical KV: prefilled alone at position 0, with no context.
    fn prefill_alone(&mut self, chunk: ChunkId) -> Result<ChunkKv, BoxError>;
    /// `chunk`'s KV at positions `at..`, after `prior` (the window's KV of positions `0..at`).
    /// `version` is what the executor will call this KV if it becomes resident: an encoder that
    /// keeps a live context may keep the rows it appended under `(chunk, version)`.
    fn prefill_after(&mut self, chunk: ChunkId, at: i64, prior: &Prior<'_>, version: u64) -> Result<ChunkKv, BoxError>;
    /// Before a run of prefills in place: `prefills` (chunk, position) in the order the executor
    /// will ask for them with [`Encoder::prefill_after`], each at the end of the one before. An
    /// encoder may make them in one model call at the first (one pass over the weights instead
    /// of one per chunk) and hand each out when it is asked for, in that order after the one
    /// before it. Default: nothing (each is computed when asked).
    fn ahead(&mut self, _prefills: &[(ChunkId, i64)]) {}
    /// `kv` relocated to start at `at` (exact RoPE re-rotation), plus `patch` if any, in one pass
    /// (kamera-ops on the CPU; a runtime routes it to its `Backend`).
    fn reuse(&mut self, kv: &ChunkKv, patch: Option<&Patch>, at: i64, dtype: DType) -> Result<ChunkKv, BoxError> {
        let mut dst = ChunkKv::zeros(*kv.layout(), at, kv.n_tokens(), dtype)?;
        kamera_ops::reuse_into(kv, patch, self.rope(), &mut dst, 0)?;
        Ok(dst)
    }
    /// Makes a live context, if the encoder keeps one, hold exactly `prior` (before a model call
    /// on the window). Nothing to do for an encoder without one.
    fn sync(&mut self, _prior: &Prior<'_>) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Milliseconds spent executing steps, by kind of work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Forward passes: new chunks alone and in place, re-prefills, repairs.
    pub prefill_ms: f64,
    /// Conditioned prefills + SVDs forming patches, and difference patches.
    pub patch_ms: f64,
    /// Relocating and patching chunks, reading them from the store, keeping them at eviction.
    pub place_ms: f64,
    /// Writing moved chunks into the model's live context.
    pub sync_ms: f64,
}

impl Timings {
    pub fn total_ms(&self) -> f64 {
        self.prefill_ms + self.patch_ms + self.place_ms + self.sync_ms
    }
    pub fn add(&mut self, o: &Timings) {
        self.prefill_ms += o.prefill_ms;
        self.patch_ms += o.patch_ms;
        self.place_ms += o.place_ms;
        self.sync_ms += o.sync_ms;
    }
}
