//! `Layered`: a near store (local disk) in front of a far one (Redis): reads try near then far
//! and copy far hits near; writes go to both, to the far store either in the caller
//! (write-through, the default) or from a bounded queue drained by a background thread
//! ([`Layered::write_behind`]). When the far store cannot be reached it is skipped (one warning,
//! not one per call) and tried again after a pause.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SendError, SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
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
    far: Arc<Far<B>>,
    behind: Option<Behind>,
    counters: Counters,
}

/// The far store and its outage state, shared with the write-behind thread.
struct Far<B> {
    store: B,
    /// Pause after a failure, in ns.
    retry_after: AtomicU64,
    degraded: AtomicBool,
    /// While degraded: no far call before this instant.
    next_try: Mutex<Option<Instant>>,
    outages: AtomicU64,
}

/// The write-behind queue: puts waiting for the far store, and the thread that writes them.
struct Behind {
    tx: Option<SyncSender<(Key, Record)>>,
    /// Puts queued or being written, and a signal when it drops to 0.
    pending: Arc<(Mutex<u64>, Condvar)>,
    /// Far writes of the queue that failed with an error other than an outage.
    errors: Arc<AtomicU64>,
    worker: Option<JoinHandle<()>>,
}

impl<A: ChunkStore, B: ChunkStore> Layered<A, B> {
    /// `near` in front of `far`, writing through to both; after a far failure, the far store is
    /// tried again after 1 s.
    pub fn new(near: A, far: B) -> Layered<A, B> {
        Layered {
            near,
            far: Arc::new(Far {
                store: far,
                retry_after: AtomicU64::new(1_000_000_000),
                degraded: AtomicBool::new(false),
                next_try: Mutex::new(None),
                outages: AtomicU64::new(0),
            }),
            behind: None,
            counters: Counters::default(),
        }
    }

    /// How long to skip the far store after it failed.
    pub fn retry_after(self, pause: Duration) -> Layered<A, B> {
        let ns = pause.as_nanos().min(u64::MAX as u128) as u64;
        self.far.retry_after.store(ns, Ordering::Relaxed);
        self
    }

    pub fn near(&self) -> &A {
        &self.near
    }
    pub fn far(&self) -> &B {
        &self.far.store
    }

    /// Whether the far store's last call failed (it is being skipped or retried).
    pub fn is_degraded(&self) -> bool {
        self.far.degraded.load(Ordering::Relaxed)
    }

    /// How many times the far store went from answering to failing (one warning each).
    pub fn outages(&self) -> u64 {
        self.far.outages.load(Ordering::Relaxed)
    }

    /// Puts queued for the far store and not yet written (0 when writing through).
    pub fn queued(&self) -> u64 {
        self.behind.as_ref().map_or(0, |b| *lock(&b.pending.0))
    }

    /// Queued far writes that failed with an error other than an outage (each also logged).
    /// Writes skipped during an outage are not counted: as in write-through, they stay local.
    pub fn write_behind_errors(&self) -> u64 {
        self.behind.as_ref().map_or(0, |b| b.errors.load(Ordering::Relaxed))
    }

    /// Waits until every queued far write has been made (or skipped by an outage). Should the
    /// thread have died, what it left in the queue is logged and counted as errors.
    fn drain(&self) {
        let Some(b) = &self.behind else { return };
        let (n, done) = &*b.pending;
        let mut n = lock(n);
        while *n > 0 {
            if b.worker.as_ref().is_none_or(|w| w.is_finished()) {
                tracing::error!(
                    lost = *n,
                    "layered store: the write-behind thread died; queued far writes lost"
                );
                b.errors.fetch_add(*n, Ordering::Relaxed);
                *n = 0;
                break;
            }
            n = done
                .wait_timeout(n, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Counts one queued write as done when dropped.
struct Done<'a>(&'a (Mutex<u64>, Condvar));

impl Drop for Done<'_> {
    fn drop(&mut self) {
        done_one(self.0);
    }
}

fn done_one(pending: &(Mutex<u64>, Condvar)) {
    let mut n = lock(&pending.0);
    *n = n.saturating_sub(1);
    if *n == 0 {
        pending.1.notify_all();
    }
}

impl<A: ChunkStore, B: ChunkStore + 'static> Layered<A, B> {
    /// Writes to the far store from a queue of at most `queue` puts (at least 1), drained by a
    /// background thread, instead of in the caller. A `put` returns once the near store has the
    /// record; other hosts see it when the thread has written it, and [`ChunkStore::flush`]
    /// waits for that. When the queue is full, `put` waits for room (back-pressure): a put is
    /// never dropped. `remove` waits for the queue first, so a queued put cannot bring back a
    /// removed record. Dropping the store writes what is queued.
    ///
    /// Durability: a queued record is in the near store only; if the process dies before the
    /// thread writes it, the far store never gets it (the fleet re-encodes it on a miss).
    pub fn write_behind(mut self, queue: usize) -> Layered<A, B> {
        if self.behind.is_some() {
            return self;
        }
        let (tx, rx) = sync_channel::<(Key, Record)>(queue.max(1));
        let pending = Arc::new((Mutex::new(0u64), Condvar::new()));
        let errors = Arc::new(AtomicU64::new(0));
        let (far, p, errs) = (self.far.clone(), pending.clone(), errors.clone());
        let worker = std::thread::Builder::new()
            .name("kamera-store-write-behind".into())
            .spawn(move || {
                for (key, record) in rx {
                    // Counted down even if the put panics, so `flush` never waits forever.
                    let _done = Done(&p);
                    if let Some(Err(e)) = far.op("put (write-behind)", |b| b.put(&key, record)) {
                        errs.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%key, error = %e, "layered store: a write-behind put to the far store failed");
                    }
                }
            })
            .ok();
        match worker {
            Some(worker) => {
                self.behind = Some(Behind {
                    tx: Some(tx),
                    pending,
                    errors,
                    worker: Some(worker),
                });
            }
            None => tracing::warn!("layered store: no thread for write-behind; writing through"),
        }
        self
    }
}

