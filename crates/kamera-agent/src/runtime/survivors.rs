//! Survivors of an eviction: the chunks after an evicted one are re-rotated (exact as rotation),
//! but their KV still carries the evicted chunk's conditioning. Where the store holds a patch for
//! a survivor's new earlier context, it is placed from canonical KV + that patch instead; the rest
//! are repaired after the answer (`Session::settle`): prefilled again in place and their patch for
//! this context stored, so the next time this context recurs the survivor is placed with no model
//! call.

use kamera_sched::{Plan, Step};

use crate::runtime::session::Session;

impl Session {
    /// Replaces a survivor's `Relocate` by a placement with the stored patch for its new earlier
    /// context, where there is one (a chunk relocated once and not evicted later in the plan).
    pub(crate) fn patch_survivors(&self, plan: &mut Plan) {
        let mut out = Vec::with_capacity(plan.steps.len());
        for (i, step) in plan.steps.iter().enumerate() {
            if let Step::Relocate { chunk, .. } = step {
                let later = &plan.steps[i + 1..];
                let moved_again = later.iter().any(
                    |s| matches!(s, Step::Relocate { chunk: c, .. } | Step::EvictToStore { chunk: c } if c == chunk),
                );
                if !moved_again
                    && let (Some(key), Some(slot)) = (self.window.patch_key(chunk), self.window.slot(chunk))
                    && Self::stored(self.store.as_ref(), &key)
                {
                    out.push(Step::Recall { chunk: *chunk });
                    out.push(Step::Place {
                        chunk: *chunk,
                        at: slot.start,
                        patch: Some(key),
                    });
                    continue;
                }
            }
            out.push(step.clone());
        }
        plan.steps = out;
    }

    /// Tracks which resident chunks carry stale conditioning after `plan`: re-rotated survivors
    /// become stale; chunks placed or prefilled in place are not; evicted ones leave.
    pub(crate) fn mark_stale(&mut self, plan: &Plan) {
        for s in &plan.steps {
            match s {
                Step::Relocate { chunk, .. } => {
                    self.stale.insert(*chunk);
                }
                Step::Place { chunk, .. }
                | Step::Prefill {
                    chunk, alone: false, ..
                }
                | Step::EvictToStore { chunk } => {
                    self.stale.remove(chunk);
                }
                _ => {}
            }
        }
    }

    /// The repair of the window from the first stale chunk on: every placed chunk from there is
    /// prefilled again in place (exact) and its patch for this context stored. Empty when
    /// nothing is stale or repair is off.
    pub(crate) fn repair_steps(&mut self) -> Vec<Step> {
        let stale = std::mem::take(&mut self.stale);
        if !self.cfg.repair {
            return Vec::new();
        }
        let slots = self.window.slots();
        let Some(first) = slots.iter().position(|s| stale.contains(&s.chunk) && !s.pinned) else {
            return Vec::new();
        };
        let mut repair = Vec::new();
        for s in &slots[first..] {
            repair.push(Step::Prefill {
                chunk: s.chunk,
                at: s.start,
                alone: false,
            });
            if let Some(key) = self.window.patch_key(&s.chunk) {
                repair.push(Step::StorePatch { chunk: s.chunk, key });
            }
        }
        repair
    }
}
