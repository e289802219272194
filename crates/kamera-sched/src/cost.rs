//! The cost model: per chunk, reuse (relocate + patch) or re-prefill, and whether forming a patch
//! pays for itself. Every choice comes with the estimates behind it.

use std::fmt;
use std::sync::Arc;

use kamera_ops::{BasisCoding, DType, PatchBasis, PatchConfig};
use kamera_store::ChunkId;
use serde::{Deserialize, Serialize};

use crate::error::short;
use crate::plan::Step;
use crate::points::default_patch_points;

mod repair;

/// Linear estimates in µs. The defaults are SmolLM2-135M as `kamera calibrate` measured it on a
/// 2-core AMD EPYC (Zen 4 class, AVX-512 BF16) on 2026-12-07, rounded; a runner should calibrate
/// them on its own machine.
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
    /// Orderings prefilled to form orbit patches (every ordering of a set up to this many, else
    /// its rotations and sampled ones; 6: every ordering of 3 chunks, as the eval measured).
    pub orbit_orderings: usize,
    /// Prior share of new chunks that come back later after the same earlier context (a
    /// revisit, a recall, the same task run again): weighs keeping a first visit's difference
    /// patch.
    pub revisit_rate: f64,
    /// Bytes a chunk's patch may add, as a fraction of its canonical KV bytes: the patch
    /// configuration is the best measured point within it ([`CostModel::patch_point`]).
    pub patch_bytes_budget: f64,
    /// Bytes a chunk's orbit patches may add together (fraction of its KV bytes): slot-
    /// conditioned orbit patches (one per slot) are chosen when they fit.
    pub orbit_bytes_budget: f64,
    /// Share of a per-placement patch's gap recovery that the plain orbit mean keeps on the
    /// orderings of its set, and that slot-conditioned orbit patches keep (measured, kamera-eval
    /// README, rank 32: 0.63–0.75 and 0.86–0.95 over three models).
    pub orbit_mean_share: f64,
    pub orbit_slot_share: f64,
    /// The patch configurations to choose from, with their measured quality and size (not
    /// serialised: [`default_patch_points`] unless set in code; the runtime sets the model's
    /// own, [`crate::measured_points`] by its fingerprint).
    #[serde(skip, default = "default_patch_points")]
    pub patch_points: Vec<PatchPoint>,
    /// The model's patch basis, when loaded: transform-coded points ([`PatchPoint::coded`]) are
    /// chosen only with one (not serialised).
    #[serde(skip)]
    pub basis: Option<Arc<PatchBasis>>,
    /// How a chunk's canonical record is made ([`CanonicalSource`]).
    pub canonical: CanonicalSource,
    /// Most mean KL (next-token distribution against a full re-prefill of the same window) that a
    /// placement without a forward pass may cost: where the predicted KL of a blind placement is
    /// above it, the window re-prefills or patches instead.
    pub kl_budget: f64,
    /// Predicted answer KL of a recalled chunk placed blind: its kept KV relocated, no patch.
    /// The runtime sets the model's measured value ([`crate::measured_blind_kl`]); default 0.1,
    /// above the default budget, for a model never measured (SmolLM2-135M's order: `kamera bench
    /// session --steps 40 --window 512` measured 0.125 with blind recalls and repaired
    /// survivors, 2026-12-03).
    pub recall_blind_kl: f64,
    /// Predicted answer KL of survivors of an eviction re-rotated blind, as llama.cpp's context
    /// shift does. Above [`CostModel::kl_budget`], survivors are repaired. The runtime sets the
    /// model's measured value; default 0.1 (the same bench measured 0.097 on SmolLM2-135M with
    /// exact recalls and blind survivors).
    pub survivor_blind_kl: f64,
    /// Predicted KL of an answer read from a page placed blind (a question about it): a read
    /// depends on the page's exact content more than the next action does. Above
    /// [`CostModel::kl_budget`], a question's page placed blind is prefilled again in place before
    /// the answer ([`crate::Window::repair_read`]). The runtime sets the model's measured value;
    /// default 0.1.
    pub read_blind_kl: f64,
    /// The window (tokens) the survivors' and the read's blind KLs were measured at; 0: not
    /// scaled. A survivor re-rotated blind still holds what the evicted chunks wrote into it,
    /// and a read goes through all of it, so the predicted KL grows with the stale KV a read
    /// crosses: both are scaled by `window / blind_kl_window` ([`CostModel::survivor_kl`]).
    /// Measured on Qwen2.5-0.5B: the steps after a slide cost mean KL 5.1e-3 at window 512 and
    /// 9.6e-3 at 1024 (bench/session, qwen-w512-read and qwen-w1024-read).
    pub blind_kl_window: usize,
}

