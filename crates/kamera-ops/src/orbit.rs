//! Orbit patches: the deficit of a chunk averaged over orderings of its cached set, serving every
//! ordering of it (KAMERA.md, "Three cheap window operations: Reorder"): the plain mean, one patch
//! for every ordering, or one per slot (the chunk's position within the set).

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

/// Slot-conditioned orbit patches: `conditioned` holds (slot, KV prefilled under an ordering that
/// put the chunk at that slot); entry `s` of the result is the patch of the mean deficit over the
/// orderings with the chunk at slot `s` (None for a slot no ordering used), for `n_slots` slots.
pub fn slot_orbit_patches(
    conditioned: &[(usize, ChunkKv)],
    n_slots: usize,
    canonical: &ChunkKv,
    rope: &RopeSpec,
    cfg: &PatchConfig,
) -> Result<Vec<Option<Patch>>> {
    if let Some((s, _)) = conditioned.iter().find(|(s, _)| *s >= n_slots) {
        return Err(shape("slot_orbit_patches", "slot", format!("< {n_slots}"), s));
    }
    (0..n_slots)
        .map(|slot| {
            let here: Vec<ChunkKv> = conditioned
                .iter()
                .filter(|(s, _)| *s == slot)
                .map(|(_, c)| c.clone())
                .collect();
            if here.is_empty() {
                Ok(None)
            } else {
                orbit_patch(&here, canonical, rope, cfg).map(Some)
            }
        })
        .collect()
}
