//! [`Session`]: one window, one store, one live model context. Pages and prompts become chunks by
//! content id; each visit is a kamera-sched plan (hit, insert, recall, evict, relocate, reorder)
//! executed in place, so a hit costs nothing and only chunks that moved are touched.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kamera_gpu::Backend;
use kamera_model::{Context, Model};
use kamera_ops::{ChunkKv, DType, PatchConfig};
use kamera_sched::{CostModel, Order, Plan, Visit, Window, WindowConfig};
use kamera_store::{ChunkId, ChunkStore, Key, ModelFp, Record};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::runtime::image::ImageContent;
use crate::runtime::relevance::Relevance;
use crate::scenario::Scenario;

/// Encoder name hashed into page chunk ids (the compact page text, tokenized).
pub(crate) const TEXT_ENCODER: &str = "page-text:v1";

/// Session settings.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Tokens of page chunks the window holds after the pinned prefix.
    pub window_tokens: usize,
    /// Rank policy, factor dtype and quantisation of the patches the session forms (by default
    /// the cost model's choice, [`CostModel::patch_config`]).
    pub patch: PatchConfig,
    /// The scheduler's cost model (calibrated with `kamera calibrate`, else defaults).
    pub cost: CostModel,
    /// Which chunk leaves first when room is needed.
    pub evict: Order,
    /// Relevance recall: evicted chunks scoring above this are brought back before a question.
    pub min_relevance: f64,
    /// Keep a new chunk's canonical prefill, its storage and its difference patch for
    /// [`Session::settle`] (after the model call) instead of doing them before the first token.
    pub defer: bool,
    /// Repair survivors of an eviction in [`Session::settle`] (prefill them again in place and
    /// store their patches for the new context), so a recurring context is served exactly.
    pub repair: bool,
    /// Pixel budget of a screenshot chunk ([`Session::observe_image`]): larger screenshots are
    /// downscaled, as the model's preprocessor does, to fit (28x28 pixels per merged token).
    pub image_max_pixels: usize,
    /// Reuse KV between steps. `false` is the no-reuse baseline (runtime/no_reuse.rs): every
    /// [`Session::context`] re-prefills the window from scratch; nothing is stored or formed.
    pub reuse: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            window_tokens: 1536,
            patch: CostModel::default().patch_config(),
            cost: CostModel::default(),
            evict: Order::Recency,
            min_relevance: 1.0,
            defer: true,
            repair: true,
            image_max_pixels: 28 * 28 * 256,
            reuse: true,
        }
    }
}

impl SessionConfig {
    /// The session a scenario's `[budget]` asks for (window, patch rank, repair, image size)
    /// under the default cost model.
    pub fn for_scenario(scenario: &Scenario) -> SessionConfig {
        SessionConfig::for_scenario_with(scenario, CostModel::default())
    }
    /// As [`SessionConfig::for_scenario`] under `cost`: patches are its choice
    /// ([`CostModel::patch_config`]) unless the scenario fixes their rank.
    pub fn for_scenario_with(scenario: &Scenario, cost: CostModel) -> SessionConfig {
        SessionConfig {
            window_tokens: scenario.budget.window_tokens,
            patch: match scenario.budget.patch_rank {
                Some(rank) => PatchConfig::fixed(rank, DType::F32),
                None => cost.patch_config(),
            },
            cost,
            repair: scenario.budget.repair,
            image_max_pixels: scenario.budget.screenshot_pixels,
            ..SessionConfig::default()
        }
    }
}

/// Milliseconds spent executing one plan, by kind of work.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplyTimings {
    /// Forward passes: new chunks alone and in place, re-prefills.
    pub prefill_ms: f64,
    /// Conditioned prefills + SVDs forming patches, and difference patches.
    pub patch_ms: f64,
    /// Relocating and patching chunks (the Backend), reading them from the store.
    pub place_ms: f64,
    /// Writing moved chunks into the model context.
    pub sync_ms: f64,
}

/// What one visit, pin or recall did.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    /// The chunk visited (none for a relevance recall).
    pub chunk: Option<ChunkId>,
    pub visit: Option<Visit>,
    pub plan: Plan,
    /// Tokens that went through a forward pass for this plan.
    pub prefill_tokens: usize,
    pub timings: ApplyTimings,
}

