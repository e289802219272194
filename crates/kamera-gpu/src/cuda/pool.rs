//! Canonical KV resident on the device: chunks uploaded once (`ResidentChunk`, kept by
//! `crate::DevicePool`) and placed into a model's context by the reuse kernels with no host round
//! trip (`DeviceModel::place`).

use super::model::{DeviceKv, DeviceModel};
use super::{Channel, CudaBackend, Shift, driver};
use crate::error::{Error, Result};
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
        let shift = Shift {
            patch,
            rope: &spec.rope,
            delta,
        };
        b.reuse_resident(&chunk.kv, &chunk.layout, shift, (&mut kv.k, &mut kv.v, row), &mut bad)?;
        b.finish(OP, &bad)?;
        kv.len += chunk.tokens;
        Ok(())
    }
}
