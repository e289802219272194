//! The cost model: per chunk, reuse (relocate + patch) or re-prefill, and whether forming a patch
//! pays for itself. Every choice comes with the estimates behind it.

use std::fmt;

use kamera_store::ChunkId;
use serde::{Deserialize, Serialize};

use crate::error::short;

/// Linear estimates in µs. The defaults are SmolLM2-135M on a 2-core CPU (kamera-model and
/// kamera-ops measurements, order of magnitude); a runner should calibrate them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CostModel {
    /// Prefill cost per new token (MLPs, projections).
    pub prefill_us_per_token: f64,
    /// Prefill attention cost per new token per context token.
    pub attn_us_per_token_ctx: f64,
    /// Relocate + patch apply per token (memory bound).
    pub place_us_per_token: f64,
    /// Reading canonical KV from the store per token.
    pub read_us_per_token: f64,
    /// Truncated SVD per token when forming a patch (all layers, K and V).
    pub svd_us_per_token: f64,
    /// How many more times a formed patch is expected to be used (its amortisation horizon).
    pub expected_reuses: f64,
    /// Orderings sampled to form an orbit patch.
    pub orbit_orderings: usize,
    /// Prior share of new chunks that come back later after the same earlier context (a
    /// revisit, a recall, the same task run again): weighs keeping a first visit's difference
    /// patch.
    pub revisit_rate: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            prefill_us_per_token: 2000.0,
            attn_us_per_token_ctx: 2.0,
            place_us_per_token: 10.0,
            read_us_per_token: 5.0,
            svd_us_per_token: 300.0,
            expected_reuses: 4.0,
            orbit_orderings: 3,
            revisit_rate: 0.5,
        }
    }
}

/// What to do with one chunk (or one set, for a reorder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Choice {
    /// Relocate the canonical KV only: exact when nothing precedes it.
    Relocate,
    /// Relocate + a patch already in the store.
    CachedPatch,
    /// Form the patch now (one conditioned pass + SVD), cache it, then reuse.
    FormPatch,
    /// Prefill again in place: exact for this placement, nothing cached.
    Reprefill,
    /// Relocate the canonical KV without the patch it would need (lossy).
    Blind,
    /// A new chunk: prefill it in place (exact) and alone (canonical), and keep their
    /// difference as the patch for this earlier context (an SVD, no extra forward pass).
    PrefillKeepPatch,
}

/// One decision and its explanation.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The operation ("insert", "recall", "reorder", ...).
    pub op: &'static str,
    /// The chunk, or none for a set decision.
    pub chunk: Option<ChunkId>,
    pub choice: Choice,
    /// Estimated µs of every option considered, the chosen one included.
    pub options: Vec<(Choice, f64)>,
    pub reason: String,
}

impl Decision {
    pub fn chosen_cost(&self) -> f64 {
        self.options
            .iter()
            .find(|(c, _)| *c == self.choice)
            .map_or(0.0, |(_, x)| *x)
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.op)?;
        if let Some(c) = &self.chunk {
            write!(f, " {}", short(c))?;
        }
        write!(f, ": {:?} — {}", self.choice, self.reason)?;
        let opts: Vec<String> = self
            .options
            .iter()
            .map(|(c, x)| format!("{c:?} {:.1} ms", x / 1000.0))
            .collect();
        write!(f, " [{}]", opts.join(", "))
    }
}

impl CostModel {
    /// Prefill of `n` tokens after `ctx` context tokens.
    pub fn prefill(&self, n: usize, ctx: usize) -> f64 {
        let n = n as f64;
        n * self.prefill_us_per_token + self.attn_us_per_token_ctx * n * (ctx as f64 + n / 2.0)
    }
    /// Reading + relocating (+ patching) `n` tokens.
    pub fn reuse(&self, n: usize) -> f64 {
        n as f64 * (self.read_us_per_token + self.place_us_per_token)
    }
    /// SVDs of a patch of `n` tokens.
    pub fn svd(&self, n: usize) -> f64 {
        n as f64 * self.svd_us_per_token
    }

