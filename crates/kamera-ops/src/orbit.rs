//! Orbit patches: the deficit of a chunk averaged over orderings of its cached set, serving every
//! ordering of it (KAMERA.md, "Three cheap window operations: Reorder"): the orderings an orbit
//! is formed from, the plain mean (one patch for every ordering), or one per slot (the chunk's
//! position within the set).

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

/// The orderings of `n` chunks an orbit is formed from: the identity first, then every other
/// permutation (lexicographic) when there are at most `max`; else the identity's other rotations
/// (so every chunk takes every slot, as slot patches need, while `max` allows) and distinct
/// orderings sampled from `seed` up to `max`.
pub fn orbit_orderings(n: usize, max: usize, seed: u64) -> Vec<Vec<usize>> {
    let identity: Vec<usize> = (0..n).collect();
    let max = max.max(1);
    let total = (1..=n).try_fold(1usize, |a, k| a.checked_mul(k));
    let mut out = vec![identity.clone()];
    if total.is_some_and(|t| t <= max) {
        let mut p = identity.clone();
        while next_permutation(&mut p) {
            out.push(p.clone());
        }
        return out;
    }
    for r in 1..n.min(max) {
        let mut o = identity.clone();
        o.rotate_left(r);
        out.push(o);
    }
    // SplitMix64 + Fisher-Yates: the same orderings on every platform.
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move |below: usize| {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % below.max(1) as u64) as usize
    };
    let mut tries = 0;
    while out.len() < max && tries < 100 * max {
        tries += 1;
        let mut o = identity.clone();
        for i in (1..n).rev() {
            o.swap(i, next(i + 1));
        }
        if !out.contains(&o) {
            out.push(o);
        }
    }
    out
}

fn next_permutation(p: &mut [usize]) -> bool {
    let Some(i) = (1..p.len()).rev().find(|&i| p[i - 1] < p[i]) else {
        return false;
    };
    let j = (i..p.len()).rev().find(|&j| p[j] > p[i - 1]).unwrap_or(i);
    p.swap(i - 1, j);
    p[i..].reverse();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orderings_are_all_permutations_up_to_max_and_cover_every_slot_beyond() {
        let o = orbit_orderings(3, 24, 1);
        assert_eq!(o.len(), 6);
        assert_eq!(o[0], vec![0, 1, 2]);
        let mut sorted = o.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 6);
        assert_eq!(orbit_orderings(4, 24, 1).len(), 24);
        for (n, max) in [(8, 6), (8, 12), (5, 24)] {
            let s = orbit_orderings(n, max, 3);
            assert_eq!((s.len(), &s[0]), (max, &(0..n).collect::<Vec<_>>()));
            let mut d = s.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), max);
            // With room for the n rotations, every chunk is at every slot at least once.
            if max >= n {
                for c in 0..n {
                    for slot in 0..n {
                        assert!(s.iter().any(|o| o[slot] == c), "{n} {max}: {c} never at {slot}");
                    }
                }
            }
            assert!(s.iter().all(|o| {
                let mut x = o.clone();
                x.sort();
                x == (0..n).collect::<Vec<_>>()
            }));
        }
        assert_eq!(orbit_orderings(3, 1, 0), vec![vec![0, 1, 2]]);
        assert_eq!(orbit_orderings(0, 5, 0), vec![Vec::<usize>::new()]);
    }
}
