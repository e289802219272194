//! `SledStore`: records in a sled database (default tree, key = [`Key::to_bytes`], value = the
//! encoded record) and a `meta` tree (same key, value = last-use tick | stored bytes | cost µs)
//! written in one transaction with the record. The meta tree is advisory (eviction order and
//! totals); every read is verified by the record's own checksum.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kamera_ops::{Bases, DType};
use sled::Transactional;

use crate::codec;
use crate::error::{Error, Result};
use crate::id::{Key, ModelFp};
use crate::record::Record;
use crate::report::{GcReport, Usage, VerifyReport};
use crate::store::{ChunkStore, Counters, EvictionPolicy, Stats};

/// Settings of a [`SledStore`].
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// Database directory.
    pub path: PathBuf,
    /// Storage dtype of payloads (`None` keeps each record's own). Default bf16.
    pub dtype: Option<DType>,
    /// Byte budget of the records on disk (encoded sizes); `None` is unbounded.
    pub budget_bytes: Option<u64>,
    pub policy: EvictionPolicy,
    /// sled's page cache in bytes.
    pub cache_bytes: u64,
    /// The patch bases transform-coded records are decoded in (the model's, passed in by whoever
    /// opens the store); a record coded in another is [`Error::MissingBasis`]. Default none.
    pub bases: Bases,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: default_path(),
            dtype: Some(DType::Bf16),
            budget_bytes: None,
            policy: EvictionPolicy::default(),
            cache_bytes: 256 << 20,
            bases: Bases::new(),
        }
    }
}

impl StoreConfig {
    pub fn at(path: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            path: path.into(),
            ..StoreConfig::default()
        }
    }
}

/// `$KAMERA_HOME/store`, else `~/.cache/kamera/store`.
pub fn default_path() -> PathBuf {
    let home = std::env::var_os("KAMERA_HOME").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."))
            .join(".cache")
            .join("kamera")
    });
    home.join("store")
}

/// Per-record bookkeeping in the meta tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub tick: u64,
    pub bytes: u64,
    pub cost_us: u64,
}

impl Meta {
    fn to_bytes(self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&self.tick.to_le_bytes());
        b[8..16].copy_from_slice(&self.bytes.to_le_bytes());
        b[16..].copy_from_slice(&self.cost_us.to_le_bytes());
        b
    }
    fn from_bytes(b: &[u8]) -> Option<Meta> {
        let w = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        Some(Meta {
            tick: w(0)?,
            bytes: w(8)?,
            cost_us: w(16)?,
        })
    }
}

/// The sled-backed canonical store.
pub struct SledStore {
    cfg: StoreConfig,
    db: sled::Db,
    records: sled::Tree,
    meta: sled::Tree,
    clock: AtomicU64,
    total: AtomicU64,
    counters: Counters,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore").field("path", &self.cfg.path).finish()
    }
}

impl SledStore {
    /// Opens (creating) the database at `cfg.path`.
    pub fn open(cfg: StoreConfig) -> Result<SledStore> {
        let db_err = |op, source| Error::Db {
            op,
            path: cfg.path.display().to_string(),
            source,
        };
        // A handle dropped a moment ago (this process, or one that just exited) can still hold
        // sled's file lock while its flusher stops: retry that briefly before giving up.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let db = loop {
            match sled::Config::new()
                .path(&cfg.path)
                .cache_capacity(cfg.cache_bytes)
                .open()
            {
                Err(sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r.map_err(|e| db_err("SledStore::open", e))?,
            }
        };
        let records = (*db).clone();
        let meta = db.open_tree("meta").map_err(|e| db_err("SledStore::open meta", e))?;
        let (mut clock, mut total) = (0u64, 0u64);
        for kv in meta.iter() {
            let (_, v) = kv.map_err(|e| db_err("SledStore::open scan", e))?;
            if let Some(m) = Meta::from_bytes(&v) {
                clock = clock.max(m.tick);
                total += m.bytes;
            }
        }
        tracing::debug!(path = %cfg.path.display(), records = records.len(), total, "store opened");
        Ok(SledStore {
            cfg,
            db,
            records,
            meta,
            clock: AtomicU64::new(clock + 1),
            total: AtomicU64::new(total),
            counters: Counters::default(),
        })
    }

    /// Opens the default store (`$KAMERA_HOME/store`).
    pub fn open_default() -> Result<SledStore> {
        SledStore::open(StoreConfig::default())
    }

