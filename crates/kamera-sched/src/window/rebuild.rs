//! Lazy execution. A runtime may hold plans until the model next reads the window: a scripted
//! step reads no model, and the pages it passes through may leave the window before any read.
//! When that read comes, [`Window::materialize`] weighs the held plans' work before the first
//! token against building the window's layout afresh ([`Window::rebuild`]: the slots the
//! executor already holds at the front stay, the rest are placed from the store where their
//! records are there, else prefilled in place) and returns the cheaper plan. A rebuild drops the
//! records the held plans would have written (canonical KV kept at eviction, patches): pages the
//! model never read cost no prefill, and the window forgets what was never stored.

use std::collections::BTreeSet;

use kamera_store::{ChunkId, Key};

use super::{Slot, SlotState, Window};
use crate::cost::{Choice, Decision, DecisionOp};
use crate::plan::{Plan, Step};

/// What [`Window::materialize`] chose: the plans to run in order, and whether they are a rebuild
/// replacing the held ones.
#[derive(Debug, Clone, Default)]
pub struct Materialized {
    pub plans: Vec<Plan>,
    pub rebuilt: bool,
}

/// Whether two slots hold the same KV: the same chunk, at the same place, made the same way.
fn same_kv(a: &Slot, b: &Slot) -> bool {
    a.chunk == b.chunk && a.start == b.start && a.n_tokens == b.n_tokens && a.state == b.state && a.shifted == b.shifted
}

impl Window {
    /// The plans that bring an executor holding `built`'s layout (the window as it was when the
    /// executor last ran a plan) to this window's: `pending` (the plans made since, to be run in
    /// order, each on its own so its background steps read the KV it left) where their work
    /// before the first token is predicted to cost no more than a rebuild, else
    /// [`Window::rebuild`] alone (and this window takes the rebuild's states). `tokens` gives
    /// chunk lengths; `stored` tells which records the store holds. `allow_rebuild`: false where
    /// the executor still has background steps queued against its current layout.
    pub fn materialize(
        &mut self,
        built: &Window,
        pending: Vec<Plan>,
        allow_rebuild: bool,
        tokens: &dyn Fn(&ChunkId) -> usize,
        stored: &dyn Fn(&Key) -> bool,
    ) -> Materialized {
        let as_held = |plans| Materialized { plans, rebuilt: false };
        let held: f64 = pending.iter().map(|p| self.cfg.cost.steps_us(&p.steps, tokens)).sum();
        if held == 0.0 || !allow_rebuild {
            return as_held(pending);
        }
        let mut rebuilt = self.clone();
        let mut plan = rebuilt.rebuild(built, &pending, stored);
        let fresh = self.cfg.cost.steps_us(&plan.steps, tokens);
        if fresh >= held {
            return as_held(pending);
        }
        let (steps, later) = pending
            .iter()
            .fold((0, 0), |(s, l), p| (s + p.steps.len(), l + p.background.len()));
        plan.decisions.push(Decision {
            op: DecisionOp::Materialize,
            chunk: None,
            choice: Choice::Reprefill,
            options: vec![(Choice::Reprefill, fresh)],
            reason: format!(
                "the window built afresh from its first changed slot costs {:.1} ms before the first token, the {steps} held plan steps {:.1} ms (and {later} later steps, dropped)",
                fresh / 1000.0,
                held / 1000.0,
            ),
        });
        *self = rebuilt;
        Materialized {
            plans: vec![plan],
            rebuilt: true,
        }
    }

    /// Plans this window's layout built afresh over an executor holding `built`'s: the slots
    /// both hold at the front stay; a chunk the executor holds that `pending` keeps as its
    /// canonical record is kept from that KV before it goes (no forward pass); every later slot
    /// is placed from the store where its state is a placement and its records are known, else
    /// prefilled in place (then exact), and a patch `pending` would store from that very place is
    /// stored from the new KV. Canonical records and patches that neither `built` knew, nor the
    /// store holds, nor this plan writes are forgotten (the plans that would have written them
    /// are dropped: their chunks were never prefilled), and so is their reuse record.
    pub fn rebuild(&mut self, built: &Window, pending: &[Plan], stored: &dyn Fn(&Key) -> bool) -> Plan {
        let model = self.cfg.model;
        let keep = self
            .slots
            .iter()
            .zip(&built.slots)
            .take_while(|(a, b)| same_kv(a, b))
            .count();
        let held = || pending.iter().flat_map(|p| p.steps.iter().chain(&p.background));
        let mut plan = Plan::default();
        if built.tail > 0 {
            plan.push(Step::DropTail { tokens: built.tail });
        }
        let mut kept = BTreeSet::new();
        for s in &built.slots[keep..] {
            let keeps = held().any(|h| matches!(h, Step::KeepCanonical { chunk, .. } if *chunk == s.chunk));
            if keeps && !built.canonical.contains(&s.chunk) {
                plan.push(Step::KeepCanonical {
                    chunk: s.chunk,
                    exact: built.exact_key(&s.chunk),
                });
                kept.insert(s.chunk);
            }
            plan.push(Step::EvictToStore { chunk: s.chunk });
        }
        let canonical = std::mem::take(&mut self.canonical);
        self.canonical = canonical
            .into_iter()
            .filter(|c| built.canonical.contains(c) || kept.contains(c) || stored(&Key::canonical(model, *c)))
            .collect();
        let mut formed = BTreeSet::new();
        for i in keep..self.slots.len() {
            let (chunk, at, state) = (self.slots[i].chunk, self.slots[i].start, self.slots[i].state);
            let placed = match state {
                SlotState::Relocated => self.canonical.contains(&chunk).then_some(None),
                SlotState::Patched(key) => {
                    let known = built.patches.contains(&key) || stored(&key);
                    (self.canonical.contains(&chunk) && known).then_some(Some(key))
                }
                SlotState::Exact => None,
            };
            match placed {
                Some(patch) => {
                    plan.push(Step::Recall { chunk });
                    plan.push(Step::Place { chunk, at, patch });
                }
                None => {
                    plan.push(Step::Prefill {
                        chunk,
                        at,
                        alone: false,
                    });
                    let s = &mut self.slots[i];
                    s.state = SlotState::Exact;
                    s.shifted = false;
                    let key = self.key_after(chunk, i, at);
                    let stores = held().any(|h| matches!(h, Step::StorePatch { key: k, .. } if *k == key));
                    if stores && self.canonical.contains(&chunk) {
                        plan.later(Step::StorePatch { chunk, key });
                        formed.insert(key);
                    }
                }
            }
        }
        let patches = std::mem::take(&mut self.patches);
        self.patches = patches
            .into_iter()
            .filter(|k| built.patches.contains(k) || formed.contains(k) || stored(k))
            .collect();
        (self.formed, self.reused) = (built.formed + formed.len() as u64, built.reused);
        plan
    }
}
