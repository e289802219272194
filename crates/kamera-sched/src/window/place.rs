//! Chunks entering and leaving the window: pinning, insertion, eviction (one victim, a slide,
//! or room made for a new chunk by the order) and recall of an evicted chunk.

use std::collections::BTreeSet;

use kamera_store::{ChunkId, Key};

use super::{Slot, SlotState, Window, nothing_stored, rank};
use crate::cost::{Choice, Decision, DecisionOp};
use crate::error::{Error, Result};
use crate::plan::{Plan, Step};

impl Window {
    pub(super) fn check_new(&self, op: &'static str, id: &ChunkId, n: usize) -> Result<()> {
        if self.known.contains_key(id) {
            return Err(Error::chunk(op, id, "was inserted before (recall it instead)"));
        }
        if n == 0 {
            return Err(Error::chunk(op, id, "has no tokens"));
        }
        Ok(())
    }

    /// Pins a chunk (system prompt) at the front. Pinned chunks come before any placed chunk
    /// and are never evicted.
    pub fn pin(&mut self, id: ChunkId, n_tokens: usize) -> Result<Plan> {
        const OP: &str = "pin";
        self.check_new(OP, &id, n_tokens)?;
        if self.slots.iter().any(|s| !s.pinned) {
            return Err(Error::Invalid {
                op: OP,
                detail: "pin chunks before placing any other chunk".into(),
            });
        }
        if self.used() + n_tokens > self.cfg.budget_tokens {
            return Err(Error::OverBudget {
                op: OP,
                need: n_tokens,
                budget: self.cfg.budget_tokens,
                fixed: self.used(),
            });
        }
        let mut plan = Plan::default();
        self.drop_tail(&mut plan);
        let at = self.end();
        let state = self.encode_steps(&mut plan, id, at);
        self.new_slot(id, n_tokens, true, state);
        Ok(plan)
    }

    /// Inserts a new chunk after the placed chunks: encode + prefill in place (exact), store
    /// its canonical KV, and keep the difference as a patch where the cost model says so;
    /// evicts (by [`WindowConfig::evict`]) to make room.
    pub fn insert(&mut self, id: ChunkId, n_tokens: usize) -> Result<Plan> {
        self.insert_with(id, n_tokens, &nothing_stored)
    }

    /// [`Window::insert`], where `stored` reports patches in the store (survivors of the
    /// evictions it makes are placed with a stored patch for their new context where one is).
    pub fn insert_with(&mut self, id: ChunkId, n_tokens: usize, stored: &dyn Fn(&Key) -> bool) -> Result<Plan> {
        const OP: &str = "insert";
        self.check_new(OP, &id, n_tokens)?;
        let mut plan = self.make_room(OP, n_tokens, stored)?;
        // Survivors the cost model repairs are prefilled again before the new chunk: it is then
        // prefilled once, after exact KV (not after blind survivors, then again behind them).
        self.repair_first(&mut plan);
        let at = self.end();
        let d = self.cfg.cost.insert(id, n_tokens, at as usize);
        let state = self.encode_steps(&mut plan, id, at);
        if d.choice == Choice::PrefillKeepPatch {
            let key = self.key_after(id, self.slots.len(), at);
            plan.later(Step::StorePatch { chunk: id, key });
            self.patches.insert(key);
        }
        plan.decisions.push(d);
        self.new_slot(id, n_tokens, false, state);
        Ok(plan)
    }

    /// Appends the repair of shifted survivors, on the path to the first token
    /// ([`Window::repair`]); its survivors decision replaces the one the evictions made.
    fn repair_first(&mut self, plan: &mut Plan) {
        let repair = self.repair_survivors(true);
        if !repair.is_empty() {
            plan.decisions.retain(|d| d.op != DecisionOp::Survivors);
        }
        plan.append(repair);
    }