/// Work done over a session's life.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionStats {
    pub hits: usize,
    pub new: usize,
    pub recalls: usize,
    /// Chunks met for the first time in this session whose canonical KV was already stored.
    pub stored: usize,
    pub evictions: usize,
    pub relocations: usize,
    /// Tokens through forward passes (page, prefix and patch-forming prefills, repairs).
    pub prefill_tokens: usize,
    /// Of those, tokens prefilled again after the answer to repair survivors of evictions.
    pub repair_tokens: usize,
    /// Tokens placed from canonical KV (relocated, patched) without a prefill.
    pub placed_tokens: usize,
    pub patches_formed: usize,
    pub patches_applied: usize,
    /// KV bytes written by relocation, placement and into the model context.
    pub bytes_moved: u64,
    /// Screenshots run through the vision tower (once per image the session had to prefill).
    #[serde(default)]
    pub images_encoded: usize,
    /// Milliseconds of deferred work executed (canonical KV, patches, repairs run after the
    /// answer or in the background): part of the session's total work, off the first token.
    #[serde(default)]
    pub deferred_ms: f64,
}

impl SessionStats {
    /// The work done since `earlier` (a snapshot of the same session).
    pub fn since(&self, earlier: &SessionStats) -> SessionStats {
        SessionStats {
            hits: self.hits - earlier.hits,
            new: self.new - earlier.new,
            recalls: self.recalls - earlier.recalls,
            stored: self.stored - earlier.stored,
            evictions: self.evictions - earlier.evictions,
            relocations: self.relocations - earlier.relocations,
            prefill_tokens: self.prefill_tokens - earlier.prefill_tokens,
            repair_tokens: self.repair_tokens - earlier.repair_tokens,
            placed_tokens: self.placed_tokens - earlier.placed_tokens,
            patches_formed: self.patches_formed - earlier.patches_formed,
            patches_applied: self.patches_applied - earlier.patches_applied,
            bytes_moved: self.bytes_moved - earlier.bytes_moved,
            images_encoded: self.images_encoded - earlier.images_encoded,
            deferred_ms: self.deferred_ms - earlier.deferred_ms,
        }
    }
}

/// A chunk's content: what a prefill needs.
#[derive(Debug, Clone)]
pub(crate) struct Content {
    pub tokens: Vec<u32>,
    /// An image chunk's pixels and tower output (its `tokens` are the vision markers and pads).
    pub image: Option<Arc<ImageContent>>,
}

/// A resident chunk's KV at its window position, with the version that the context copy of it
/// must match.
pub(crate) struct Resident {
    pub kv: ChunkKv,
    pub version: u64,
}

/// The runtime session.
pub struct Session {
    pub(crate) model: Arc<Model>,
    pub(crate) fp: ModelFp,
    pub(crate) store: Arc<dyn ChunkStore>,
    pub(crate) backend: Box<dyn Backend + Send>,
    pub(crate) cfg: SessionConfig,
    pub(crate) window: Window,
    pub(crate) content: HashMap<ChunkId, Content>,
    pub(crate) resident: HashMap<ChunkId, Resident>,
    /// Canonical KV needed by the plan being executed.
    pub(crate) staged: HashMap<ChunkId, Arc<Record>>,
    /// Conditioned KV computed by a FormPatch step of the plan being executed (exact where it was
    /// computed).
    pub(crate) exact: HashMap<ChunkId, ChunkKv>,
    /// Resident chunks whose KV still carries an evicted chunk's conditioning.
    pub(crate) stale: std::collections::HashSet<ChunkId>,
    /// Steps kept for [`Session::settle`].
    pub(crate) deferred: Vec<kamera_sched::Step>,
    pub(crate) ctx: Context,
    /// The chunks (id, version) whose rows the context holds, in order from position 0.
    pub(crate) ctx_chunks: Vec<(ChunkId, u64)>,
    pub(crate) version: u64,
    pub(crate) stats: SessionStats,
    pub(crate) relevance: Relevance,
    pinned_tokens: usize,
    /// The page chunk observed last: never evicted by a recall for relevance.
    last: Option<ChunkId>,
    /// Images run through the vision tower (counted where the tower runs, behind `&self`).
    pub(crate) images_encoded: AtomicUsize,
}

