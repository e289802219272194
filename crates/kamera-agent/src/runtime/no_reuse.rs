//! The no-reuse baseline (`SessionConfig::reuse = false`, `kamera run --no-reuse`): the window
//! still decides which pages are in the context (the same budget, eviction and recall), but no
//! plan is executed, nothing is stored or formed, and every [`Session::context`] prefills the
//! window's tokens from scratch. Any scenario can be timed against it.

use std::time::Instant;

use kamera_sched::{Plan, Visit};
use kamera_store::ChunkId;

use crate::error::{Error, Result, model};
use crate::runtime::session::{Applied, ApplyTimings, Session};

impl Session {
    /// A plan met without reuse: the window has moved, the KV is not touched (it is rebuilt at
    /// the next [`Session::context`]).
    pub(crate) fn apply_no_reuse(
        &mut self,
        chunk: Option<ChunkId>,
        visit: Option<Visit>,
        plan: Plan,
    ) -> Result<Applied> {
        self.stats.evictions += plan.count("evict");
        Ok(Applied {
            chunk,
            visit,
            plan,
            prefill_tokens: 0,
            timings: ApplyTimings::default(),
        })
    }

    /// The window's context prefilled from scratch: every token of every chunk in the window,
    /// at positions from 0, as a full re-prefill does.
    pub(crate) fn context_no_reuse(&mut self) -> Result<&mut kamera_model::Context> {
        if self.window.slots().iter().any(|s| {
            self.exec
                .encoder()
                .content
                .get(&s.chunk)
                .is_some_and(|c| c.image.is_some())
        }) {
            return Err(Error::Runtime {
                op: "Session::context (no reuse)",
                detail: "the no-reuse baseline prefills text chunks only; this window holds a screenshot".into(),
            });
        }
        let tokens = self.window_tokens();
        let t = Instant::now();
        let mut ctx = self.model.empty_context();
        if !tokens.is_empty() {
            self.model.extend(&tokens, &mut ctx).map_err(model("prefill"))?;
        }
        self.stats.prefill_tokens += tokens.len();
        tracing::debug!(
            tokens = tokens.len(),
            ms = crate::ms(t),
            "no reuse: window re-prefilled"
        );
        Ok(self.exec.encoder_mut().replace_context(ctx))
    }
}