    /// Evicts `victims` (placed chunks), keeping the KV of those without a canonical record, and
    /// moves the survivors after them: placed from canonical KV + a stored patch for their new
    /// context where `stored` (or this window) knows one, else re-rotated only (exact as
    /// rotation; what the cost model's survivors decision prices).
    pub(super) fn evict_many(&mut self, victims: &BTreeSet<ChunkId>, plan: &mut Plan, stored: &dyn Fn(&Key) -> bool) {
        if victims.is_empty() {
            return;
        }
        self.drop_tail(plan);
        // Victims, and survivors about to move, are kept as they are now (where not kept
        // already): a survivor's KV here is the KV it was met with, exact in this context.
        let first = self.slots.iter().position(|s| victims.contains(&s.chunk)).unwrap_or(0);
        let order: Vec<ChunkId> = self.slots[first..].iter().map(|s| s.chunk).collect();
        for c in order {
            self.keep(plan, c, false);
        }
        let mut kept = Vec::with_capacity(self.slots.len());
        for s in std::mem::take(&mut self.slots) {
            if victims.contains(&s.chunk) {
                plan.push(Step::EvictToStore { chunk: s.chunk });
            } else {
                kept.push(s);
            }
        }
        // Lay survivors out again from 0; each moves left by what was removed before it.
        let mut pos = 0i64;
        let (mut blind, mut from) = (0usize, None);
        for i in 0..kept.len() {
            let delta = pos - kept[i].start;
            if delta != 0 {
                let id = kept[i].chunk;
                let ants: Vec<(ChunkId, i64)> = kept[..i].iter().map(|s| (s.chunk, s.start)).collect();
                let key = Key::patch(self.cfg.model, id, &ants, pos);
                let s = &mut kept[i];
                s.start = pos;
                if self.patches.contains(&key) || stored(&key) {
                    self.patches.insert(key);
                    self.reused += 1;
                    plan.push(Step::Recall { chunk: id });
                    plan.push(Step::Place {
                        chunk: id,
                        at: pos,
                        patch: Some(key),
                    });
                    s.state = SlotState::Patched(key);
                    s.shifted = false;
                } else {
                    plan.push(Step::Relocate { chunk: id, delta });
                    s.shifted = true;
                    blind += s.n_tokens;
                    from.get_or_insert(pos);
                }
            }
            pos += kept[i].span;
        }
        self.slots = kept;
        if let Some(from) = from {
            let d = self
                .cfg
                .cost
                .survivors(blind, from as usize, self.unpinned_budget(), self.expected_reuses());
            plan.decisions.push(d);
        }
    }

    /// Evicts one placed chunk: its KV leaves the window, its canonical KV stays in the store;
    /// the chunks after it are re-rotated only.
    pub fn evict(&mut self, id: &ChunkId) -> Result<Plan> {
        const OP: &str = "evict";
        match self.slot(id) {
            None => return Err(Error::chunk(OP, id, "is not in the window")),
            Some(s) if s.pinned => return Err(Error::chunk(OP, id, "is pinned")),
            Some(_) => {}
        }
        let mut plan = Plan::default();
        self.evict_many(&BTreeSet::from([*id]), &mut plan, &nothing_stored);
        Ok(plan)
    }

    /// Sliding window: evicts the oldest-placed chunks (front first) until `need` more tokens
    /// fit; survivors are re-rotated only (no patch).
    pub fn slide(&mut self, need: usize) -> Result<Plan> {
        const OP: &str = "slide";
        self.check_fits(OP, need)?;
        let mut victims = BTreeSet::new();
        let mut used = self.chunk_tokens();
        for s in self.slots.iter().filter(|s| !s.pinned) {
            if used + need <= self.cfg.budget_tokens {
                break;
            }
            victims.insert(s.chunk);
            used -= s.n_tokens;
        }
        let mut plan = Plan::default();
        self.evict_many(&victims, &mut plan, &nothing_stored);
        Ok(plan)
    }

    pub(super) fn check_fits(&self, op: &'static str, need: usize) -> Result<()> {
        let fixed = self.pinned_tokens();
        if need + fixed > self.cfg.budget_tokens {
            return Err(Error::OverBudget {
                op,
                need,
                budget: self.cfg.budget_tokens,
                fixed,
            });
        }
        Ok(())
    }

