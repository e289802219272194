//! Orbit patch: one patch per chunk of a cached set, from the deficit averaged over several
//! orderings of the set, serving every ordering (KAMERA.md, "Three cheap window operations: Reorder").

use crate::chunk::ChunkKv;
use crate::deficit::{Deficit, deficit};
use crate::error::{Result, shape};
use crate::patch::{Patch, PatchConfig, patch_from_deficit};
use crate::rope::RopeSpec;

/// The patch of the mean canonical-frame deficit of `conditioned` (the chunk's KV prefilled
/// under each sampled ordering, each at its own offset) against `canonical`.
pub fn orbit_patch(conditioned: &[ChunkKv], canonical: &ChunkKv, rope: &RopeSpec, cfg: &PatchConfig) -> Result<Patch> {
    if conditioned.is_empty() {
        return Err(shape("orbit_patch", "conditioned orderings", "at least one", 0));
    }
    let deficits = conditioned
        .iter()
        .map(|c| deficit(c, canonical, rope))
        .collect::<Result<Vec<_>>>()?;
    let mean = Deficit::mean(&deficits)?;
    patch_from_deficit(&mean, canonical.layout(), canonical.kv_bytes(), cfg)
}
