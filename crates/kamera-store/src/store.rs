//! The `ChunkStore` trait, its counters, and the cost-aware eviction score both tiers use.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;
use crate::id::{Key, ModelFp};
use crate::record::Record;

/// A content-addressed store of canonical KV, patches and orbit patches.
///
/// `get` returns `Err` with [`crate::Error::is_miss`] true for a damaged record, an unknown
/// format version or a record of another model; [`ChunkStore::lookup`] turns those into a
/// counted miss, which is what a runtime wants (re-encode, never serve wrong KV).
pub trait ChunkStore: Send + Sync {
    /// The record under `key`, verified, or `None`.
    fn get(&self, key: &Key) -> Result<Option<Arc<Record>>>;
    /// Stores `record` under `key` (replacing any). Durable after [`ChunkStore::flush`].
    fn put(&self, key: &Key, record: Record) -> Result<()>;
    /// Whether a record (possibly damaged) is stored under `key`.
    fn contains(&self, key: &Key) -> Result<bool>;
    /// Removes the record under `key`; whether one was there.
    fn remove(&self, key: &Key) -> Result<bool>;
    /// Keys stored, of one model or of all, in key order.
    fn keys(&self, model: Option<ModelFp>) -> Result<Vec<Key>>;
    /// Makes every `put` and `remove` that returned before this call durable.
    fn flush(&self) -> Result<()>;
    /// Counters since open.
    fn stats(&self) -> Stats;
    /// Marks `key` as used now, for the store's eviction order, without reading it (a memory
    /// tier in front calls this on its hits). Recency only: a store may ignore it.
    fn touch(&self, _key: &Key) -> Result<()> {
        Ok(())
    }

    /// `get`, with unusable records turned into a miss (logged; counted by `get`).
    fn lookup(&self, key: &Key) -> Result<Option<Arc<Record>>> {
        match self.get(key) {
            Err(e) if e.is_miss() => {
                tracing::warn!(%key, error = %e, "store: unusable record treated as a miss");
                Ok(None)
            }
            r => r,
        }
    }
}

/// A boxed or shared store is a store (so tiers can be stacked at run time, and a runtime can
/// hand one store to its executor and its own checks).
macro_rules! forward_store {
    ($ptr:ident) => {
        impl<S: ChunkStore + ?Sized> ChunkStore for $ptr<S> {
            fn get(&self, key: &Key) -> Result<Option<Arc<Record>>> {
                (**self).get(key)
            }
            fn put(&self, key: &Key, record: Record) -> Result<()> {
                (**self).put(key, record)
            }
            fn contains(&self, key: &Key) -> Result<bool> {
                (**self).contains(key)
            }
            fn remove(&self, key: &Key) -> Result<bool> {
                (**self).remove(key)
            }
            fn keys(&self, model: Option<ModelFp>) -> Result<Vec<Key>> {
                (**self).keys(model)
            }
            fn flush(&self) -> Result<()> {
                (**self).flush()
            }
            fn stats(&self) -> Stats {
                (**self).stats()
            }
            fn touch(&self, key: &Key) -> Result<()> {
                (**self).touch(key)
            }
            fn lookup(&self, key: &Key) -> Result<Option<Arc<Record>>> {
                (**self).lookup(key)
            }
        }
    };
}
forward_store!(Box);
forward_store!(Arc);

/// Counters of a store (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records served from the memory tier.
    pub mem_hits: u64,
    /// Records served from disk.
    pub disk_hits: u64,
    /// Records served from a remote store (Redis).
    pub remote_hits: u64,
    /// Lookups that found nothing.
    pub misses: u64,
    /// Records that failed their checksum or did not parse.
    pub corrupt: u64,
    /// Records of an unknown format version, or coded in a patch basis the store was not given.
    pub version: u64,
    /// Records of another model.
    pub foreign: u64,
    /// Records stored in pieces of which a piece was missing (evicted or expired first).
    pub incomplete: u64,
    pub puts: u64,
    pub removes: u64,
    /// Records dropped by the eviction policy (memory tier and disk budget).
    pub evictions: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl Stats {
    /// Misses including unusable records.
    pub fn all_misses(&self) -> u64 {
        self.misses + self.corrupt + self.version + self.foreign + self.incomplete
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub mem_hits: AtomicU64,
    pub disk_hits: AtomicU64,
    pub remote_hits: AtomicU64,
    pub misses: AtomicU64,
    pub corrupt: AtomicU64,
    pub version: AtomicU64,
    pub foreign: AtomicU64,
    pub incomplete: AtomicU64,
    pub puts: AtomicU64,
    pub removes: AtomicU64,
    pub evictions: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    pub fn snapshot(&self) -> Stats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            mem_hits: g(&self.mem_hits),
            disk_hits: g(&self.disk_hits),
            remote_hits: g(&self.remote_hits),
            misses: g(&self.misses),
            corrupt: g(&self.corrupt),
            version: g(&self.version),
            foreign: g(&self.foreign),
            incomplete: g(&self.incomplete),
            puts: g(&self.puts),
            removes: g(&self.removes),
            evictions: g(&self.evictions),
            bytes_read: g(&self.bytes_read),
            bytes_written: g(&self.bytes_written),
        }
    }
    /// Counts an error of `get` by its kind.
    pub fn count_err(&self, e: &crate::Error) {
        use crate::Error as E;
        match e {
            E::Corrupt { .. } | E::Ops { .. } => Counters::add(&self.corrupt, 1),
            E::Version { .. } | E::MissingBasis { .. } => Counters::add(&self.version, 1),
            E::ForeignModel { .. } => Counters::add(&self.foreign, 1),
            E::Incomplete { .. } => Counters::add(&self.incomplete, 1),
            _ => {}
        }
    }
}

/// Cost-aware eviction: a record's worth is the recompute time it saves per byte it occupies,
/// halved for every `half_life` ticks (accesses to the store) since it was last used. The
/// lowest score goes first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictionPolicy {
    pub half_life: f64,
}

impl Default for EvictionPolicy {
    fn default() -> Self {
        EvictionPolicy { half_life: 256.0 }
    }
}

impl EvictionPolicy {
    /// Score of a record of `bytes` saving `cost_us`, last used `age` ticks ago.
    pub fn score(&self, bytes: u64, cost_us: u64, age: u64) -> f64 {
        let worth = (cost_us as f64 + 1.0) / (bytes as f64 + 1.0);
        worth * (-(age as f64) / self.half_life.max(1e-9) * std::f64::consts::LN_2).exp()
    }
}
