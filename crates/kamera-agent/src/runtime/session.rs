//! [`Session`]: one window, one store, one live model context. Pages and prompts become chunks by
//! content id; each visit is a kamera-sched plan (hit, insert, recall, evict, relocate, reorder)
//! run by kamera-sched's executor over the session's encoder, so a hit costs nothing and only
//! chunks that moved are touched. The session plans nothing itself: the window plans and prices,
//! the executor runs, and background steps wait for [`Session::settle`]. Plans are held until the
//! model next reads the window ([`Session::context`]); the window then runs them or builds its
//! layout afresh, whichever costs less before the first token ([`Window::materialize`]).

use std::sync::Arc;

use kamera_gpu::Backend;
use kamera_model::{Context, Model};
use kamera_ops::{DType, PatchConfig};
use kamera_sched::{CostModel, ExecConfig, Executor, Order, Plan, Visit, Window, WindowConfig};
use kamera_store::{ChunkId, ChunkStore, Key, ModelFp};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::live::Live;
use crate::runtime::encoder::{Content, SessionEncoder};
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
    /// Relevance recall of a chunk that names none of the query's identifiers (an order
    /// number, a tracking code, a remembered value) also needs at least this share of the
    /// query's best score (0: the floor above alone). A chunk sharing only the goal's common
    /// words ("orders", "status") scores about half the question's page; recalling it costs a
    /// prefill and evicts a chunk the next step may want ([`Session::recall_scores`]).
    pub recall_share: f64,
    /// Run the plans' background steps (canonical KV formed alone, difference patches, repairs)
    /// in [`Session::settle`], off the path to the first token, instead of right after the plan.
    pub defer: bool,
    /// Allow the repair of survivors of an eviction (prefilled again in place before the page
    /// placed after them, or in [`Session::settle`] after an explicit evict; their patches for
    /// the new context stored) where the cost model predicts that blind survivors cost more KL
    /// than its budget ([`CostModel::survivors`]); off: never repaired.
    pub repair: bool,
    /// Pixel budget of a screenshot chunk ([`Session::observe_image`]): larger screenshots are
    /// downscaled, as the model's preprocessor does, to fit (28x28 pixels per merged token).
    pub image_max_pixels: usize,
    /// Bytes of vision-tower outputs kept by image chunk, least recently used out first
    /// ([`TowerCache`](crate::TowerCache); SGLang's default, 100 MiB, unless set): an image
    /// prefilled again after its output has gone runs through the tower again. Its pixels stay,
    /// as a PNG.
    pub tower_cache_bytes: usize,
    /// Most tiles a screenshot over [`SessionConfig::image_max_pixels`] is cut into
    /// ([`Session::observe_screenshot`]): horizontal bands, each its own image chunk at up to the
    /// pixel budget, so detail is kept at the cost of more image tokens; 1: the whole screenshot
    /// downscaled to the budget, as the model's preprocessor does.
    pub screenshot_tiles: usize,
    /// Most tokens of one page chunk: a longer page becomes several ([`Session::observe_page`]).
    /// Clamped to half of `window_tokens` ([`Session::page_cap`]).
    pub chunk_tokens_max: usize,
    /// Hold plans until the model next reads the window ([`Session::context`], [`Session::flush`])
    /// and run them then, or build the window afresh where that costs less before the first token
    /// ([`Window::materialize`]): pages that leave the window before any read cost no prefill.
    /// `false`: every plan runs as it is made.
    pub lazy: bool,
    /// Most milliseconds one [`Session::settle_until`] spends on background steps that may wait
    /// (patches formed from snapshots); the rest wait for a later settle. `None`: no budget
    /// beyond the caller's `stop`.
    pub background_budget_ms: Option<f64>,
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
            recall_share: 0.6,
            defer: true,
            repair: true,
            image_max_pixels: 28 * 28 * 256,
            tower_cache_bytes: crate::runtime::TOWER_CACHE_BYTES,
            screenshot_tiles: 1,
            chunk_tokens_max: crate::runtime::CHUNK_TOKENS_MAX,
            lazy: true,
            background_budget_ms: None,
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
        crate::assemble::session_config(&scenario.budget, cost)
    }
}

