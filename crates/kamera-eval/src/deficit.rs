//! One chunk's deficit as the simulated record codecs (`tail`, `mixed`, `klt`) take it: its SVDs
//! per layer (K, V), the optional attention weights they were computed under, and its sizes.

use kamera_ops::{KvLayout, PatchWeights, Svd};

/// A chunk's deficit and what its record's bytes are measured against.
#[derive(Clone, Copy)]
pub(crate) struct ChunkDeficit<'a> {
    pub svds: &'a [(Svd, Svd)],
    pub weights: Option<&'a PatchWeights>,
    /// The chunk's tokens.
    pub n: usize,
    pub layout: &'a KvLayout,
    /// The chunk's KV bytes (the budget's denominator).
    pub kv_bytes: usize,
}
