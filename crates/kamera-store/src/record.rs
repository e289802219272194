//! What the store holds: a chunk's canonical KV or a (orbit) patch, with the model it belongs to
//! and the recompute cost it saves (the eviction policy weighs bytes against it).

use kamera_ops::{ChunkKv, DType, Patch};

use crate::error::{Error, Result};
use crate::id::{Key, Kind, ModelFp};

/// The body of a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// Canonical KV, KV(B|∅) (kind [`Kind::Canonical`]).
    Kv(ChunkKv),
    /// A conditioning or orbit patch (kinds [`Kind::Patch`], [`Kind::Orbit`]).
    Patch(Patch),
}

/// One stored record.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The model whose KV this is; must equal the key's model.
    pub model: ModelFp,
    /// Estimated microseconds of compute this record saves when served (encode + prefill for
    /// canonical KV, a conditioned prefill + SVD for a patch). 0 when unknown.
    pub cost_us: u64,
    pub body: Body,
}

impl Record {
    pub fn kv(model: ModelFp, cost_us: u64, kv: ChunkKv) -> Record {
        Record {
            model,
            cost_us,
            body: Body::Kv(kv),
        }
    }
    pub fn patch(model: ModelFp, cost_us: u64, patch: Patch) -> Record {
        Record {
            model,
            cost_us,
            body: Body::Patch(patch),
        }
    }
    /// Refuses a record of one model stored under a key of another (every store's `put`).
    pub fn check_model(&self, key: &Key) -> Result<()> {
        if self.model != key.model {
            return Err(Error::Invalid {
                op: "put",
                what: "record model",
                detail: format!("record of model {} under a key of model {}", self.model, key.model),
            });
        }
        Ok(())
    }

    /// Whether the body fits a key of `kind`.
    pub fn fits(&self, kind: Kind) -> bool {
        matches!(
            (kind, &self.body),
            (Kind::Canonical, Body::Kv(_)) | (Kind::Patch | Kind::Orbit, Body::Patch(_))
        )
    }
    /// Payload bytes in memory (KV or factors).
    pub fn bytes(&self) -> usize {
        match &self.body {
            Body::Kv(kv) => kv.kv_bytes(),
            Body::Patch(p) => {
                p.bytes()
                    + p.layers()
                        .iter()
                        .map(|l| 4 * (l.k.spectrum.len() + l.v.spectrum.len()))
                        .sum::<usize>()
            }
        }
    }
    /// Tokens the record covers (the chunk's length).
    pub fn n_tokens(&self) -> usize {
        match &self.body {
            Body::Kv(kv) => kv.n_tokens(),
            Body::Patch(p) => p.n_tokens(),
        }
    }
    /// Storage dtype of the body (of the first matrix).
    pub fn dtype(&self) -> DType {
        match &self.body {
            Body::Kv(kv) => kv.dtype(),
            Body::Patch(p) => p.layers().first().map_or(DType::F32, |l| l.k.p.dtype()),
        }
    }
    pub fn as_kv(&self) -> Option<&ChunkKv> {
        match &self.body {
            Body::Kv(kv) => Some(kv),
            Body::Patch(_) => None,
        }
    }
    pub fn as_patch(&self) -> Option<&Patch> {
        match &self.body {
            Body::Patch(p) => Some(p),
            Body::Kv(_) => None,
        }
    }
}
