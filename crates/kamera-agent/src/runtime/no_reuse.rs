//! The no-reuse baseline (`SessionConfig::reuse = false`, `kamera run --no-reuse`): the window
//! still decides which pages are in the context (the same budget, eviction and recall), but no
//! plan is executed, nothing is stored or formed, and every [`Session::context`] prefills the
//! window's tokens from scratch. Any scenario can be timed against it.

use std::time::Instant;

use kamera_sched::{Plan, Visit};
use kamera_store::ChunkId;

use crate::error::Result;
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

    /// The window's context encoded from scratch: every token of every chunk in the window, at
    /// positions from 0, each screenshot through the vision tower again, as an engine without
    /// reuse does.
    pub(crate) fn context_no_reuse(&mut self) -> Result<&mut kamera_model::Context> {
        let t = Instant::now();
        let w = self.reencode_window()?;
        self.stats.prefill_tokens += w.tokens;
        self.stats.images_encoded += w.images;
        tracing::debug!(
            tokens = w.tokens,
            images = w.images,
            ms = crate::ms(t),
            "no reuse: window re-encoded"
        );
        Ok(self.exec.encoder_mut().replace_context(w.ctx))
    }

    /// The window encoded from scratch, as the no-reuse baseline's context is (and `kamera bench
    /// session`'s full re-encode): each text token prefilled and each screenshot resized and run
    /// through the vision tower again, at positions from 0. Neither the live context nor the
    /// session's counters are touched.
    pub fn reencode_window(&mut self) -> Result<Reencoded> {
        let chunks = self.window_chunks();
        let (ctx, tokens, images) = self.exec.encoder_mut().reencode(&chunks)?;
        Ok(Reencoded { ctx, tokens, images })
    }
}

/// A window encoded from scratch ([`Session::reencode_window`]).
pub struct Reencoded {
    pub ctx: kamera_model::Context,
    /// Tokens prefilled.
    pub tokens: usize,
    /// Screenshots run through the vision tower.
    pub images: usize,
}