impl Session {
    /// A session over `store` (canonical KV and patches of `model`), relocating and patching
    /// through `backend`.
    pub fn new(
        model: Arc<Model>,
        store: Arc<dyn ChunkStore>,
        backend: Box<dyn Backend + Send>,
        cfg: SessionConfig,
    ) -> Session {
        let fp = ModelFp::of(model.fingerprint());
        let mut wcfg = WindowConfig::new(cfg.window_tokens, fp);
        wcfg.cost = cfg.cost.clone();
        wcfg.evict = cfg.evict;
        let ctx = model.empty_context();
        Session {
            model,
            fp,
            store,
            backend,
            window: Window::new(wcfg),
            cfg,
            content: HashMap::new(),
            resident: HashMap::new(),
            staged: HashMap::new(),
            exact: HashMap::new(),
            stale: Default::default(),
            deferred: Vec::new(),
            ctx,
            ctx_chunks: Vec::new(),
            version: 0,
            stats: SessionStats::default(),
            relevance: Relevance::default(),
            pinned_tokens: 0,
            last: None,
            images_encoded: AtomicUsize::new(0),
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
    pub fn window(&self) -> &Window {
        &self.window
    }
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }
    pub fn store(&self) -> &Arc<dyn ChunkStore> {
        &self.store
    }
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }
    /// The backend's name (`cpu`, `cuda`).
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The content id of a page chunk: what the model reads of it (its text), under this model
    /// (kamera-store's id scheme). The screenshot is not part of a text chunk's id: a blinking
    /// caret must not make the same text a new chunk.
    pub fn chunk_id(&self, text: &str) -> ChunkId {
        ChunkId::of(text.as_bytes(), TEXT_ENCODER, self.fp)
    }

    /// Tokens of a chunk text (`bos` for the first chunk of a context).
    pub fn tokenize(&self, text: &str, bos: bool) -> Result<Vec<u32>> {
        crate::llm::tokenize(&self.model, text, bos)
    }

    /// The tokens of a chunk this session has met.
    pub fn chunk_tokens(&self, id: &ChunkId) -> Option<&[u32]> {
        self.content.get(id).map(|c| c.tokens.as_slice())
    }

    /// Keeps a chunk's tokens; a page chunk (`scored`) also joins relevance scoring.
    fn learn(&mut self, id: ChunkId, text: &str, tokens: Vec<u32>, scored: bool) {
        if scored && !self.content.contains_key(&id) {
            self.relevance.add(id, text);
        }
        self.content.insert(id, Content { tokens, image: None });
    }

    /// Whether the store holds `key` (a store that cannot answer counts as not holding it).
    pub(crate) fn stored(store: &dyn ChunkStore, key: &Key) -> bool {
        store.contains(key).unwrap_or_else(|e| {
            tracing::warn!(%key, error = %e, "store: contains failed; treated as absent");
            false
        })
    }

    /// Tokens of the pinned prefix (0 before [`Session::pin`]).
    pub fn pinned_tokens(&self) -> usize {
        self.pinned_tokens
    }

    /// Pins the prefix chunk (system turn, goal) at the front of the window. The window's budget
    /// grows by its tokens, so pages keep `window_tokens`.
    pub fn pin(&mut self, text: &str) -> Result<Applied> {
        self.settle()?;
        let tokens = self.tokenize(text, true)?;
        let id = ChunkId::of(&tokens_bytes(&tokens), "prefix:v1", self.fp);
        self.learn(id, text, tokens.clone(), false);
        let n = tokens.len();
        self.window
            .set_budget(self.cfg.window_tokens + self.pinned_tokens + n)?;
        self.pinned_tokens += n;
        let store = self.store.clone();
        let plan = self.window.pin_stored(id, n, &|k| Self::stored(store.as_ref(), k))?;
        self.apply(Some(id), None, plan)
    }

