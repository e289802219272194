//! `Tiered`: a memory tier with its own byte budget in front of any [`ChunkStore`]. Reads fill
//! it, writes go through it to the backing store; when over budget it drops the record with the
//! lowest [`EvictionPolicy`] score (recompute µs saved per byte, decayed by age).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::Result;
use crate::id::{Key, ModelFp};
use crate::record::Record;
use crate::store::{ChunkStore, Counters, EvictionPolicy, Stats};

struct Entry {
    rec: Arc<Record>,
    bytes: u64,
    tick: u64,
}

#[derive(Default)]
struct Mem {
    map: HashMap<Key, Entry>,
    total: u64,
    clock: u64,
}

/// A memory tier over `S`.
pub struct Tiered<S> {
    inner: S,
    budget: u64,
    policy: EvictionPolicy,
    mem: Mutex<Mem>,
    counters: Counters,
}

impl<S: ChunkStore> Tiered<S> {
    /// A memory tier of at most `budget_bytes` (decoded payload bytes) over `inner`.
    pub fn new(inner: S, budget_bytes: u64, policy: EvictionPolicy) -> Tiered<S> {
        Tiered {
            inner,
            budget: budget_bytes,
            policy,
            mem: Mutex::new(Mem::default()),
            counters: Counters::default(),
        }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Payload bytes held in memory.
    pub fn mem_bytes(&self) -> u64 {
        self.lock().total
    }

    /// Whether `key` is resident in memory.
    pub fn in_memory(&self, key: &Key) -> bool {
        self.lock().map.contains_key(key)
    }

    /// Drops everything from the memory tier (the backing store keeps it).
    pub fn clear_memory(&self) {
        let mut m = self.lock();
        m.map.clear();
        m.total = 0;
    }

    fn lock(&self) -> MutexGuard<'_, Mem> {
        self.mem.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admit(&self, key: Key, rec: Arc<Record>) {
        let bytes = rec.bytes() as u64;
        if bytes > self.budget {
            return;
        }
        let mut m = self.lock();
        m.clock += 1;
        let tick = m.clock;
        if let Some(old) = m.map.insert(key, Entry { rec, bytes, tick }) {
            m.total -= old.bytes;
        }
        m.total += bytes;
        while m.total > self.budget {
            let now = m.clock;
            let victim = m
                .map
                .iter()
                .filter(|(k, _)| **k != key)
                .min_by(|(_, a), (_, b)| {
                    let sa = self.policy.score(a.bytes, a.rec.cost_us, now - a.tick);
                    let sb = self.policy.score(b.bytes, b.rec.cost_us, now - b.tick);
                    sa.total_cmp(&sb)
                })
                .map(|(k, _)| *k);
            let Some(v) = victim else { break };
            if let Some(e) = m.map.remove(&v) {
                m.total -= e.bytes;
                Counters::add(&self.counters.evictions, 1);
            }
        }
    }
}

impl<S: ChunkStore> ChunkStore for Tiered<S> {
    fn get(&self, key: &Key) -> Result<Option<Arc<Record>>> {
        let hit = {
            let mut m = self.lock();
            m.clock += 1;
            let now = m.clock;
            m.map.get_mut(key).map(|e| {
                e.tick = now;
                Counters::add(&self.counters.mem_hits, 1);
                e.rec.clone()
            })
        };
        if let Some(rec) = hit {
            // The backing store's eviction order must see this use too, or a record hot in
            // memory ages there and is the first dropped under its disk budget.
            if let Err(e) = self.inner.touch(key) {
                tracing::debug!(%key, error = %e, "store: recency update failed");
            }
            return Ok(Some(rec));
        }
        let r = self.inner.get(key)?;
        if let Some(rec) = &r {
            self.admit(*key, rec.clone());
        }
        Ok(r)
    }

    fn put(&self, key: &Key, record: Record) -> Result<()> {
        let rec = Arc::new(record);
        self.inner.put(key, (*rec).clone())?;
        self.admit(*key, rec);
        Ok(())
    }

    fn contains(&self, key: &Key) -> Result<bool> {
        if self.in_memory(key) {
            return Ok(true);
        }
        self.inner.contains(key)
    }

    fn remove(&self, key: &Key) -> Result<bool> {
        {
            let mut m = self.lock();
            if let Some(e) = m.map.remove(key) {
                m.total -= e.bytes;
            }
        }
        self.inner.remove(key)
    }

    fn keys(&self, model: Option<ModelFp>) -> Result<Vec<Key>> {
        self.inner.keys(model)
    }

    fn touch(&self, key: &Key) -> Result<()> {
        self.inner.touch(key)
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    fn stats(&self) -> Stats {
        let mine = self.counters.snapshot();
        let mut s = self.inner.stats();
        s.mem_hits += mine.mem_hits;
        s.evictions += mine.evictions;
        s
    }
}

/// A store held only in memory (tests, and runs without a disk): a `HashMap` of records.
#[derive(Default)]
pub struct MemStore {
    map: Mutex<std::collections::BTreeMap<Key, Arc<Record>>>,
    counters: Counters,
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }
    fn lock(&self) -> MutexGuard<'_, std::collections::BTreeMap<Key, Arc<Record>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ChunkStore for MemStore {
    fn get(&self, key: &Key) -> Result<Option<Arc<Record>>> {
        let r = self.lock().get(key).cloned();
        let c = if r.is_some() {
            &self.counters.mem_hits
        } else {
            &self.counters.misses
        };
        Counters::add(c, 1);
        Ok(r)
    }
    fn put(&self, key: &Key, record: Record) -> Result<()> {
        Counters::add(&self.counters.puts, 1);
        self.lock().insert(*key, Arc::new(record));
        Ok(())
    }
    fn contains(&self, key: &Key) -> Result<bool> {
        Ok(self.lock().contains_key(key))
    }
    fn remove(&self, key: &Key) -> Result<bool> {
        Ok(self.lock().remove(key).is_some())
    }
    fn keys(&self, model: Option<ModelFp>) -> Result<Vec<Key>> {
        Ok(self
            .lock()
            .keys()
            .filter(|k| model.is_none_or(|m| k.model == m))
            .copied()
            .collect())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn stats(&self) -> Stats {
        self.counters.snapshot()
    }
}
