//! Versions of resident KV, derived from what the KV was computed from: the same chunk prefilled
//! at the same position after the same resident versions, or the same canonical KV placed at the
//! same position with the same patch, or the same KV moved to the same position, gets the same
//! version. Equal versions so mean equal KV (up to the kernels' rounding), and a live context, or
//! prompt rows computed over one window, are found again when the same layout comes back (a
//! revisit, a recall), as a radix cache finds a repeated token sequence.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use kamera_ops::ChunkKv;
use kamera_store::{ChunkId, Key};

use crate::encoder::Prior;

/// A resident chunk's KV at its window position, and its version: what it was computed from,
/// hashed (equal versions, equal KV up to rounding).
#[derive(Debug, Clone)]
pub struct Resident {
    pub kv: ChunkKv,
    pub version: u64,
    /// The version and offset the KV had where it was made, before any relocation (RoPE
    /// rotations compose exactly, so a chunk moved twice equals one moved once from there, and
    /// one moved back equals the KV it was made as).
    pub(crate) origin: (u64, i64),
}

impl Resident {
    /// KV made where it is (prefilled or placed).
    pub(crate) fn made(kv: ChunkKv, version: u64) -> Resident {
        let at = kv.offset();
        Resident {
            kv,
            version,
            origin: (version, at),
        }
    }

    /// This KV moved to `kv` (its new offset), versioned from where it was made.
    pub(crate) fn moved(&self, kv: ChunkKv) -> Resident {
        let (origin, made_at) = self.origin;
        let version = if kv.offset() == made_at {
            origin
        } else {
            hashed(("relocate", origin, kv.offset()))
        };
        Resident {
            kv,
            version,
            origin: self.origin,
        }
    }
}

/// Derives versions; tracks which canonical KV of each chunk placements read.
#[derive(Debug, Default)]
pub(crate) struct Versions {
    /// A chunk's canonical generation: bumped each time this executor computes or writes a
    /// canonical KV for it (0: the store's record as first read).
    canonical: BTreeMap<ChunkId, u64>,
    generations: u64,
}

fn hashed(what: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    what.hash(&mut h);
    h.finish()
}

impl Versions {
    /// `chunk` has a new canonical KV (prefilled alone, or written to the store from the window).
    pub fn new_canonical(&mut self, chunk: ChunkId) {
        self.generations += 1;
        self.canonical.insert(chunk, self.generations);
    }

    /// `chunk` prefilled at `at` after `prior`.
    pub fn prefilled(&self, chunk: ChunkId, at: i64, prior: &Prior<'_>) -> u64 {
        let parts: Vec<(ChunkId, u64)> = prior.parts.iter().map(|p| (p.chunk, p.version)).collect();
        hashed(("prefill", chunk, at, parts))
    }

    /// `chunk`'s canonical KV placed at `at` with `patch`.
    pub fn placed(&self, chunk: ChunkId, at: i64, patch: Option<&Key>) -> u64 {
        let generation = self.canonical.get(&chunk).copied().unwrap_or(0);
        hashed(("place", chunk, generation, at, patch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(b: u8) -> ChunkId {
        ChunkId([b; 32])
    }

    #[test]
    fn versions_name_the_computation_not_the_time() {
        let mut v = Versions::default();
        let (a, b) = (id(1), id(2));
        assert_eq!(v.placed(a, 10, None), v.placed(a, 10, None));
        assert_ne!(v.placed(a, 10, None), v.placed(a, 11, None));
        assert_ne!(v.placed(a, 10, None), v.placed(b, 10, None));
        let before = v.placed(a, 10, None);
        v.new_canonical(a);
        assert_ne!(v.placed(a, 10, None), before, "a new canonical KV is a new computation");
        assert_eq!(v.placed(b, 10, None), v.placed(b, 10, None));
        let empty = Prior::default();
        assert_eq!(v.prefilled(a, 0, &empty), v.prefilled(a, 0, &empty));
        assert_ne!(v.prefilled(a, 0, &empty), v.placed(a, 0, None));
    }

    /// A chunk moved twice has the version of one moved once to the same place, and one moved
    /// back has the version it was made with.
    #[test]
    fn relocations_compose() {
        use kamera_ops::{DType, KvLayout};
        let kv = |at| ChunkKv::zeros(KvLayout::mha(1, 1, 4), at, 2, DType::F32).unwrap();
        let made = Resident::made(kv(10), 42);
        let twice = made.moved(kv(20)).moved(kv(30));
        let once = made.moved(kv(30));
        assert_eq!(twice.version, once.version);
        assert_ne!(once.version, made.version);
        assert_eq!(twice.moved(kv(10)).version, 42, "moved back: the KV it was made as");
    }
}
