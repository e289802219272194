//! `Layered`: a near store (local disk) in front of a far one (Redis): reads try near then far
//! and copy far hits near; writes go to both. When the far store cannot be reached it is skipped
//! (one warning, not one per call) and tried again after a pause.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::id::{Key, ModelFp};
use crate::record::Record;
use crate::store::{ChunkStore, Counters, Stats};

/// Two stores as tiers: `near` (fast, local, authoritative for errors) and `far` (shared,
/// optional). A far store that fails with [`crate::Error::is_unavailable`] is treated as empty and
/// its writes are skipped until it answers again; `near` errors are returned as they are.
pub struct Layered<A, B> {
    near: A,
    far: B,
    retry_after: Duration,
    degraded: AtomicBool,
    /// While degraded: no far call before this instant.
    next_try: Mutex<Option<Instant>>,
    outages: AtomicU64,
    counters: Counters,
}

impl<A: ChunkStore, B: ChunkStore> Layered<A, B> {
    /// `near` in front of `far`; after a far failure, the far store is tried again after 1 s.
    pub fn new(near: A, far: B) -> Layered<A, B> {
        Layered {
            near,
            far,
            retry_after: Duration::from_secs(1),
            degraded: AtomicBool::new(false),
            next_try: Mutex::new(None),
            outages: AtomicU64::new(0),
            counters: Counters::default(),
        }
    }

    /// How long to skip the far store after it failed.
    pub fn retry_after(mut self, pause: Duration) -> Layered<A, B> {
        self.retry_after = pause;
        self
    }

    pub fn near(&self) -> &A {
        &self.near
    }
    pub fn far(&self) -> &B {
        &self.far
    }

    /// Whether the far store's last call failed (it is being skipped or retried).
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// How many times the far store went from answering to failing (one warning each).
    pub fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    fn skip_far(&self) -> bool {
        self.is_degraded()
            && self
                .next_try
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|t| Instant::now() < t)
    }

    /// Runs `f` on the far store: `None` when it is skipped or unavailable (then degraded), the
    /// result otherwise (a bad record is an answer, not an outage).
    fn far_op<T>(&self, op: &'static str, f: impl FnOnce(&B) -> Result<T>) -> Option<Result<T>> {
        if self.skip_far() {
            return None;
        }
        match f(&self.far) {
            Err(e) if e.is_unavailable() => {
                *self.next_try.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + self.retry_after);
                if !self.degraded.swap(true, Ordering::Relaxed) {
                    self.outages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        op,
                        error = %e,
                        retry_after = ?self.retry_after,
                        "layered store: the far store (Redis) failed; serving from the near store only \
                         and skipping far writes until it answers again"
                    );
                }
                None
            }
            r => {
                if self.degraded.swap(false, Ordering::Relaxed) {
                    tracing::info!(op, "layered store: the far store answers again; using it");
                }
                Some(r)
            }
        }
    }
}

impl<A: ChunkStore, B: ChunkStore> ChunkStore for Layered<A, B> {
    fn get(&self, key: &Key) -> Result<Option<Arc<Record>>> {
        // An unusable near record is a miss there: the far copy may be good and replaces it.
        let near_err = match self.near.get(key) {
            Ok(Some(r)) => return Ok(Some(r)),
            Ok(None) => None,
            Err(e) if e.is_miss() => Some(e),
            Err(e) => return Err(e),
        };
        match self.far_op("get", |b| b.get(key)) {
            Some(Ok(Some(rec))) => {
                if let Err(e) = self.near.put(key, (*rec).clone()) {
                    tracing::warn!(%key, error = %e, "layered store: could not copy a far hit to the near store");
                }
                Ok(Some(rec))
            }
            Some(Err(e)) if e.is_miss() => Err(near_err.unwrap_or(e)),
            Some(Err(e)) => Err(e),
            Some(Ok(None)) | None => {
                Counters::add(&self.counters.misses, 1);
                near_err.map_or(Ok(None), Err)
            }
        }
    }

    fn put(&self, key: &Key, record: Record) -> Result<()> {
        Counters::add(&self.counters.puts, 1);
        if self.skip_far() {
            return self.near.put(key, record);
        }
        self.near.put(key, record.clone())?;
        self.far_op("put", |b| b.put(key, record)).unwrap_or(Ok(()))
    }

    fn contains(&self, key: &Key) -> Result<bool> {
        if self.near.contains(key)? {
            return Ok(true);
        }
        self.far_op("contains", |b| b.contains(key)).unwrap_or(Ok(false))
    }

    /// Removes from both; a far store that is down keeps its copy (it is content-addressed,
    /// so it can only ever be served as the same record).
    fn remove(&self, key: &Key) -> Result<bool> {
        let near = self.near.remove(key)?;
        let far = self.far_op("remove", |b| b.remove(key)).unwrap_or(Ok(false))?;
        if near || far {
            Counters::add(&self.counters.removes, 1);
        }
        Ok(near || far)
    }

    fn keys(&self, model: Option<ModelFp>) -> Result<Vec<Key>> {
        let mut keys = self.near.keys(model)?;
        if let Some(far) = self.far_op("keys", |b| b.keys(model)) {
            keys.extend(far?);
            keys.sort();
            keys.dedup();
        }
        Ok(keys)
    }

    fn flush(&self) -> Result<()> {
        self.near.flush()?;
        self.far_op("flush", |b| b.flush()).unwrap_or(Ok(()))
    }

    fn touch(&self, key: &Key) -> Result<()> {
        self.near.touch(key)?;
        self.far_op("touch", |b| b.touch(key)).unwrap_or(Ok(()))
    }

    /// Both stores' counters summed, except `misses`, `puts` and `removes`, which count this
    /// store's own calls (a far hit is not also a near miss).
    fn stats(&self) -> Stats {
        let (a, b, mine) = (self.near.stats(), self.far.stats(), self.counters.snapshot());
        Stats {
            mem_hits: a.mem_hits + b.mem_hits,
            disk_hits: a.disk_hits + b.disk_hits,
            remote_hits: a.remote_hits + b.remote_hits,
            misses: mine.misses,
            corrupt: a.corrupt + b.corrupt,
            version: a.version + b.version,
            foreign: a.foreign + b.foreign,
            incomplete: a.incomplete + b.incomplete,
            puts: mine.puts,
            removes: mine.removes,
            evictions: a.evictions + b.evictions,
            bytes_read: a.bytes_read + b.bytes_read,
            bytes_written: a.bytes_written + b.bytes_written,
        }
    }
}