    /// Drops the tail and evicts by the configured order until `need` tokens fit. Where the
    /// survivors of an eviction get repaired ([`crate::CostModel::repairs_survivors`]), an
    /// eviction frees at least half the unpinned window at once, as llama.cpp's context shift
    /// does, so one repair serves the next few chunks.
    pub(super) fn make_room(&mut self, op: &'static str, need: usize, stored: &dyn Fn(&Key) -> bool) -> Result<Plan> {
        self.check_fits(op, need)?;
        let mut plan = Plan::default();
        self.drop_tail(&mut plan);
        let mut victims = BTreeSet::new();
        let mut used = self.chunk_tokens();
        let need = if used + need > self.cfg.budget_tokens && self.cfg.cost.repairs_survivors(self.unpinned_budget()) {
            need.max(self.unpinned_budget() / 2)
        } else {
            need
        };
        let mut order: Vec<&Slot> = self.slots.iter().filter(|s| !s.pinned).collect();
        order.sort_by(|a, b| {
            rank(a, self.cfg.evict)
                .total_cmp(&rank(b, self.cfg.evict))
                .then(a.start.cmp(&b.start))
        });
        for s in order {
            if used + need <= self.cfg.budget_tokens {
                break;
            }
            victims.insert(s.chunk);
            used -= s.n_tokens;
        }
        self.evict_many(&victims, &mut plan, stored);
        Ok(plan)
    }

    /// Brings an evicted chunk back after the placed chunks: rehydrate its canonical KV,
    /// relocate it, and apply a patch conditioned on its fixed earlier context (the chunks
    /// before it, by id and position), formed once and cached — or re-prefill, as the cost
    /// model decides.
    pub fn recall(&mut self, id: ChunkId) -> Result<Plan> {
        self.recall_with(id, &nothing_stored)
    }

    /// [`Window::recall`], where `stored` reports patches already in the store (formed in an
    /// earlier session or by another process): such a patch is reused, not formed again.
    pub fn recall_with(&mut self, id: ChunkId, stored: &dyn Fn(&Key) -> bool) -> Result<Plan> {
        const OP: &str = "recall";
        let Some(k) = self.known.get(&id).copied() else {
            return Err(Error::chunk(OP, &id, "was never inserted"));
        };
        if self.slot(&id).is_some() {
            return Err(Error::chunk(OP, &id, "is already in the window"));
        }
        let n = k.n_tokens;
        let mut plan = self.make_room(OP, n, stored)?;
        // As in an insert: repaired survivors first, so the chunk after them is placed once.
        self.repair_first(&mut plan);
        let at = self.end();
        let key = self.key_after(id, self.slots.len(), at);
        let cached = self.patches.contains(&key) || stored(&key);
        if cached {
            self.patches.insert(key);
        }
        let d = if self.canonical.contains(&id) || stored(&Key::canonical(self.cfg.model, id)) {
            let reuses = self.recall_reuses(key);
            self.cfg.cost.recall(id, n, at as usize, cached, reuses)
        } else {
            // Its KV was never kept: it left the window before the model read it (a rebuild
            // dropped the plans that would have kept it, [`Window::rebuild`]).
            Decision {
                op: DecisionOp::Recall,
                chunk: Some(id),
                choice: Choice::Reprefill,
                options: vec![(Choice::Reprefill, self.cfg.cost.prefill(n, at as usize))],
                reason: "no canonical record: it left the window before the model read it".into(),
            }
        };
        match d.choice {
            Choice::CachedPatch => self.reused += 1,
            Choice::FormPatch => self.formed += 1,
            _ => {}
        }
        let state = match d.choice {
            Choice::Relocate | Choice::Blind => {
                plan.push(Step::Recall { chunk: id });
                plan.push(Step::Place {
                    chunk: id,
                    at,
                    patch: None,
                });
                SlotState::Relocated
            }
            Choice::CachedPatch => {
                plan.push(Step::Recall { chunk: id });
                plan.push(Step::Place {
                    chunk: id,
                    at,
                    patch: Some(key),
                });
                SlotState::Patched(key)
            }
            Choice::FormPatch => {
                // The conditioned prefill is the exact KV here: placed now, and its difference
                // to the stored KV becomes the patch (an SVD) in the background.
                plan.push(Step::Prefill {
                    chunk: id,
                    at,
                    alone: false,
                });
                plan.later(Step::StorePatch { chunk: id, key });
                self.patches.insert(key);
                SlotState::Exact
            }
            Choice::Reprefill | Choice::PrefillKeepPatch => {
                plan.push(Step::Prefill {
                    chunk: id,
                    at,
                    alone: false,
                });
                SlotState::Exact
            }
        };
        plan.decisions.push(d);
        self.new_slot(id, n, false, state);
        Ok(plan)
    }
}
