//! Reordering the placed chunks: the unchanged prefix stays, the rest are laid out again with
//! orbit patches of the placed set (shared/KAMERA.md, "orbit patches") or re-prefilled.

use kamera_store::{ChunkId, Key};

use super::{Order, Slot, SlotState, Window, orbit_orderings, rank};
use crate::cost::{Choice, OrbitVariant};
use crate::error::{Error, Result};
use crate::plan::{OrbitKey, Plan, Step};

impl Window {
    /// Reorders the placed chunks by `order` (lowest rank first, so the highest-ranked chunk
    /// sits next to the tail). Chunks whose position and predecessors do not change stay; the
    /// rest are laid out again with orbit patches of the placed set (one patch per chunk serves
    /// every ordering of the set) or re-prefilled in the new order, as the cost model decides.
    pub fn reorder(&mut self, order: Order) -> Result<Plan> {
        let first_placed = self.slots.iter().position(|s| !s.pinned).unwrap_or(self.slots.len());
        let mut placed: Vec<Slot> = self.slots[first_placed..].to_vec();
        placed.sort_by(|a, b| rank(a, order).total_cmp(&rank(b, order)).then(a.start.cmp(&b.start)));
        let new_order: Vec<ChunkId> = placed.iter().map(|s| s.chunk).collect();
        let old_order: Vec<ChunkId> = self.slots[first_placed..].iter().map(|s| s.chunk).collect();
        self.lay_out(new_order, old_order, first_placed)
    }

    /// Reorders the placed chunks into exactly `new_order` (a permutation of them).
    pub fn reorder_to(&mut self, new_order: &[ChunkId]) -> Result<Plan> {
        let first_placed = self.slots.iter().position(|s| !s.pinned).unwrap_or(self.slots.len());
        let old_order: Vec<ChunkId> = self.slots[first_placed..].iter().map(|s| s.chunk).collect();
        let (mut a, mut b) = (old_order.clone(), new_order.to_vec());
        a.sort();
        b.sort();
        if a != b {
            return Err(Error::Invalid {
                op: "reorder_to",
                detail: format!(
                    "{} chunks given, not a permutation of the {} placed",
                    new_order.len(),
                    old_order.len()
                ),
            });
        }
        self.lay_out(new_order.to_vec(), old_order, first_placed)
    }

    // Long: one reorder plan: the moved slots, their canonical records and orbit patches, and the tail, in plan order.
    fn lay_out(&mut self, new_order: Vec<ChunkId>, old_order: Vec<ChunkId>, first_placed: usize) -> Result<Plan> {
        const OP: &str = "reorder";
        let mut plan = Plan::default();
        let same = new_order.iter().zip(&old_order).take_while(|(a, b)| a == b).count();
        if same == new_order.len() {
            return Ok(plan);
        }
        self.drop_tail(&mut plan);
        // Every chunk of the set needs a canonical record (orbit patches are formed against it).
        for c in &old_order {
            self.keep(&mut plan, *c, false);
        }
        let moved: Vec<Slot> = self.slots.drain(first_placed + same..).collect();
        for s in &moved {
            plan.push(Step::EvictToStore { chunk: s.chunk });
        }
        let at = self.end();
        let set: Vec<ChunkId> = {
            let mut v = old_order.clone();
            v.sort();
            v
        };
        // Orbit patches are formed for the whole placed set, after the pinned chunks; the first
        // slot needs none when nothing precedes the set (its canonical KV is exact there).
        let start = self.slots[..first_placed].last().map_or(0, Slot::end);
        let fixed = self.slots[..first_placed].iter().map(|s| s.n_tokens).sum::<usize>();
        let variant = self.cfg.cost.orbit_variant(set.len(), start > 0);
        let model = self.cfg.model;
        let keys: Vec<OrbitKey> = match variant.0 {
            OrbitVariant::Mean => set
                .iter()
                .map(|c| OrbitKey {
                    chunk: *c,
                    slot: None,
                    key: Key::orbit(model, *c, &set),
                })
                .collect(),
            OrbitVariant::Slot => set
                .iter()
                .flat_map(|c| {
                    let set = &set;
                    (usize::from(start == 0)..set.len()).map(move |s| OrbitKey {
                        chunk: *c,
                        slot: Some(s),
                        key: Key::orbit_slot(model, *c, set, s),
                    })
                })
                .collect(),
        };
        // The patch of `id` at `slot` of the new order (None: relocation alone is exact).
        let key_at = |id: &ChunkId, slot: usize| {
            keys.iter()
                .find(|k| k.chunk == *id && k.slot.is_none_or(|s| s == slot))
                .map(|k| k.key)
        };
        let cached = new_order[same..]
            .iter()
            .enumerate()
            .all(|(i, id)| key_at(id, same + i).is_none_or(|k| self.patches.contains(&k)));
        let tokens: usize = moved.iter().map(|s| s.n_tokens).sum();
        let d = self.cfg.cost.reorder(tokens, set.len(), fixed, cached, variant);
        if d.choice == Choice::FormPatch {
            let orderings = orbit_orderings(&set, self.cfg.cost.orderings_for(set.len(), variant.0));
            plan.push(Step::FormOrbit {
                set: set.clone(),
                keys: keys.clone(),
                orderings,
                at: start,
            });
            self.patches.extend(keys.iter().map(|k| k.key));
        }
        let mut pos = at;
        for (i, id) in new_order[same..].iter().enumerate() {
            let old = moved
                .iter()
                .find(|s| s.chunk == *id)
                .cloned()
                .ok_or_else(|| Error::chunk(OP, id, "not placed"))?;
            let state = match d.choice {
                Choice::Reprefill => {
                    plan.push(Step::Prefill {
                        chunk: *id,
                        at: pos,
                        alone: false,
                    });
                    SlotState::Exact
                }
                _ => {
                    let key = key_at(id, same + i);
                    plan.push(Step::Recall { chunk: *id });
                    plan.push(Step::Place {
                        chunk: *id,
                        at: pos,
                        patch: key,
                    });
                    key.map_or(SlotState::Relocated, SlotState::Patched)
                }
            };
            self.slots.push(Slot {
                start: pos,
                state,
                shifted: false,
                ..old
            });
            pos += old.span;
        }
        plan.decisions.push(d);
        Ok(plan)
    }
}