/// Where a chunk's canonical record (the KV a recall relocates) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CanonicalSource {
    /// The chunk's KV as first met in the window, relocated to position 0 when it is evicted (or
    /// the session flushes): no forward pass. It keeps what preceded it then (the pinned prefix,
    /// earlier pages), so a recall after the same context is exact by relocation alone.
    #[default]
    Kept,
    /// The chunk prefilled alone (KV(B|∅), the paper's canonical KV) in the background, one
    /// more forward pass per new chunk.
    Alone,
}

/// A patch configuration with its measured gap recovered (1 − KL/KL_blind against the full
/// re-prefill) and added bytes (÷ the chunk's canonical KV bytes, as kamera-store encodes both).
#[derive(Debug, Clone, PartialEq)]
pub struct PatchPoint {
    /// A human label (the `kamera eval` method that measured it), for logs only: no logic reads
    /// it.
    pub label: String,
    pub config: PatchConfig,
    pub gap: f64,
    pub bytes: f64,
    /// Transform-coded in the model's basis (`Some(entropy)`): [`CostModel::patch_config`] fills
    /// in [`CostModel::basis`], and the point is not chosen without one.
    pub coded: Option<bool>,
    /// µs per token that forming a patch of this point costs beyond the SVD (the transform
    /// coder's greedy; 0 for factors): part of [`CostModel::svd`].
    pub form_us_per_token: f64,
}

/// Which orbit patches a reorder forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrbitVariant {
    /// One patch per chunk: the mean deficit over every ordering of the set.
    Mean,
    /// One patch per chunk and slot within the set: the mean over the orderings that put it
    /// there (none for the first slot when nothing precedes the set).
    Slot,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            prefill_us_per_token: 1000.0,
            attn_us_per_token_ctx: 0.02,
            place_us_per_token: 16.0,
            read_us_per_token: 40.0,
            svd_us_per_token: 450.0,
            expected_reuses: 4.0,
            orbit_orderings: 6,
            revisit_rate: 0.5,
            patch_bytes_budget: 0.1,
            orbit_bytes_budget: 0.5,
            orbit_mean_share: 0.67,
            orbit_slot_share: 0.91,
            patch_points: default_patch_points(),
            basis: None,
            canonical: CanonicalSource::Kept,
            kl_budget: 0.01,
            recall_blind_kl: 0.1,
            survivor_blind_kl: 0.1,
            read_blind_kl: 0.1,
            blind_kl_window: 0,
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

/// What a [`Decision`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionOp {
    /// How a new chunk is placed.
    Insert,
    /// How an evicted chunk comes back.
    Recall,
    /// How a set of chunks is reordered (orbit patches, re-prefill).
    Reorder,
    /// What the survivors of an eviction get (blind, repaired, patched).
    Survivors,
    /// Whether the chunks placed blind are prefilled again before the model reads them.
    Read,
    /// Whether held plans run or the window is built afresh.
    Materialize,
}

impl fmt::Display for DecisionOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DecisionOp::Insert => "insert",
            DecisionOp::Recall => "recall",
            DecisionOp::Reorder => "reorder",
            DecisionOp::Survivors => "survivors",
            DecisionOp::Read => "read",
            DecisionOp::Materialize => "materialize",
        })
    }
}