impl<B: ChunkStore> Far<B> {
    fn skip(&self) -> bool {
        self.degraded.load(Ordering::Relaxed) && lock(&self.next_try).is_some_and(|t| Instant::now() < t)
    }

    /// Runs `f` on the far store: `None` when it is skipped or unavailable (then degraded), the
    /// result otherwise (a bad record is an answer, not an outage).
    fn op<T>(&self, op: &'static str, f: impl FnOnce(&B) -> Result<T>) -> Option<Result<T>> {
        if self.skip() {
            return None;
        }
        match f(&self.store) {
            Err(e) if e.is_unavailable() => {
                let retry_after = Duration::from_nanos(self.retry_after.load(Ordering::Relaxed));
                *lock(&self.next_try) = Some(Instant::now() + retry_after);
                if !self.degraded.swap(true, Ordering::Relaxed) {
                    self.outages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        op,
                        error = %e,
                        ?retry_after,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<A, B> Drop for Layered<A, B> {
    /// Closes the write-behind queue and waits for the thread to write what it holds.
    fn drop(&mut self) {
        if let Some(b) = &mut self.behind {
            drop(b.tx.take());
            if let Some(w) = b.worker.take() {
                let _ = w.join();
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
        match self.far.op("get", |b| b.get(key)) {
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
        if self.far.skip() {
            return self.near.put(key, record);
        }
        self.near.put(key, record.clone())?;
        if let Some(b) = &self.behind
            && let Some(tx) = &b.tx
        {
            *lock(&b.pending.0) += 1;
            // Blocks while the queue is full: back-pressure, never a dropped write.
            match tx.send((*key, record)) {
                Ok(()) => return Ok(()),
                Err(SendError((_, record))) => {
                    done_one(&b.pending);
                    tracing::warn!(%key, "layered store: the write-behind thread is gone; writing through");
                    return self.far.op("put", |f| f.put(key, record)).unwrap_or(Ok(()));
                }
            }
        }
        self.far.op("put", |b| b.put(key, record)).unwrap_or(Ok(()))
    }

    fn contains(&self, key: &Key) -> Result<bool> {
        if self.near.contains(key)? {
            return Ok(true);
        }
        self.far.op("contains", |b| b.contains(key)).unwrap_or(Ok(false))
    }

    /// Removes from both; a far store that is down keeps its copy (it is content-addressed,
    /// so it can only ever be served as the same record).
    fn remove(&self, key: &Key) -> Result<bool> {
        self.drain();
        let near = self.near.remove(key)?;
        let far = self.far.op("remove", |b| b.remove(key)).unwrap_or(Ok(false))?;
        if near || far {
            Counters::add(&self.counters.removes, 1);
        }
        Ok(near || far)
    }

    fn keys(&self, model: Option<ModelFp>) -> Result<Vec<Key>> {
        let mut keys = self.near.keys(model)?;
        if let Some(far) = self.far.op("keys", |b| b.keys(model)) {
            keys.extend(far?);
            keys.sort();
            keys.dedup();
        }
        Ok(keys)
    }

    /// Flushes the near store, waits for the write-behind queue to be written, then flushes
    /// the far store.
    fn flush(&self) -> Result<()> {
        self.near.flush()?;
        self.drain();
        self.far.op("flush", |b| b.flush()).unwrap_or(Ok(()))
    }

    fn touch(&self, key: &Key) -> Result<()> {
        self.near.touch(key)?;
        self.far.op("touch", |b| b.touch(key)).unwrap_or(Ok(()))
    }

    /// Both stores' counters summed, except `misses`, `puts` and `removes`, which count this
    /// store's own calls (a far hit is not also a near miss).
    fn stats(&self) -> Stats {
        let (a, b, mine) = (self.near.stats(), self.far.store.stats(), self.counters.snapshot());
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
