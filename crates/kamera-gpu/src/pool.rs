//! The device pool (`DevicePool`): canonical chunks resident on the device by 32-byte key under a
//! byte budget, least recently used evicted first; the bookkeeping (`Slots`) is independent of
//! CUDA, so it is tested everywhere.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::{CudaBackend, ResidentChunk};
use kamera_ops::ChunkKv;

/// Counters and occupancy of a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    pub resident: usize,
    pub bytes: usize,
    pub budget: usize,
    pub hits: u64,
    pub uploads: u64,
    pub evictions: u64,
}

/// Entries with sizes under a byte budget; `insert` evicts the least recently used until the
/// new entry fits.
#[derive(Debug)]
pub struct Slots<T> {
    map: HashMap<[u8; 32], (T, usize, u64)>,
    clock: u64,
    stats: PoolStats,
}

impl<T> Slots<T> {
    pub fn new(budget: usize) -> Slots<T> {
        Slots {
            map: HashMap::new(),
            clock: 0,
            stats: PoolStats {
                budget,
                ..PoolStats::default()
            },
        }
    }

    pub fn budget(&self) -> usize {
        self.stats.budget
    }

    /// Marks `key` used now; true (a hit) when present.
    pub fn touch(&mut self, key: &[u8; 32]) -> bool {
        self.clock += 1;
        match self.map.get_mut(key) {
            Some(e) => {
                e.2 = self.clock;
                self.stats.hits += 1;
                true
            }
            None => false,
        }
    }

    pub fn get(&self, key: &[u8; 32]) -> Option<&T> {
        self.map.get(key).map(|e| &e.0)
    }

    pub fn contains(&self, key: &[u8; 32]) -> bool {
        self.map.contains_key(key)
    }

    /// Inserts (or replaces) `key`, evicting least recently used entries until `bytes` fits.
    /// An entry larger than the budget is still inserted alone (callers refuse those first).
    pub fn insert(&mut self, key: [u8; 32], value: T, bytes: usize) {
        self.remove(&key);
        while self.stats.bytes + bytes > self.stats.budget {
            let Some(oldest) = self.map.iter().min_by_key(|(_, e)| e.2).map(|(k, _)| *k) else {
                break;
            };
            self.remove(&oldest);
            self.stats.evictions += 1;
        }
        self.clock += 1;
        self.map.insert(key, (value, bytes, self.clock));
        self.stats.bytes += bytes;
        self.stats.uploads += 1;
        self.stats.resident = self.map.len();
    }

    /// Removes `key`; its value, when present.
    pub fn remove(&mut self, key: &[u8; 32]) -> Option<T> {
        let (v, bytes, _) = self.map.remove(key)?;
        self.stats.bytes -= bytes;
        self.stats.resident = self.map.len();
        Some(v)
    }

    pub fn stats(&self) -> PoolStats {
        self.stats
    }
}

/// Canonical chunks resident on the device under a byte budget, least recently used evicted
/// first: the tier above host memory and sled.
#[derive(Debug)]
pub struct DevicePool {
    slots: Slots<ResidentChunk>,
}

impl DevicePool {
    pub fn new(budget_bytes: usize) -> DevicePool {
        DevicePool {
            slots: Slots::new(budget_bytes),
        }
    }

    /// The resident chunk under `key`, uploading `load()` first when it is not there (and
    /// evicting the least recently used chunks to stay within the budget). A chunk larger than
    /// the whole budget is an error: it could never stay resident.
    pub fn get_or_upload(
        &mut self,
        backend: &CudaBackend,
        key: [u8; 32],
        load: impl FnOnce() -> std::result::Result<ChunkKv, String>,
    ) -> Result<&ResidentChunk> {
        const OP: &str = "DevicePool::get_or_upload";
        if !self.slots.touch(&key) {
            let chunk = load().map_err(|detail| Error::Unsupported { op: OP, detail })?;
            if chunk.kv_bytes() > self.slots.budget() {
                return Err(Error::Unsupported {
                    op: OP,
                    detail: format!(
                        "a chunk of {} bytes exceeds the device pool's budget of {} bytes",
                        chunk.kv_bytes(),
                        self.slots.budget()
                    ),
                });
            }
            let resident = backend.upload_chunk(&chunk)?;
            let bytes = resident.bytes();
            self.slots.insert(key, resident, bytes);
        }
        self.slots.get(&key).ok_or(Error::Unsupported {
            op: OP,
            detail: "chunk vanished from the pool".into(),
        })
    }

    /// Drops `key` from the device (a no-op when absent).
    pub fn evict(&mut self, key: &[u8; 32]) {
        self.slots.remove(key);
    }

    pub fn contains(&self, key: &[u8; 32]) -> bool {
        self.slots.contains(key)
    }

    pub fn stats(&self) -> PoolStats {
        self.slots.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::Slots;
    use proptest::prelude::*;

    fn key(i: u8) -> [u8; 32] {
        [i; 32]
    }

    #[test]
    fn evicts_least_recently_used_first() {
        let mut s = Slots::new(30);
        s.insert(key(1), 'a', 10);
        s.insert(key(2), 'b', 10);
        s.insert(key(3), 'c', 10);
        assert!(s.touch(&key(1)));
        s.insert(key(4), 'd', 10);
        assert!(s.contains(&key(1)) && !s.contains(&key(2)) && s.contains(&key(3)) && s.contains(&key(4)));
        assert_eq!(s.stats().evictions, 1);
        assert_eq!(s.stats().bytes, 30);
    }

    proptest! {
        /// Whatever the sequence, bytes are the sum of the entries, never above the budget, and
        /// the entry just inserted is resident.
        #[test]
        fn budget_and_accounting_hold(ops in proptest::collection::vec((0u8..12, 1usize..40, any::<bool>()), 1..200)) {
            let mut s = Slots::new(100);
            let mut sizes = std::collections::HashMap::new();
            for (k, bytes, touch) in ops {
                if touch {
                    s.touch(&key(k));
                } else {
                    s.insert(key(k), k, bytes);
                    sizes.insert(k, bytes);
                    prop_assert!(s.contains(&key(k)));
                }
                let sum: usize = (0..12u8).filter(|i| s.contains(&key(*i))).map(|i| sizes[&i]).sum();
                prop_assert_eq!(s.stats().bytes, sum);
                prop_assert!(s.stats().bytes <= 100);
            }
        }
    }
}