/// One decision and its explanation.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub op: DecisionOp,
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
    /// The patch configuration to form: the point with the most gap recovered within
    /// [`CostModel::patch_bytes_budget`] (ties: fewer bytes), else the smallest point.
    /// Transform-coded points count only with [`CostModel::basis`] loaded.
    pub fn patch_point(&self) -> Option<&PatchPoint> {
        let usable = || {
            self.patch_points
                .iter()
                .filter(|p| p.coded.is_none() || self.basis.is_some())
        };
        let fits = usable().filter(|p| p.bytes <= self.patch_bytes_budget);
        fits.max_by(|a, b| a.gap.total_cmp(&b.gap).then(b.bytes.total_cmp(&a.bytes)))
            .or_else(|| usable().min_by(|a, b| a.bytes.total_cmp(&b.bytes)))
    }
    /// [`CostModel::patch_point`]'s configuration, with the model's basis for a transform-coded
    /// point (rank-16 bf16 factors without points).
    pub fn patch_config(&self) -> PatchConfig {
        let Some(p) = self.patch_point() else {
            return PatchConfig::fixed(16, DType::Bf16);
        };
        let mut cfg = p.config.clone();
        if let (Some(entropy), Some(basis)) = (p.coded, &self.basis) {
            cfg.basis = Some(BasisCoding {
                basis: basis.clone(),
                entropy,
            });
        }
        cfg
    }
    /// The orbit patches for a set of `n_chunks` chunks, `after_context` when chunks precede
    /// the set (then its first slot needs a patch too), and the patches per chunk it stores:
    /// slot-conditioned when they recover more and their bytes fit
    /// [`CostModel::orbit_bytes_budget`], else the mean.
    pub fn orbit_variant(&self, n_chunks: usize, after_context: bool) -> (OrbitVariant, usize) {
        let slots = if after_context {
            n_chunks
        } else {
            n_chunks.saturating_sub(1)
        };
        let bytes = self.patch_point().map_or(0.0, |p| p.bytes);
        if self.orbit_slot_share > self.orbit_mean_share && slots as f64 * bytes <= self.orbit_bytes_budget {
            (OrbitVariant::Slot, slots)
        } else {
            (OrbitVariant::Mean, 1)
        }
    }
    /// Orderings prefilled to form `variant`'s orbit patches of `n_chunks` chunks:
    /// [`CostModel::orbit_orderings`], and at least `n_chunks` for slot patches (the set's
    /// rotations put every chunk at every slot, [`kamera_ops::orbit_orderings`]).
    pub fn orderings_for(&self, n_chunks: usize, variant: OrbitVariant) -> usize {
        match variant {
            OrbitVariant::Mean => self.orbit_orderings.max(1),
            OrbitVariant::Slot => self.orbit_orderings.max(n_chunks).max(1),
        }
    }
    /// Prefill of `n` tokens after `ctx` context tokens.
    pub fn prefill(&self, n: usize, ctx: usize) -> f64 {
        let n = n as f64;
        n * self.prefill_us_per_token + self.attn_us_per_token_ctx * n * (ctx as f64 + n / 2.0)
    }
    /// Reading + relocating (+ patching) `n` tokens.
    pub fn reuse(&self, n: usize) -> f64 {
        n as f64 * (self.read_us_per_token + self.place_us_per_token)
    }
    /// SVDs of a patch of `n` tokens, and the coding of [`CostModel::patch_point`]'s patches.
    pub fn svd(&self, n: usize) -> f64 {
        let coding = self.patch_point().map_or(0.0, |p| p.form_us_per_token);
        n as f64 * (self.svd_us_per_token + coding)
    }

    /// Predicted µs of running `steps` in order (`tokens` of each chunk by id): forward passes
    /// at their context length, SVDs, reads and relocations; evictions and bookkeeping are free.
    pub fn steps_us(&self, steps: &[Step], tokens: &dyn Fn(&ChunkId) -> usize) -> f64 {
        steps
            .iter()
            .map(|s| match s {
                Step::Prefill { chunk, at, alone } => {
                    self.prefill(tokens(chunk), if *alone { 0 } else { *at as usize })
                }
                Step::FormPatch { chunk, at, .. } => {
                    self.prefill(tokens(chunk), *at as usize) + self.svd(tokens(chunk))
                }
                Step::StorePatch { chunk, .. } => self.svd(tokens(chunk)),
                Step::FormOrbit {
                    set,
                    keys,
                    orderings,
                    at,
                } => {
                    let n: usize = set.iter().map(tokens).sum();
                    orderings.len() as f64 * self.prefill(n, *at as usize)
                        + keys.len() as f64 * self.svd(n / set.len().max(1))
                }
                Step::Recall { chunk } => tokens(chunk) as f64 * self.read_us_per_token,
                Step::Place { chunk, .. } | Step::Relocate { chunk, .. } | Step::KeepCanonical { chunk, .. } => {
                    tokens(chunk) as f64 * self.place_us_per_token
                }
                Step::StoreCanonical { .. } | Step::EvictToStore { .. } | Step::DropTail { .. } => 0.0,
            })
            .sum()
    }

    /// A new chunk of `n` tokens appended after `ctx` tokens: it is prefilled in place (exact).
    /// With [`CanonicalSource::Kept`] that is all (its KV is kept at eviction, no second pass);
    /// with [`CanonicalSource::Alone`] it is also prefilled alone in the background, and the
    /// choice is whether to keep the difference of the two as the patch for this earlier context,
    /// which spares a conditioned prefill each time the chunk comes back after the same context.
    pub fn insert(&self, chunk: ChunkId, n: usize, ctx: usize) -> Decision {
        let canonical = self.prefill(n, 0);
        if self.canonical == CanonicalSource::Kept {
            let in_place = self.prefill(n, ctx);
            return Decision {
                op: DecisionOp::Insert,
                chunk: Some(chunk),
                choice: Choice::Reprefill,
                options: vec![
                    (Choice::Reprefill, in_place),
                    (Choice::PrefillKeepPatch, in_place + canonical + self.svd(n)),
                ],
                reason: format!(
                    "prefill in place (exact); its KV is kept as its canonical record when it leaves, which spares the {:.1} ms of a prefill alone",
                    canonical / 1000.0
                ),
            };
        }
        if ctx == 0 {
            return Decision {
                op: DecisionOp::Insert,
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
            op: DecisionOp::Insert,
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
    pub fn recall(&self, chunk: ChunkId, n: usize, ctx: usize, patch_cached: bool, expected_reuses: f64) -> Decision {
        let reuse = self.reuse(n);
        if ctx == 0 {
            return Decision {
                op: DecisionOp::Recall,
                chunk: Some(chunk),
                choice: Choice::Relocate,
                options: vec![(Choice::Relocate, reuse), (Choice::Reprefill, self.prefill(n, 0))],
                reason: "nothing precedes it: its stored KV relocated to 0".into(),
            };
        }
        let prefill = self.prefill(n, ctx);
        if patch_cached {
            return Decision {
                op: DecisionOp::Recall,
                chunk: Some(chunk),
                choice: Choice::CachedPatch,
                options: vec![(Choice::CachedPatch, reuse), (Choice::Reprefill, prefill)],
                reason: "a patch for this exact earlier context is in the store".into(),
            };
        }
        let form = prefill + self.svd(n) + reuse;
        let options = vec![
            (Choice::FormPatch, form),
            (Choice::Reprefill, prefill),
            (Choice::Blind, reuse),
        ];
        if self.recall_blind_kl <= self.kl_budget {
            return Decision {
                op: DecisionOp::Recall,
                chunk: Some(chunk),
                choice: Choice::Blind,
                options,
                reason: format!(
                    "its stored KV relocated without a patch: predicted KL {:.2e} within the budget {:.2e}",
                    self.recall_blind_kl, self.kl_budget
                ),
            };
        }
        let saved = expected_reuses * (prefill - reuse);
        let extra = form - prefill;
        let (choice, reason) = if saved > extra {
            (
                Choice::FormPatch,
                format!(
                    "blind placement's predicted KL {:.2e} is over the budget; forming costs {:.1} ms more than a re-prefill now and saves {:.1} ms over {expected_reuses:.2} expected reuses",
                    self.recall_blind_kl,
                    extra / 1000.0,
                    saved / 1000.0,
                ),
            )
        } else {
            (
                Choice::Reprefill,
                format!(
                    "blind placement's predicted KL {:.2e} is over the budget; a patch would save {:.1} ms over {expected_reuses:.2} expected reuses, less than the {:.1} ms it costs to form",
                    self.recall_blind_kl,
                    saved / 1000.0,
                    extra / 1000.0
                ),
            )
        };
        Decision {
            op: DecisionOp::Recall,
            chunk: Some(chunk),
            choice,
            options,
            reason,
        }
    }

    pub fn reorder(
        &self,
        tokens: usize,
        n_chunks: usize,
        ctx: usize,
        orbit_cached: bool,
        (variant, per_chunk): (OrbitVariant, usize),
    ) -> Decision {
        let reuse = self.reuse(tokens);
        let prefill = self.prefill(tokens, ctx);
        if orbit_cached {
            return Decision {
                op: DecisionOp::Reorder,
                chunk: None,
                choice: Choice::CachedPatch,
                options: vec![(Choice::CachedPatch, reuse), (Choice::Reprefill, prefill)],
                reason: "orbit patches for this set are in the store: any order is a relocation + patch".into(),
            };
        }
        let k = self.orderings_for(n_chunks, variant) as f64;
        let form = k * prefill + per_chunk.max(1) as f64 * self.svd(tokens) + reuse;
        let saved = self.expected_reuses * (prefill - reuse);
        let extra = form - prefill;
        let choice = if saved > extra && n_chunks > 1 {
            Choice::FormPatch
        } else {
            Choice::Reprefill
        };
        Decision {
            op: DecisionOp::Reorder,
            chunk: None,
            choice,
            options: vec![
                (Choice::FormPatch, form),
                (Choice::Reprefill, prefill),
                (Choice::Blind, reuse),
            ],
            reason: format!(
                "{variant:?} orbit patches ({per_chunk} per chunk) cost {:.1} ms more than re-prefilling this order ({k} orderings) and save {:.1} ms over {} expected reorders",
                extra / 1000.0,
                saved / 1000.0,
                self.expected_reuses
            ),
        }
    }
}