/// Milliseconds spent executing one plan, by kind of work (kamera-sched's [`kamera_sched::Timings`]).
pub type ApplyTimings = kamera_sched::Timings;

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
    /// Model calls that prefilled chunks: one per chunk, one per run of chunks in place the
    /// executor announced (made in one call).
    #[serde(default)]
    pub prefill_calls: usize,
    /// Of those, tokens prefilled again in the background to repair survivors of evictions
    /// (those of an explicit evict: an insert or a recall repairs its own before its page).
    pub repair_tokens: usize,
    /// Of those, tokens of chunks placed blind, prefilled again before a question's answer.
    #[serde(default)]
    pub read_repair_tokens: usize,
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
    /// Of that, forward passes (survivor repair, canonical KV alone) and patch SVDs.
    #[serde(default)]
    pub deferred_prefill_ms: f64,
    #[serde(default)]
    pub deferred_patch_ms: f64,
    /// Model reads at which the held plans were replaced by building the window afresh
    /// ([`SessionConfig::lazy`]).
    #[serde(default)]
    pub rebuilds: usize,
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
            prefill_calls: self.prefill_calls - earlier.prefill_calls,
            repair_tokens: self.repair_tokens - earlier.repair_tokens,
            read_repair_tokens: self.read_repair_tokens - earlier.read_repair_tokens,
            placed_tokens: self.placed_tokens - earlier.placed_tokens,
            patches_formed: self.patches_formed - earlier.patches_formed,
            patches_applied: self.patches_applied - earlier.patches_applied,
            bytes_moved: self.bytes_moved - earlier.bytes_moved,
            images_encoded: self.images_encoded - earlier.images_encoded,
            deferred_ms: self.deferred_ms - earlier.deferred_ms,
            deferred_prefill_ms: self.deferred_prefill_ms - earlier.deferred_prefill_ms,
            deferred_patch_ms: self.deferred_patch_ms - earlier.deferred_patch_ms,
            rebuilds: self.rebuilds - earlier.rebuilds,
        }
    }
}

/// The runtime session.
pub struct Session {
    pub(crate) model: Arc<Model>,
    pub(crate) fp: ModelFp,
    pub(crate) store: Arc<dyn ChunkStore>,
    pub(crate) cfg: SessionConfig,
    pub(crate) window: Window,
    /// The one executor of plans, over the session's encoder (model, live context, backend).
    pub(crate) exec: Executor<SessionEncoder, Arc<dyn ChunkStore>>,
    pub(crate) stats: SessionStats,
    pub(crate) relevance: Relevance,
    pinned_tokens: usize,
    /// The page chunk observed last: never evicted by a recall for relevance.
    last: Option<ChunkId>,
    /// Tokens prefilled by the background steps of repairs (for [`SessionStats::repair_tokens`]).
    repair_pending: usize,
    /// Plans made since the executor last ran (held until the model reads the window).
    pending: Vec<Plan>,
    /// The window as the executor's KV has it (after the last plan it ran).
    built: Window,
    /// Work run at model reads since [`Session::take_read_timings`].
    read_timings: ApplyTimings,
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
        wcfg.repair = cfg.repair;
        let enc = SessionEncoder::new(model.clone(), backend, cfg.image_max_pixels, cfg.tower_cache_bytes);
        let ecfg = ExecConfig {
            model: fp,
            patch: cfg.patch.clone(),
            dtype: DType::F32,
        };
        Session {
            exec: Executor::new(enc, store.clone(), ecfg),
            model,
            fp,
            store,
            built: Window::new(wcfg.clone()),
            window: Window::new(wcfg),
            cfg,
            stats: SessionStats::default(),
            relevance: Relevance::default(),
            pinned_tokens: 0,
            last: None,
            repair_pending: 0,
            pending: Vec::new(),
            read_timings: ApplyTimings::default(),
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
    /// Tokens of earlier prompts' KV rows the session keeps per window layout, besides its
    /// window and store (at most [`crate::PROMPT_ROWS_TOKENS`]).
    pub fn prompt_rows_tokens(&self) -> usize {
        self.exec.encoder().prompt_rows_tokens()
    }

    /// Bytes of vision-tower outputs held now (at most [`SessionConfig::tower_cache_bytes`]).
    pub fn tower_bytes(&self) -> usize {
        self.exec.encoder().towers.bytes()
    }

    /// The backend's name (`cpu`, `cuda`).
    pub fn backend_name(&self) -> &'static str {
        self.exec.encoder().backend.name()
    }
    /// Background steps waiting for [`Session::settle`].
    pub fn queued(&self) -> &[kamera_sched::Step] {
        self.exec.queued()
    }
    /// Plans held until the model next reads the window ([`SessionConfig::lazy`]).
    pub fn pending(&self) -> &[Plan] {
        &self.pending
    }
    /// The work run at model reads ([`Session::context`]) since the last call: the held plans,
    /// or the rebuild that replaced them.
    pub fn take_read_timings(&mut self) -> ApplyTimings {
        std::mem::take(&mut self.read_timings)
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
        self.exec.encoder().content.get(id).map(|c| c.tokens.as_slice())
    }

