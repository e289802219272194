//! The context window: pinned chunks (system prompt), then placed chunks, then the live tail,
//! contiguous from position 0 and never over the token budget. Every operation returns the
//! [`Plan`] that brings a runner's KV from the old layout to the new one; the window itself is
//! synchronous, deterministic and holds no tensors.

use std::collections::{BTreeMap, BTreeSet};

use kamera_store::{ChunkId, Key, ModelFp};

use crate::cost::{CanonicalSource, Choice, CostModel, Decision};
use crate::error::{Error, Result};
use crate::plan::{Plan, Step};

mod rebuild;
pub use rebuild::Materialized;
mod reorder;
mod visit;
mod work;

/// How chunks are ranked, for placement on reorder (lowest first, so the highest sits nearest
/// the tail) and for eviction (lowest goes first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// By first arrival.
    #[default]
    Arrival,
    /// By last use ([`Window::touch`], insert, recall).
    Recency,
    /// By the caller's relevance score ([`Window::set_relevance`]).
    Relevance,
}

/// What meeting a chunk did to the window ([`Window::visit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Visit {
    /// Resident already: its KV stays where it is.
    Hit,
    /// Never seen: prefilled.
    New,
    /// Evicted earlier in this window: rehydrated from the store.
    Recall,
    /// Never in this window, but its canonical KV is in the store (an earlier session's).
    Stored,
}

/// Window settings.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowConfig {
    /// Most tokens the window holds (pinned + placed + tail).
    pub budget_tokens: usize,
    /// The model whose KV the keys address.
    pub model: ModelFp,
    pub cost: CostModel,
    /// Which placed chunk goes first when room is needed.
    pub evict: Order,
}

impl WindowConfig {
    pub fn new(budget_tokens: usize, model: ModelFp) -> WindowConfig {
        WindowConfig {
            budget_tokens,
            model,
            cost: CostModel::default(),
            evict: Order::Arrival,
        }
    }
}

/// How a resident chunk's KV was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Prefilled in place after exactly what precedes it.
    Exact,
    /// Canonical KV relocated, nothing before it (exact).
    Relocated,
    /// Canonical KV relocated with a conditioning or orbit patch.
    Patched(Key),
}

/// One resident chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub chunk: ChunkId,
    /// Tokens (rows of KV) the chunk holds: what the budget counts.
    pub n_tokens: usize,
    /// Positions the chunk occupies: `n_tokens` for text; an image under M-RoPE spans fewer
    /// (Qwen2.5-VL: its largest merged-grid side), see [`Window::declare_span`].
    pub span: i64,
    /// Position of the first token.
    pub start: i64,
    pub pinned: bool,
    pub state: SlotState,
    /// Whether an earlier chunk was evicted since it was made (survivors are re-rotated only).
    pub shifted: bool,
    pub arrival: u64,
    pub last_used: u64,
    pub relevance: f64,
}

impl Slot {
    pub fn end(&self) -> i64 {
        self.start + self.span
    }
}

#[derive(Debug, Clone, Copy)]
struct Known {
    n_tokens: usize,
    arrival: u64,
    relevance: f64,
}

/// The scheduler's window.
#[derive(Debug, Clone)]
pub struct Window {
    cfg: WindowConfig,
    slots: Vec<Slot>,
    tail: usize,
    known: BTreeMap<ChunkId, Known>,
    /// Position spans declared for chunks that do not occupy one position per token.
    spans: BTreeMap<ChunkId, i64>,
    patches: BTreeSet<Key>,
    /// Chunks whose canonical record is in the store or planned (kept, formed alone, found).
    canonical: BTreeSet<ChunkId>,
    /// Patches this window formed, and placements that reused a stored patch: the session's
    /// own evidence of how often a formed patch is used again.
    formed: u64,
    reused: u64,
    clock: u64,
}

/// A `stored` answer for callers without a store: nothing is there.
fn nothing_stored(_: &Key) -> bool {
    false
}

impl Window {
    pub fn new(cfg: WindowConfig) -> Window {
        Window {
            cfg,
            slots: Vec::new(),
            tail: 0,
            known: BTreeMap::new(),
            spans: BTreeMap::new(),
            patches: BTreeSet::new(),
            canonical: BTreeSet::new(),
            formed: 0,
            reused: 0,
            clock: 0,
        }
    }