    pub fn path(&self) -> &Path {
        &self.cfg.path
    }
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// Encoded bytes of all records per the meta tree.
    pub fn total_bytes(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn err(&self, op: &'static str, source: sled::Error) -> Error {
        Error::Db {
            op,
            path: self.cfg.path.display().to_string(),
            source,
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// The raw encoded bytes under `key` (unverified).
    pub fn get_raw(&self, key: &Key) -> Result<Option<Vec<u8>>> {
        let v = self.records.get(key.to_bytes()).map_err(|e| self.err("get_raw", e))?;
        Ok(v.map(|v| v.to_vec()))
    }

    /// Stores already-encoded bytes under `key` as they are (tests, import).
    pub fn put_raw(&self, key: &Key, bytes: &[u8], cost_us: u64) -> Result<()> {
        let kb = key.to_bytes();
        let meta = Meta {
            tick: self.tick(),
            bytes: bytes.len() as u64,
            cost_us,
        };
        let old = (&self.records, &self.meta)
            .transaction(|(r, m)| {
                r.insert(&kb[..], bytes)?;
                let old = m.insert(&kb[..], &meta.to_bytes()[..])?;
                Ok(old)
            })
            .map_err(|e: sled::transaction::TransactionError<()>| match e {
                sled::transaction::TransactionError::Storage(s) => self.err("put", s),
                sled::transaction::TransactionError::Abort(()) => {
                    self.err("put", sled::Error::Unsupported("abort".into()))
                }
            })?;
        let old_bytes = old.and_then(|o| Meta::from_bytes(&o)).map_or(0, |m| m.bytes);
        self.total.fetch_add(meta.bytes, Ordering::Relaxed);
        self.total
            .fetch_sub(old_bytes.min(self.total.load(Ordering::Relaxed)), Ordering::Relaxed);
        Counters::add(&self.counters.puts, 1);
        Counters::add(&self.counters.bytes_written, meta.bytes);
        if let Some(budget) = self.cfg.budget_bytes
            && self.total_bytes() > budget
        {
            self.evict_to(budget, Some(key))?;
        }
        Ok(())
    }

    /// Meta of every record, in key order.
    pub fn metas(&self) -> Result<Vec<(Key, Meta)>> {
        let mut out = Vec::new();
        for kv in self.meta.iter() {
            let (k, v) = kv.map_err(|e| self.err("metas", e))?;
            if let (Ok(key), Some(m)) = (Key::from_bytes(&k), Meta::from_bytes(&v)) {
                out.push((key, m));
            }
        }
        Ok(out)
    }

    /// Records and encoded bytes by model and kind, from the meta tree.
    pub fn usage(&self) -> Result<Usage> {
        Ok(Usage::of(self.metas()?.into_iter().map(|(k, m)| (k, m.bytes))))
    }

    /// Removes the lowest-scoring records (never `keep`) until the total is within `budget`.
    pub fn evict_to(&self, budget: u64, keep: Option<&Key>) -> Result<(u64, u64)> {
        let now = self.clock.load(Ordering::Relaxed);
        let mut metas = self.metas()?;
        metas.retain(|(k, _)| Some(k) != keep);
        let p = self.cfg.policy;
        metas.sort_by(|(_, a), (_, b)| {
            p.score(a.bytes, a.cost_us, now.saturating_sub(a.tick))
                .total_cmp(&p.score(b.bytes, b.cost_us, now.saturating_sub(b.tick)))
        });
        let (mut n, mut freed) = (0, 0);
        for (k, m) in metas {
            if self.total_bytes() <= budget {
                break;
            }
            if self.remove(&k)? {
                n += 1;
                freed += m.bytes;
                Counters::add(&self.counters.evictions, 1);
            }
        }
        Ok((n, freed))
    }

    /// Decodes every record ([`codec::check`]); reports the healthy ones by kind and every
    /// unusable one.
    pub fn verify(&self) -> Result<VerifyReport> {
        let mut rep = VerifyReport::default();
        for kv in self.records.iter() {
            let (k, v) = kv.map_err(|e| self.err("verify", e))?;
            let key = match Key::from_bytes(&k) {
                Ok(key) => key,
                Err(e) => {
                    rep.bad
                        .push((k.iter().map(|b| format!("{b:02x}")).collect(), e.to_string()));
                    continue;
                }
            };
            match codec::check(&key, &v, &self.cfg.bases) {
                Ok(n) => rep.healthy(key.kind, v.len() as u64, n as u64),
                Err(e) => rep.bad.push((key.to_string(), e.to_string())),
            }
        }
        Ok(rep)
    }

    /// Removes unusable records, then evicts down to `budget` (or the configured budget).
    pub fn gc(&self, budget: Option<u64>) -> Result<GcReport> {
        let mut rep = GcReport::default();
        let mut bad = Vec::new();
        for kv in self.records.iter() {
            let (k, v) = kv.map_err(|e| self.err("gc", e))?;
            let ok = Key::from_bytes(&k).is_ok_and(|key| codec::verify(&key, &v).is_ok());
            if !ok {
                bad.push((k, v.len() as u64));
            }
        }
        for (k, len) in bad {
            self.records.remove(&k).map_err(|e| self.err("gc", e))?;
            if let Some(m) = self
                .meta
                .remove(&k)
                .map_err(|e| self.err("gc", e))?
                .and_then(|m| Meta::from_bytes(&m))
            {
                self.total.fetch_sub(m.bytes.min(self.total_bytes()), Ordering::Relaxed);
            }
            rep.removed_bad += 1;
            rep.freed_bytes += len;
        }
        if let Some(b) = budget.or(self.cfg.budget_bytes) {
            let (n, freed) = self.evict_to(b, None)?;
            rep.evicted = n;
            rep.freed_bytes += freed;
        }
        self.flush()?;
        rep.remaining_bytes = self.total_bytes();
        Ok(rep)
    }

    /// Bytes of the database directory on disk.
    pub fn size_on_disk(&self) -> Result<u64> {
        self.db.size_on_disk().map_err(|e| self.err("size_on_disk", e))
    }
}

impl ChunkStore for SledStore {
    fn get(&self, key: &Key) -> Result<Option<Arc<Record>>> {
        let kb = key.to_bytes();
        let Some(v) = self.records.get(kb).map_err(|e| self.err("get", e))? else {
            Counters::add(&self.counters.misses, 1);
            return Ok(None);
        };
        Counters::add(&self.counters.bytes_read, v.len() as u64);
        match codec::decode(key, &v, &self.cfg.bases) {
            Ok(r) => {
                Counters::add(&self.counters.disk_hits, 1);
                let meta = Meta {
                    tick: self.tick(),
                    bytes: v.len() as u64,
                    cost_us: r.cost_us,
                };
                // Recency only; a lost update merely ages the record.
                let _ = self.meta.insert(kb, &meta.to_bytes()[..]);
                Ok(Some(Arc::new(r)))
            }
            Err(e) => {
                self.counters.count_err(&e);
                Err(e)
            }
        }
    }

    fn touch(&self, key: &Key) -> Result<()> {
        let kb = key.to_bytes();
        if let Some(mut m) = self
            .meta
            .get(kb)
            .map_err(|e| self.err("touch", e))?
            .and_then(|v| Meta::from_bytes(&v))
        {
            m.tick = self.tick();
            self.meta
                .insert(kb, &m.to_bytes()[..])
                .map_err(|e| self.err("touch", e))?;
        }
        Ok(())
    }

    fn put(&self, key: &Key, record: Record) -> Result<()> {
        record.check_model(key)?;
        let bytes = codec::encode(key, &record, self.cfg.dtype)?;
        self.put_raw(key, &bytes, record.cost_us)
    }

    fn contains(&self, key: &Key) -> Result<bool> {
        self.records
            .contains_key(key.to_bytes())
            .map_err(|e| self.err("contains", e))
    }

    fn remove(&self, key: &Key) -> Result<bool> {
        let kb = key.to_bytes();
        let (had, old) = (&self.records, &self.meta)
            .transaction(|(r, m)| Ok((r.remove(&kb[..])?.is_some(), m.remove(&kb[..])?)))
            .map_err(|e: sled::transaction::TransactionError<()>| match e {
                sled::transaction::TransactionError::Storage(s) => self.err("remove", s),
                sled::transaction::TransactionError::Abort(()) => {
                    self.err("remove", sled::Error::Unsupported("abort".into()))
                }
            })?;
        if let Some(m) = old.and_then(|o| Meta::from_bytes(&o)) {
            self.total.fetch_sub(m.bytes.min(self.total_bytes()), Ordering::Relaxed);
        }
        if had {
            Counters::add(&self.counters.removes, 1);
        }
        Ok(had)
    }

    fn keys(&self, model: Option<ModelFp>) -> Result<Vec<Key>> {
        let iter = match model {
            Some(m) => self.records.scan_prefix(m.0),
            None => self.records.iter(),
        };
        let mut out = Vec::new();
        for kv in iter.keys() {
            let k = kv.map_err(|e| self.err("keys", e))?;
            if let Ok(key) = Key::from_bytes(&k) {
                out.push(key);
            }
        }
        Ok(out)
    }

    fn flush(&self) -> Result<()> {
        self.db.flush().map_err(|e| self.err("flush", e))?;
        Ok(())
    }

    fn stats(&self) -> Stats {
        self.counters.snapshot()
    }
}