    /// Keeps a chunk's tokens; a page chunk (`scored`) also joins relevance scoring.
    fn learn(&mut self, id: ChunkId, text: &str, tokens: Vec<u32>, scored: bool) {
        let content = &mut self.exec.encoder_mut().content;
        if scored && !content.contains_key(&id) {
            self.relevance.add(id, text);
        }
        content.insert(id, Content { tokens, image: None });
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

    /// Pins a chunk at the front of the window, after those pinned before it: the prefix (system
    /// turn, goal; it takes the BOS), then a plan. Pins come before any page. The window's
    /// budget grows by its tokens, so pages keep `window_tokens`.
    pub fn pin(&mut self, text: &str) -> Result<Applied> {
        self.settle()?;
        let tokens = self.tokenize(text, self.pinned_tokens == 0)?;
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

    /// Whether the window holds `text` as its only chunk, pinned (the prefix, before any page
    /// or plan): what a run checks before it pins a plan after it.
    pub fn holds_only_pinned(&self, text: &str) -> Result<bool> {
        let [slot] = self.window.slots() else {
            return Ok(false);
        };
        Ok(slot.pinned && self.chunk_tokens(&slot.chunk) == Some(self.tokenize(text, true)?.as_slice()))
    }

    /// A page observed: its chunk (`text`, the page's chunk text) is met by the window
    /// ([`Window::visit`]) and the plan is executed.
    pub fn observe(&mut self, text: &str) -> Result<Applied> {
        self.settle()?;
        let id = self.chunk_id(text);
        let tokens = match self.exec.encoder().content.get(&id) {
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
    /// goal, the question, remembered values, [`Session::recall_scores`]); evicted chunks above
    /// [`SessionConfig::min_relevance`] come back, evicting only less relevant ones.
    pub fn recall_relevant(&mut self, query: &str) -> Result<Applied> {
        let scores = self.recall_scores(query);
        for (id, s) in &scores {
            let s = if Some(*id) == self.last { f64::INFINITY } else { *s };
            self.window.set_relevance(id, s);
        }
        self.recall_scored(false)
    }

    /// What recall by relevance ranks `query`'s chunks by: their BM25 scores
    /// ([`crate::runtime::relevance::Relevance::scores`]), except that an evicted chunk naming
    /// none of the query's identifiers and scoring under [`SessionConfig::recall_share`] of the
    /// best score is held at [`SessionConfig::min_relevance`] at most, so it does not come back.
    pub(crate) fn recall_scores(&self, query: &str) -> std::collections::BTreeMap<ChunkId, f64> {
        let mut scores = self.relevance.scores(query);
        let named = self.relevance.naming(query);
        let share = self.cfg.recall_share * scores.values().copied().fold(0.0, f64::max);
        for (id, s) in scores.iter_mut() {
            if *s < share && !named.contains(id) && self.window.slot(id).is_none() {
                *s = s.min(self.cfg.min_relevance);
            }
        }
        scores
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
        self.bring_up_to_date()?;
        let enc = self.exec.encoder_mut();
        enc.cut_prompt()?;
        Ok(&mut enc.ctx)
    }

    /// The window's context for a model call, with the rows of the last call's prompt kept
    /// after it while the window has not changed ([`Live`]: the next prompt prefills only where
    /// it differs). The no-reuse baseline keeps nothing.
    pub fn live(&mut self) -> Result<Live<'_>> {
        if !self.cfg.reuse {
            return Ok(Live::from(self.context_no_reuse()?));
        }
        self.bring_up_to_date()?;
        Ok(self.exec.encoder_mut().live())
    }

    /// Runs the held plans, or syncs the live context with the window when none is held (it
    /// may lag after a settle's background steps).
    fn bring_up_to_date(&mut self) -> Result<()> {
        let t = if self.pending.is_empty() {
            ApplyTimings {
                sync_ms: self.exec.sync(self.window.end())?,
                ..ApplyTimings::default()
            }
        } else {
            self.materialize()?
        };
        self.read_timings.add(&t);
        Ok(())
    }

    /// The window's chunks in order.
    pub fn window_chunks(&self) -> Vec<ChunkId> {
        self.window.slots().iter().map(|s| s.chunk).collect()
    }

    /// The tokens of the window's chunks in order (what a full re-prefill would run).
    pub fn window_tokens(&self) -> Vec<u32> {
        self.window
            .slots()
            .iter()
            .filter_map(|s| self.exec.encoder().content.get(&s.chunk))
            .flat_map(|c| c.tokens.iter().copied())
            .collect()
    }

    /// Runs deferred work, keeps the canonical record of every resident chunk that has none (a
    /// later session then places them from the store with no forward pass), then makes every
    /// record written durable.
    pub fn flush(&mut self) -> Result<()> {
        self.settle()?;
        if !self.cfg.reuse {
            return Ok(self.store.flush()?);
        }
        self.materialize()?;
        let keep = self.window.keep_resident();
        self.execute(&[keep])?;
        Ok(self.store.flush()?)
    }

    /// Runs the background steps queued by earlier plans (canonical KV formed alone, difference
    /// patches) and the repair of survivors of evictions the window plans where the cost model
    /// says it pays ([`Window::repair`]), off the path to the first token and before the next
    /// plan. Their own time is counted in [`SessionStats::deferred_ms`].
    pub fn settle(&mut self) -> Result<ApplyTimings> {
        self.settle_until(&|| false)
    }

    /// [`Session::settle`], stopping early where `stop` says so and the steps left may wait for
    /// a later settle (patches formed from snapshots: [`kamera_sched::Executor::settle_until`];
    /// a placement that needs one forms it first). The agent loop stops it when the browser's
    /// next observation is in, or its [`SessionConfig::background_budget_ms`] is spent.
    pub fn settle_until(&mut self, stop: &dyn Fn() -> bool) -> Result<ApplyTimings> {
        if !self.cfg.reuse {
            return Ok(ApplyTimings::default()); // runtime/no_reuse.rs: nothing deferred, no KV kept
        }
        // A repair is planned over the KV the executor holds: not while plans are held.
        if self.cfg.repair && self.pending.is_empty() {
            let repair = self.window.repair();
            if !repair.is_empty() {
                self.repair_pending += repair.background_prefill_tokens(|id| self.tokens_of(id));
                for d in &repair.decisions {
                    tracing::debug!(decision = %d, "repair");
                }
                self.execute_deferred(&repair)?;
            }
        }
        let mut t = ApplyTimings::default();
        if !self.exec.queued().is_empty() {
            let t0 = std::time::Instant::now();
            let budget = self.cfg.background_budget_ms;
            t = self
                .exec
                .settle_until(&|| stop() || budget.is_some_and(|b| crate::ms(t0) > b))?;
            if self.pending.is_empty() {
                t.sync_ms += self.exec.sync(self.window.end())?;
            }
        }
        self.stats.repair_tokens += std::mem::take(&mut self.repair_pending);
        self.count_work();
        Ok(t)
    }

    pub(crate) fn tokens_of(&self, id: &ChunkId) -> usize {
        self.exec.encoder().content.get(id).map_or(0, |c| c.tokens.len())
    }

    /// Copies the executor's and the encoder's counters into the session's.
    fn count_work(&mut self) {
        let (x, e) = (&self.exec.stats, self.exec.encoder());
        self.stats.prefill_tokens = x.prefill_tokens as usize;
        self.stats.placed_tokens = x.placed_tokens as usize;
        self.stats.patches_formed = (x.patches_formed + x.orbit_patches_formed) as usize;
        self.stats.patches_applied = x.patches_applied as usize;
        self.stats.bytes_moved = x.bytes_moved + e.bytes_moved;
        self.stats.images_encoded = e.images_encoded;
        self.stats.prefill_calls = e.prefill_calls;
        self.stats.deferred_ms = x.background_ms;
        self.stats.deferred_prefill_ms = x.background.prefill_ms;
        self.stats.deferred_patch_ms = x.background.patch_ms;
    }

    pub(crate) fn apply(&mut self, chunk: Option<ChunkId>, visit: Option<Visit>, plan: Plan) -> Result<Applied> {
        if !self.cfg.reuse {
            return self.apply_no_reuse(chunk, visit, plan);
        }
        let prefill_tokens = plan.prefill_tokens(|id| self.tokens_of(id));
        self.stats.evictions += plan.count("evict");
        for d in &plan.decisions {
            tracing::debug!(decision = %d, "plan");
        }
        let timings = if self.cfg.lazy {
            self.pending.push(plan.clone());
            ApplyTimings::default()
        } else {
            self.execute(std::slice::from_ref(&plan))?
        };
        Ok(Applied {
            chunk,
            visit,
            plan,
            prefill_tokens,
            timings,
        })
    }
}

impl Session {
    /// Brings the executor's KV to the window's layout: the held plans, or the window built
    /// afresh where that costs less before the first token ([`Window::materialize`]).
    fn materialize(&mut self) -> Result<ApplyTimings> {
        if self.pending.is_empty() {
            return Ok(ApplyTimings::default());
        }
        let pending = std::mem::take(&mut self.pending);
        let store = self.store.clone();
        let allow_rebuild = self.exec.queue_may_wait();
        let content = &self.exec.encoder().content;
        let m = self.window.materialize(
            &self.built,
            pending,
            allow_rebuild,
            &|id| content.get(id).map_or(0, |c| c.tokens.len()),
            &|k| Self::stored(store.as_ref(), k),
        );
        if m.rebuilt {
            self.stats.rebuilds += 1;
            for d in m.plans.iter().flat_map(|p| &p.decisions) {
                tracing::debug!(decision = %d, "materialize");
            }
        }
        self.execute(&m.plans)
    }

    /// Runs `plans` now, in order (their background steps queued, or run too without
    /// [`SessionConfig::defer`]), and syncs the live context; the executor then holds the window.
    fn execute(&mut self, plans: &[Plan]) -> Result<ApplyTimings> {
        let mut t = ApplyTimings::default();
        let mut run = || -> kamera_sched::Result<()> {
            if self.cfg.defer {
                t.add(&self.exec.run_all(plans)?);
            } else {
                for plan in plans {
                    t.add(&self.exec.run_now(plan)?);
                }
            }
            t.sync_ms += self.exec.sync(self.window.end())?;
            Ok(())
        };
        let ran = run();
        self.built = self.window.clone();
        self.stats.relocations += plans.iter().map(|p| p.count("relocate")).sum::<usize>();
        self.count_work();
        ran?;
        Ok(t)
    }

    /// Runs a plan of background work only (a repair), queued for this settle.
    fn execute_deferred(&mut self, plan: &Plan) -> Result<()> {
        self.exec.run(plan)?;
        self.built = self.window.clone();
        Ok(())
    }
}

/// The bytes a prefix chunk id hashes: its tokens, little-endian.
fn tokens_bytes(tokens: &[u32]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}
