//! The work a window plans beyond placement, each priced by the cost model: keeping canonical
//! records from resident KV, the session's own record of patch reuse, survivor repair, and the
//! repair of the pages a question reads.

use kamera_store::{ChunkId, Key};

use super::{SlotState, Window};
use crate::cost::Choice;
use crate::plan::{Plan, Step};

impl Window {
    /// Plans keeping resident `chunk`'s KV as its canonical record, unless it has one.
    pub(super) fn keep(&mut self, plan: &mut Plan, chunk: ChunkId, later: bool) {
        if self.canonical.insert(chunk) {
            // The rank-0 patch under `exact` is written only with the record (the executor
            // checks the store): a later placement learns of it from the store, not from here.
            let s = Step::KeepCanonical {
                chunk,
                exact: self.exact_key(&chunk),
            };
            if later { plan.later(s) } else { plan.push(s) }
        }
    }

    /// The patch key of resident `chunk`'s place, where its KV is exact there (prefilled in place
    /// after exactly what precedes it, not moved since): kept now, its record is exact there.
    pub(super) fn exact_key(&self, chunk: &ChunkId) -> Option<Key> {
        let i = self.slots.iter().position(|s| s.chunk == *chunk)?;
        let s = &self.slots[i];
        (s.state == SlotState::Exact && !s.shifted).then(|| self.key_after(s.chunk, i, s.start))
    }

    /// Predicted further uses of a patch formed now: this window's record of placements that
    /// reused a stored patch per patch formed, shrunk towards the cost model's prior.
    pub fn expected_reuses(&self) -> f64 {
        const PRIOR_WEIGHT: f64 = 2.0;
        (self.reused as f64 + PRIOR_WEIGHT * self.cfg.cost.expected_reuses) / (self.formed as f64 + PRIOR_WEIGHT)
    }

    /// Predicted further uses of a patch for the recall context `key`, which this call counts as
    /// occurring once more: the window's record ([`Window::expected_reuses`]), or, where this
    /// very context has occurred before, at least as many times again as it has (a walk that
    /// cycles through the same layouts: the record lags a cycle behind, since a patch formed at
    /// a context's first occurrence is used only when it recurs).
    pub(super) fn recall_reuses(&mut self, key: Key) -> f64 {
        let seen = self.contexts.entry(key).or_insert(0);
        let before = *seen;
        *seen += 1;
        self.expected_reuses().max(f64::from(before))
    }

    /// Keeps the canonical record of every resident chunk that has none (before the session
    /// ends: a later session then places them from the store without a forward pass).
    pub fn keep_resident(&mut self) -> Plan {
        let mut plan = Plan::default();
        let chunks: Vec<ChunkId> = self.slots.iter().map(|s| s.chunk).collect();
        for c in chunks {
            self.keep(&mut plan, c, false);
        }
        plan
    }

    /// The repair of survivors of evictions not repaired yet (an insert or a recall repairs those
    /// of the evictions it makes before it places its chunk; this covers [`Window::evict`]),
    /// where the cost model says blind survivors would cost more KL than its budget: from the
    /// first shifted chunk on, each placed chunk is prefilled again in place (in the
    /// background), and where the window's record of patch reuse pays for the SVDs its patch for
    /// this context is stored, so the context is exact again and served exactly when it recurs.
    pub fn repair(&mut self) -> Plan {
        self.repair_survivors(false)
    }

    /// [`Window::repair`]: `now`, its prefills on the path to the first token, before the chunk
    /// an insert or a recall places after the survivors (which is then prefilled once, after
    /// exact KV, and read within the KL budget; measured in bench/session's README); else in the
    /// background.
    pub(super) fn repair_survivors(&mut self, now: bool) -> Plan {
        let mut plan = Plan::default();
        if !self.cfg.repair {
            return plan;
        }
        let Some(first) = self.slots.iter().position(|s| s.shifted && !s.pinned) else {
            return plan;
        };
        let tokens: usize = self.slots[first..].iter().map(|s| s.n_tokens).sum();
        let d = self.cfg.cost.survivors(
            tokens,
            self.slots[first].start as usize,
            self.unpinned_budget(),
            self.expected_reuses(),
        );
        if d.choice == Choice::Blind {
            return plan;
        }
        for i in first..self.slots.len() {
            let (chunk, start) = (self.slots[i].chunk, self.slots[i].start);
            self.keep(&mut plan, chunk, !now);
            let prefill = Step::Prefill {
                chunk,
                at: start,
                alone: false,
            };
            if now {
                plan.push(prefill)
            } else {
                plan.later(prefill)
            }
            let key = self.key_after(chunk, i, start);
            if d.choice == Choice::PrefillKeepPatch && self.patches.insert(key) {
                plan.later(Step::StorePatch { chunk, key });
                self.formed += 1;
            }
            let s = &mut self.slots[i];
            s.state = SlotState::Exact;
            s.shifted = false;
        }
        plan.decisions.push(d);
        plan
    }

    /// Before a question reads `chunks` (its page): those of them resident with KV placed blind
    /// (relocated after other chunks, or re-rotated survivors of an eviction) are prefilled again
    /// in place, on the path to the answer, where the cost model says a read of blind KV would
    /// cost more KL than its budget ([`crate::CostModel::read`]); where it says a patch pays,
    /// each one's patch for this context is kept too (in the background), so that a later
    /// recall into the same context is placed with it and needs no repair. The chunks after them
    /// keep their KV (the executor writes the context again from the first one that changed).
    pub fn repair_read(&mut self, chunks: &[ChunkId]) -> Plan {
        let mut plan = Plan::default();
        let blind: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                let s = &self.slots[i];
                chunks.contains(&s.chunk)
                    && !s.pinned
                    && (s.shifted || (s.state == SlotState::Relocated && s.start > 0))
            })
            .collect();
        let Some(&first) = blind.first() else {
            return plan;
        };
        let tokens: usize = blind.iter().map(|&i| self.slots[i].n_tokens).sum();
        let d = self.cfg.cost.read(
            tokens,
            self.slots[first].start as usize,
            self.unpinned_budget(),
            self.expected_reuses(),
        );
        if matches!(d.choice, Choice::Reprefill | Choice::PrefillKeepPatch) {
            for i in blind {
                let (chunk, start) = (self.slots[i].chunk, self.slots[i].start);
                plan.push(Step::Prefill {
                    chunk,
                    at: start,
                    alone: false,
                });
                let key = self.key_after(chunk, i, start);
                if d.choice == Choice::PrefillKeepPatch && self.patches.insert(key) {
                    plan.later(Step::StorePatch { chunk, key });
                    self.formed += 1;
                }
                let s = &mut self.slots[i];
                s.state = SlotState::Exact;
                s.shifted = false;
            }
        }
        plan.decisions.push(d);
        plan
    }
}