    /// A page observed: its chunk (`text`, the page's chunk text) is met by the window
    /// ([`Window::visit`]) and the plan is executed.
    pub fn observe(&mut self, text: &str) -> Result<Applied> {
        self.settle()?;
        let id = self.chunk_id(text);
        let tokens = match self.content.get(&id) {
            Some(c) => c.tokens.clone(),
            None => self.tokenize(text, false)?,
        };
        let n = tokens.len();
        self.learn(id, text, tokens, true);
        let store = self.store.clone();
        let (visit, plan) = self.window.visit(id, n, &|k| Self::stored(store.as_ref(), k))?;
        self.count_visit(id, visit);
        self.apply(Some(id), Some(visit), plan)
    }

    pub(crate) fn count_visit(&mut self, id: ChunkId, visit: Visit) {
        self.last = Some(id);
        match visit {
            Visit::Hit => self.stats.hits += 1,
            Visit::New => self.stats.new += 1,
            Visit::Recall => self.stats.recalls += 1,
            Visit::Stored => self.stats.stored += 1,
        }
    }

    /// Recall by relevance before a model call: every chunk met is scored against `query` (the
    /// goal, the question, remembered values); evicted chunks above
    /// [`SessionConfig::min_relevance`] come back, evicting only less relevant ones.
    pub fn recall_relevant(&mut self, query: &str) -> Result<Applied> {
        let scores = self.relevance.scores(query);
        for (id, s) in &scores {
            let s = if Some(*id) == self.last { f64::INFINITY } else { *s };
            self.window.set_relevance(id, s);
        }
        let store = self.store.clone();
        let plan = self
            .window
            .recall_relevant(self.cfg.min_relevance, &|k| Self::stored(store.as_ref(), k))?;
        self.stats.recalls += plan.count("place") + plan.count("prefill");
        self.apply(None, None, plan)
    }

    /// Evicts a placed chunk (its canonical KV stays in the store; the chunks after it are
    /// re-rotated).
    pub fn evict(&mut self, id: &ChunkId) -> Result<Applied> {
        self.settle()?;
        let plan = self.window.evict(id)?;
        self.apply(Some(*id), None, plan)
    }

    /// The model context of the window (positions `0..end`), ready for a model call that
    /// appends a prompt with [`Model::extend`] and truncates back to [`Context::len`] after.
    pub fn context(&mut self) -> Result<&mut Context> {
        if !self.cfg.reuse {
            return self.context_no_reuse();
        }
        let end = self.window.end();
        self.sync_to(end)?;
        Ok(&mut self.ctx)
    }

    /// The tokens of the window's chunks in order (what a full re-prefill would run).
    pub fn window_tokens(&self) -> Vec<u32> {
        self.window
            .slots()
            .iter()
            .filter_map(|s| self.content.get(&s.chunk))
            .flat_map(|c| c.tokens.iter().copied())
            .collect()
    }

    /// Runs deferred work, then makes every record written durable.
    pub fn flush(&mut self) -> Result<()> {
        self.settle()?;
        Ok(self.store.flush()?)
    }

    pub(crate) fn apply(&mut self, chunk: Option<ChunkId>, visit: Option<Visit>, mut plan: Plan) -> Result<Applied> {
        if !self.cfg.reuse {
            return self.apply_no_reuse(chunk, visit, plan);
        }
        self.patch_survivors(&mut plan);
        let content = &self.content;
        let prefill_tokens = plan.prefill_tokens(|id| content.get(id).map_or(0, |c| c.tokens.len()));
        let timings = self.execute(&plan);
        self.stats.images_encoded = self.images_encoded.load(Ordering::Relaxed);
        let timings = timings?;
        self.mark_stale(&plan);
        self.stats.prefill_tokens += prefill_tokens;
        self.stats.evictions += plan.count("evict");
        self.stats.relocations += plan.count("relocate");
        for d in &plan.decisions {
            tracing::debug!(decision = %d, "plan");
        }
        Ok(Applied {
            chunk,
            visit,
            plan,
            prefill_tokens,
            timings,
        })
    }
}

/// The bytes a prefix chunk id hashes: its tokens, little-endian.
fn tokens_bytes(tokens: &[u32]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}
