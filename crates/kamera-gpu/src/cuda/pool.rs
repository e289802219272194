//! Canonical KV resident on the device: chunks uploaded once (`ResidentChunk`), kept in a pool
//! with a byte budget and least-recently-used eviction (`DevicePool`), and placed into a model's
//! context by the reuse kernels with no host round trip (`DeviceModel::place`).

use super::model::{DeviceKv, DeviceModel};
use super::{Channel, CudaBackend, driver};
use crate::error::{Error, Result};
use crate::pool::{PoolStats, Slots};
use kamera_ops::{ChunkKv, KvLayout, Patch};

/// One canonical chunk's K and V of every layer on the device, in its stored dtype.
pub struct ResidentChunk {
    kv: (Channel, Channel),
    layout: KvLayout,
    offset: i64,
    tokens: usize,
    bytes: usize,
}

impl std::fmt::Debug for ResidentChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResidentChunk")
            .field("offset", &self.offset)
            .field("tokens", &self.tokens)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl ResidentChunk {
    pub fn n_tokens(&self) -> usize {
        self.tokens
    }
    /// Position the canonical KV was computed at.
    pub fn offset(&self) -> i64 {
        self.offset
    }
    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl CudaBackend {
    /// Uploads a canonical chunk (all layers, K and V) once.
    pub fn upload_chunk(&self, chunk: &ChunkKv) -> Result<ResidentChunk> {
        let kv = (self.upload_channel(chunk, false)?, self.upload_channel(chunk, true)?);
        Ok(ResidentChunk {
            kv,
            layout: *chunk.layout(),
            offset: chunk.offset(),
            tokens: chunk.n_tokens(),
            bytes: chunk.kv_bytes(),
        })
    }
}

impl DeviceModel {
    /// Appends `chunk` to the context at its next positions: relocated there by exact RoPE
    /// re-rotation and patched (`patch`), written straight into the context's rows by the reuse
    /// kernels (KAMERA §3: R(δ)·(canonical + P Wᵀ)).
    pub fn place(&self, kv: &mut DeviceKv, chunk: &ResidentChunk, patch: Option<&Patch>) -> Result<()> {
        const OP: &str = "DeviceModel::place";
        let spec = self.spec();
        if chunk.layout != kv.layout {
            return Err(Error::Unsupported {
                op: OP,
                detail: format!("chunk layout {:?} != context layout {:?}", chunk.layout, kv.layout),
            });
        }
        if let Some(p) = patch
            && (*p.layout() != chunk.layout || p.n_tokens() != chunk.tokens)
        {
            return Err(Error::Unsupported {
                op: OP,
                detail: format!(
                    "patch for {} tokens of {:?} does not fit a chunk of {} tokens",
                    p.n_tokens(),
                    p.layout(),
                    chunk.tokens
                ),
            });
        }
        chunk.layout.check_rope(OP, &spec.rope)?;
        let delta = kv.end().checked_sub(chunk.offset).ok_or_else(|| Error::Unsupported {
            op: OP,
            detail: format!("shift from {} to {} overflows", chunk.offset, kv.end()),
        })?;
        self.reserve(kv, chunk.tokens)?;
        let b = self.backend();
        let mut bad = b.stream.alloc_zeros::<i32>(1).map_err(driver(OP))?;
        let row = kv.len;
        b.reuse_resident(
            &chunk.kv,
            &chunk.layout,
            patch,
            &spec.rope,
            delta,
            (&mut kv.k, &mut kv.v),
            row,
            &mut bad,
        )?;
        b.finish(OP, &bad)?;
        kv.len += chunk.tokens;
        Ok(())
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
            let bytes = resident.bytes;
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
