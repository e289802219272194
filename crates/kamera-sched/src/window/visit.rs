//! How a runtime meets chunks: [`Window::visit`] (hit, recall, stored by an earlier session,
//! new), pinning from the store, and recall by relevance.

use std::collections::BTreeSet;

use kamera_store::{ChunkId, Key};

use super::{Known, Slot, SlotState, Visit, Window};
use crate::error::Result;
use crate::plan::{Plan, Step};

impl Window {
    /// What a runtime does when it meets chunk `id` (`n_tokens` long) again or anew: a resident
    /// chunk is a hit (nothing moves; it counts as used now), an evicted one is recalled, one
    /// this window never saw but whose canonical KV `stored` reports (an earlier session's) is
    /// admitted like a recall, anything else is inserted. `stored` tells which store records
    /// exist (canonical KV, patches), so a patch formed earlier is reused, not formed again.
    pub fn visit(&mut self, id: ChunkId, n_tokens: usize, stored: &dyn Fn(&Key) -> bool) -> Result<(Visit, Plan)> {
        if self.slot(&id).is_some() {
            self.touch(&id);
            return Ok((Visit::Hit, Plan::default()));
        }
        if self.known.contains_key(&id) {
            return Ok((Visit::Recall, self.recall_with(id, stored)?));
        }
        if stored(&Key::canonical(self.cfg.model, id)) {
            self.check_new("visit", &id, n_tokens)?;
            self.check_fits("visit", n_tokens)?;
            let now = self.tick();
            self.known.insert(
                id,
                Known {
                    n_tokens,
                    arrival: now,
                    relevance: 0.0,
                },
            );
            self.canonical.insert(id);
            return match self.recall_with(id, stored) {
                Ok(plan) => Ok((Visit::Stored, plan)),
                Err(e) => {
                    self.known.remove(&id);
                    self.canonical.remove(&id);
                    Err(e)
                }
            };
        }
        Ok((Visit::New, self.insert_with(id, n_tokens, stored)?))
    }

    /// [`Window::pin`], or where `stored` reports the chunk's canonical KV and it goes first, its
    /// relocation from the store (exact: nothing precedes it).
    pub fn pin_stored(&mut self, id: ChunkId, n_tokens: usize, stored: &dyn Fn(&Key) -> bool) -> Result<Plan> {
        if self.end() != 0 || !stored(&Key::canonical(self.cfg.model, id)) {
            return self.pin(id, n_tokens);
        }
        let mut plan = self.pin(id, n_tokens)?;
        let encode = |s: &Step| matches!(s, Step::Prefill { .. } | Step::StoreCanonical { .. });
        plan.steps.retain(|s| !encode(s));
        plan.background.retain(|s| !encode(s));
        plan.push(Step::Recall { chunk: id });
        plan.push(Step::Place {
            chunk: id,
            at: 0,
            patch: None,
        });
        self.canonical.insert(id);
        if let Some(s) = self.slots.last_mut() {
            s.state = SlotState::Relocated;
        }
        Ok(plan)
    }

    /// Recall by relevance: brings back evicted chunks whose relevance ([`Window::set_relevance`])
    /// exceeds `min_score`, most relevant first (ties: latest arrival), each after the placed chunks; room is made by
    /// evicting only resident chunks less relevant than the one coming back (least relevant,
    /// then least recently used, first). A chunk that would need a more relevant one evicted stays
    /// out. `stored` reports patches in the store, as in [`Window::recall_with`].
    pub fn recall_relevant(&mut self, min_score: f64, stored: &dyn Fn(&Key) -> bool) -> Result<Plan> {
        let mut cands: Vec<(ChunkId, Known)> = self
            .known
            .iter()
            .filter(|(id, k)| k.relevance > min_score && self.slot(id).is_none())
            .map(|(id, k)| (*id, *k))
            .collect();
        // Most relevant first; on a tie the latest arrival (the newer evidence: a result page
        // over the form that led to it).
        cands.sort_by(|a, b| {
            b.1.relevance
                .total_cmp(&a.1.relevance)
                .then(b.1.arrival.cmp(&a.1.arrival))
        });
        let mut plan = Plan::default();
        for (id, k) in cands {
            let fixed = self.pinned_tokens();
            if k.n_tokens + fixed > self.cfg.budget_tokens {
                continue;
            }
            let mut order: Vec<&Slot> = self
                .slots
                .iter()
                .filter(|s| !s.pinned && s.relevance < k.relevance)
                .collect();
            order.sort_by(|a, b| a.relevance.total_cmp(&b.relevance).then(a.last_used.cmp(&b.last_used)));
            let mut free = self.cfg.budget_tokens - self.chunk_tokens();
            let mut victims = BTreeSet::new();
            for s in order {
                if free >= k.n_tokens {
                    break;
                }
                victims.insert(s.chunk);
                free += s.n_tokens;
            }
            if free < k.n_tokens {
                continue;
            }
            let evicted: Vec<String> = victims.iter().map(crate::error::short).collect();
            self.evict_many(&victims, &mut plan, stored);
            let mut p = self.recall_with(id, stored)?;
            for d in &mut p.decisions {
                d.reason = format!(
                    "relevance {:.2} over evicted [{}]; {}",
                    k.relevance,
                    evicted.join(", "),
                    d.reason
                );
            }
            plan.append(p);
        }
        Ok(plan)
    }
}