    /// A new chunk of `n` tokens appended after `ctx` tokens: it is prefilled in place (exact)
    /// and alone (its canonical KV, for the store); the choice is whether to keep the difference
    /// of the two as the patch for this earlier context, which spares a conditioned prefill each
    /// time the chunk comes back after the same context.
    pub fn insert(&self, chunk: ChunkId, n: usize, ctx: usize) -> Decision {
        let canonical = self.prefill(n, 0);
        if ctx == 0 {
            return Decision {
                op: "insert",
                chunk: Some(chunk),
                choice: Choice::Reprefill,
                options: vec![(Choice::Reprefill, canonical)],
                reason: "nothing precedes it: one prefill is both canonical and in place".into(),
            };
        }
        let both = self.prefill(n, ctx) + canonical;
        let keep = both + self.svd(n);
        let saved = self.revisit_rate * self.expected_reuses * (self.prefill(n, ctx) - self.reuse(n));
        let (choice, verb) = if saved > self.svd(n) {
            (Choice::PrefillKeepPatch, "keep")
        } else {
            (Choice::Reprefill, "skip")
        };
        Decision {
            op: "insert",
            chunk: Some(chunk),
            choice,
            options: vec![(Choice::PrefillKeepPatch, keep), (Choice::Reprefill, both)],
            reason: format!(
                "prefill in place (exact) and alone (canonical); {verb} the difference patch: its SVD costs {:.1} ms and saves {:.1} ms over {} expected reuses at a revisit rate of {}",
                self.svd(n) / 1000.0,
                saved / 1000.0,
                self.expected_reuses,
                self.revisit_rate
            ),
        }
    }

    /// A chunk of `n` tokens brought back (recall) after `ctx` tokens of fixed earlier context.
    pub fn recall(&self, chunk: ChunkId, n: usize, ctx: usize, patch_cached: bool) -> Decision {
        let reuse = self.reuse(n);
        if ctx == 0 {
            return Decision {
                op: "recall",
                chunk: Some(chunk),
                choice: Choice::Relocate,
                options: vec![(Choice::Relocate, reuse), (Choice::Reprefill, self.prefill(n, 0))],
                reason: "nothing precedes it: the relocated canonical KV is exact".into(),
            };
        }
        let prefill = self.prefill(n, ctx);
        if patch_cached {
            return Decision {
                op: "recall",
                chunk: Some(chunk),
                choice: Choice::CachedPatch,
                options: vec![(Choice::CachedPatch, reuse), (Choice::Reprefill, prefill)],
                reason: "a patch for this exact earlier context is in the store".into(),
            };
        }
        let form = prefill + self.svd(n) + reuse;
        let saved = self.expected_reuses * (prefill - reuse);
        let extra = form - prefill;
        let (choice, reason) = if saved > extra {
            (
                Choice::FormPatch,
                format!(
                    "forming costs {:.1} ms more than a re-prefill now and saves {:.1} ms over {} expected reuses",
                    extra / 1000.0,
                    saved / 1000.0,
                    self.expected_reuses
                ),
            )
        } else {
            (
                Choice::Reprefill,
                format!(
                    "a patch would save {:.1} ms over {} expected reuses, less than the {:.1} ms it costs to form",
                    saved / 1000.0,
                    self.expected_reuses,
                    extra / 1000.0
                ),
            )
        };
        Decision {
            op: "recall",
            chunk: Some(chunk),
            choice,
            options: vec![
                (Choice::FormPatch, form),
                (Choice::Reprefill, prefill),
                (Choice::Blind, reuse),
            ],
            reason,
        }
    }

    /// Reordering a set of `n_chunks` chunks, `tokens` in all, after `ctx` fixed tokens.
    pub fn reorder(&self, tokens: usize, n_chunks: usize, ctx: usize, orbit_cached: bool) -> Decision {
        let reuse = self.reuse(tokens);
        let prefill = self.prefill(tokens, ctx);
        if orbit_cached {
            return Decision {
                op: "reorder",
                chunk: None,
                choice: Choice::CachedPatch,
                options: vec![(Choice::CachedPatch, reuse), (Choice::Reprefill, prefill)],
                reason: "orbit patches for this set are in the store: any order is a relocation + patch".into(),
            };
        }
        let k = self.orbit_orderings.max(1) as f64;
        let form = k * prefill + self.svd(tokens) + reuse;
        let saved = self.expected_reuses * (prefill - reuse);
        let extra = form - prefill;
        let choice = if saved > extra && n_chunks > 1 {
            Choice::FormPatch
        } else {
            Choice::Reprefill
        };
        Decision {
            op: "reorder",
            chunk: None,
            choice,
            options: vec![
                (Choice::FormPatch, form),
                (Choice::Reprefill, prefill),
                (Choice::Blind, reuse),
            ],
            reason: format!(
                "orbit patches cost {:.1} ms more than re-prefilling this order ({k} orderings) and save {:.1} ms over {} expected reorders",
                extra / 1000.0,
                saved / 1000.0,
                self.expected_reuses
            ),
        }
    }
}