    pub fn config(&self) -> &WindowConfig {
        &self.cfg
    }
    pub fn cost_model_mut(&mut self) -> &mut CostModel {
        &mut self.cfg.cost
    }
    /// Resident chunks in position order (pinned first).
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }
    pub fn tail(&self) -> usize {
        self.tail
    }
    /// Tokens held: chunks + tail.
    pub fn used(&self) -> usize {
        self.chunk_tokens() + self.tail
    }
    /// Tokens held by resident chunks.
    pub fn chunk_tokens(&self) -> usize {
        self.slots.iter().map(|s| s.n_tokens).sum()
    }
    fn pinned_tokens(&self) -> usize {
        self.slots.iter().filter(|s| s.pinned).map(|s| s.n_tokens).sum()
    }
    /// Position one past the last chunk (where the tail starts).
    pub fn end(&self) -> i64 {
        self.slots.last().map_or(0, Slot::end)
    }
    pub fn slot(&self, id: &ChunkId) -> Option<&Slot> {
        self.slots.iter().find(|s| s.chunk == *id)
    }
    /// Whether `id` has been inserted (its canonical KV is in the store) and is not resident.
    pub fn is_evicted(&self, id: &ChunkId) -> bool {
        self.known.contains_key(id) && self.slot(id).is_none()
    }
    /// Known chunks that are not resident, in id order.
    pub fn evicted(&self) -> Vec<ChunkId> {
        self.known
            .keys()
            .filter(|id| self.slot(id).is_none())
            .copied()
            .collect()
    }
    /// Changes the token budget (e.g. to make room for a pinned prefix); refused, changing
    /// nothing, when the window already holds more.
    pub fn set_budget(&mut self, budget_tokens: usize) -> Result<()> {
        if self.used() > budget_tokens {
            return Err(Error::OverBudget {
                op: "set_budget",
                need: self.used(),
                budget: budget_tokens,
                fixed: self.pinned_tokens(),
            });
        }
        self.cfg.budget_tokens = budget_tokens;
        Ok(())
    }

    /// The patch key of resident `id` for its place now: after exactly the chunks before it, at
    /// their positions (what a recall, a kept difference patch or a repair stores it under).
    pub fn patch_key(&self, id: &ChunkId) -> Option<Key> {
        let i = self.slots.iter().position(|s| s.chunk == *id)?;
        Some(self.key_after(*id, i, self.slots[i].start))
    }

    /// The patch key of `id` placed at `at` after the first `n` slots.
    fn key_after(&self, id: ChunkId, n: usize, at: i64) -> Key {
        let ants: Vec<(ChunkId, i64)> = self.slots[..n].iter().map(|s| (s.chunk, s.start)).collect();
        Key::patch(self.cfg.model, id, &ants, at)
    }

    /// Tells the window that a patch is in the store (e.g. formed in an earlier session).
    pub fn assume_cached(&mut self, key: Key) {
        self.patches.insert(key);
    }
    pub fn is_cached(&self, key: &Key) -> bool {
        self.patches.contains(key)
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Marks `id` as used now (for [`Order::Recency`]).
    pub fn touch(&mut self, id: &ChunkId) {
        let now = self.tick();
        if let Some(s) = self.slots.iter_mut().find(|s| s.chunk == *id) {
            s.last_used = now;
        }
    }

    /// Sets the caller's relevance score of `id` (for [`Order::Relevance`]).
    pub fn set_relevance(&mut self, id: &ChunkId, score: f64) {
        if let Some(k) = self.known.get_mut(id) {
            k.relevance = score;
        }
        if let Some(s) = self.slots.iter_mut().find(|s| s.chunk == *id) {
            s.relevance = score;
        }
    }

    /// The span declared for `id` ([`Window::declare_span`]), resident or not.
    pub fn declared_span(&self, id: &ChunkId) -> Option<i64> {
        self.spans.get(id).copied()
    }

    /// Declares that `id` occupies `span` positions (fewer than its tokens: an image under
    /// M-RoPE, whose following text resumes at its largest position + 1). Declare before the
    /// chunk first enters the window; the span is part of what the chunk is and cannot change.
    pub fn declare_span(&mut self, id: ChunkId, span: i64) -> Result<()> {
        const OP: &str = "declare_span";
        if span <= 0 {
            return Err(Error::chunk(OP, &id, format!("span {span} must be positive")));
        }
        match self.spans.get(&id) {
            Some(&s) if s != span => Err(Error::chunk(OP, &id, format!("was declared with span {s}, not {span}"))),
            _ if self.known.contains_key(&id) && !self.spans.contains_key(&id) => {
                Err(Error::chunk(OP, &id, "entered the window before its span was declared"))
            }
            _ => {
                self.spans.insert(id, span);
                Ok(())
            }
        }
    }

    /// Sets the live tail's length (tokens after the last chunk: the question, generated text).
    pub fn set_tail(&mut self, tokens: usize) -> Result<()> {
        let room = self.cfg.budget_tokens - self.chunk_tokens();
        if tokens > room {
            return Err(Error::OverBudget {
                op: "set_tail",
                need: tokens,
                budget: self.cfg.budget_tokens,
                fixed: self.chunk_tokens(),
            });
        }
        self.tail = tokens;
        Ok(())
    }

    fn drop_tail(&mut self, plan: &mut Plan) {
        if self.tail > 0 {
            plan.push(Step::DropTail { tokens: self.tail });
            self.tail = 0;
        }
    }

    fn new_slot(&mut self, chunk: ChunkId, n_tokens: usize, pinned: bool, state: SlotState) {
        let now = self.tick();
        let k = *self.known.entry(chunk).or_insert(Known {
            n_tokens,
            arrival: now,
            relevance: 0.0,
        });
        let start = self.end();
        let span = self.spans.get(&chunk).copied().unwrap_or(n_tokens as i64);
        self.slots.push(Slot {
            chunk,
            n_tokens,
            span,
            start,
            pinned,
            state,
            shifted: false,
            arrival: k.arrival,
            last_used: now,
            relevance: k.relevance,
        });
    }

    /// Steps that encode a new chunk in place at `at` (exact) and, with
    /// [`CanonicalSource::Alone`], form and store its canonical KV in the background. With
    /// [`CanonicalSource::Kept`] its KV is kept when it leaves ([`Step::KeepCanonical`]).
    fn encode_steps(&mut self, plan: &mut Plan, chunk: ChunkId, at: i64) -> SlotState {
        plan.push(Step::Prefill {
            chunk,
            at,
            alone: false,
        });
        // At 0 the in-place KV is the canonical KV: it is kept like any other.
        if self.cfg.cost.canonical == CanonicalSource::Alone && at > 0 {
            plan.later(Step::Prefill { chunk, at, alone: true });
            plan.later(Step::StoreCanonical { chunk });
            self.canonical.insert(chunk);
        }
        SlotState::Exact
    }

    fn check_new(&self, op: &'static str, id: &ChunkId, n: usize) -> Result<()> {
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

    /// Evicts `victims` (placed chunks), keeping the KV of those without a canonical record, and
    /// moves the survivors after them: placed from canonical KV + a stored patch for their new
    /// context where `stored` (or this window) knows one, else re-rotated only (exact as
    /// rotation; what the cost model's survivors decision prices).
    fn evict_many(&mut self, victims: &BTreeSet<ChunkId>, plan: &mut Plan, stored: &dyn Fn(&Key) -> bool) {
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
            plan.decisions.push(self.cfg.cost.survivors(blind, from as usize));
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

    fn check_fits(&self, op: &'static str, need: usize) -> Result<()> {
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

    /// Drops the tail and evicts by the configured order until `need` tokens fit.
    fn make_room(&mut self, op: &'static str, need: usize, stored: &dyn Fn(&Key) -> bool) -> Result<Plan> {
        self.check_fits(op, need)?;
        let mut plan = Plan::default();
        self.drop_tail(&mut plan);
        let mut victims = BTreeSet::new();
        let mut used = self.chunk_tokens();
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
        let at = self.end();
        let key = self.key_after(id, self.slots.len(), at);
        let cached = self.patches.contains(&key) || stored(&key);
        if cached {
            self.patches.insert(key);
        }
        let d = if self.canonical.contains(&id) || stored(&Key::canonical(self.cfg.model, id)) {
            self.cfg.cost.recall(id, n, at as usize, cached, self.expected_reuses())
        } else {
            // Its KV was never kept: it left the window before the model read it (a rebuild
            // dropped the plans that would have kept it, [`Window::rebuild`]).
            Decision {
                op: "recall",
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

/// The rank of a slot under an order.
fn rank(s: &Slot, order: Order) -> f64 {
    match order {
        Order::Arrival => s.arrival as f64,
        Order::Recency => s.last_used as f64,
        Order::Relevance => s.relevance,
    }
}

/// Deterministic orderings of a set for orbit formation ([`kamera_ops::orbit_orderings`] of the
/// id-sorted set: every permutation when at most `k`, else its rotations and sampled ones), so
/// the orbit patches depend on the set alone.
pub fn orbit_orderings(set: &[ChunkId], k: usize) -> Vec<Vec<ChunkId>> {
    let mut sorted = set.to_vec();
    sorted.sort();
    kamera_ops::orbit_orderings(sorted.len(), k, 0)
        .into_iter()
        .map(|o| o.into_iter().map(|i| sorted[i]).collect())
        .collect()
}
