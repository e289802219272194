//! One chunk's deficit as the simulated record codecs (`tail`, `mixed`, `klt`) take it: its SVDs
//! per layer (K, V), the optional attention weights they were computed under, and its sizes.

use kamera_ops::{KvLayout, PatchWeights, Svd};

/// A deficit's parts: SVDs, weights, tokens, layout, KV bytes.
type Parts<'a> = (&'a [(Svd, Svd)], Option<&'a PatchWeights>, usize, &'a KvLayout, usize);

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

impl<'a> ChunkDeficit<'a> {
    /// Its fields as a tuple, for codecs that use all of them.
    pub fn parts(&self) -> Parts<'a> {
        (self.svds, self.weights, self.n, self.layout, self.kv_bytes)
    }

    /// An unweighted deficit (the codecs' unit tests).
    #[cfg(test)]
    pub fn plain(svds: &'a [(Svd, Svd)], n: usize, layout: &'a KvLayout, kv_bytes: usize) -> Self {
        ChunkDeficit {
            svds,
            weights: None,
            n,
            layout,
            kv_bytes,
        }
    }
}
