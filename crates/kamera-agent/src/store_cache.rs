//! [`StoreCache`]: the chunk cache over kamera-store's canonical store (sled on disk with a memory
//! tier), so canonical KV outlives a run: a page seen in an earlier run is relocated, not prefilled.

use std::collections::HashMap;
use std::sync::Arc;

use kamera_ops::ChunkKv;
use kamera_store::{ChunkId, ChunkStore, Key, ModelFp, Record};

use crate::cache::ChunkCache;

/// A [`ChunkCache`] backed by any [`ChunkStore`], with decoded chunks kept in memory for the run.
pub struct StoreCache<S: ChunkStore> {
    store: S,
    model: ModelFp,
    mem: HashMap<String, Arc<ChunkKv>>,
}

impl<S: ChunkStore> StoreCache<S> {
    /// Chunks of the model with `fingerprint` in `store`.
    pub fn new(store: S, fingerprint: &str) -> StoreCache<S> {
        StoreCache {
            store,
            model: ModelFp::of(fingerprint),
            mem: HashMap::new(),
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    fn key(&self, id: &str) -> Option<Key> {
        Some(Key::canonical(self.model, parse_id(id)?))
    }

    /// Patch key: the antecedents by id, in order, each at its index (the window lays chunks out
    /// contiguously, so order and content fix the positions).
    fn patch_key(&self, chunk: &str, antecedents: &[String]) -> Option<Key> {
        let ante: Option<Vec<(ChunkId, i64)>> = antecedents
            .iter()
            .enumerate()
            .map(|(i, a)| parse_id(a).map(|c| (c, i as i64)))
            .collect();
        Some(Key::patch(
            self.model,
            parse_id(chunk)?,
            &ante?,
            antecedents.len() as i64,
        ))
    }
}

fn parse_id(id: &str) -> Option<ChunkId> {
    let mut b = [0u8; 32];
    if id.len() != 64 {
        return None;
    }
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&id[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(ChunkId(b))
}

impl<S: ChunkStore> StoreCache<S> {}

impl<S: ChunkStore> ChunkCache for StoreCache<S> {
    fn get(&self, id: &str) -> Option<Arc<ChunkKv>> {
        if let Some(c) = self.mem.get(id) {
            return Some(c.clone());
        }
        let key = self.key(id)?;
        match self.store.lookup(&key) {
            Ok(Some(rec)) => rec.as_kv().map(|kv| Arc::new(kv.clone())),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(chunk = id, error = %e, "chunk store read failed; treated as a miss");
                None
            }
        }
    }

    fn put(&mut self, id: &str, kv: Arc<ChunkKv>, cost_us: u64) {
        if let Some(key) = self.key(id)
            && let Err(e) = self.store.put(&key, Record::kv(self.model, cost_us, (*kv).clone()))
        {
            tracing::warn!(chunk = id, error = %e, "chunk store write failed; kept in memory only");
        }
        self.mem.insert(id.to_string(), kv);
    }

    fn len(&self) -> usize {
        self.mem.len()
    }

    fn get_patch(&self, chunk: &str, antecedents: &[String]) -> Option<Arc<kamera_ops::Patch>> {
        let key = self.patch_key(chunk, antecedents)?;
        match self.store.lookup(&key) {
            Ok(Some(rec)) => rec.as_patch().map(|p| Arc::new(p.clone())),
            _ => None,
        }
    }

    fn put_patch(&mut self, chunk: &str, antecedents: &[String], patch: Arc<kamera_ops::Patch>, cost_us: u64) {
        if let Some(key) = self.patch_key(chunk, antecedents)
            && let Err(e) = self
                .store
                .put(&key, Record::patch(self.model, cost_us, (*patch).clone()))
        {
            tracing::warn!(chunk, error = %e, "chunk store patch write failed");
        }
    }

    fn flush(&mut self) {
        if let Err(e) = self.store.flush() {
            tracing::warn!(error = %e, "chunk store flush failed");
        }
    }
}
