//! The context window: pinned chunks (system prompt), then placed chunks, then the live tail,
//! contiguous from position 0 and never over the token budget. Every operation returns the
//! [`Plan`] that brings a runner's KV from the old layout to the new one; the window itself is
//! synchronous, deterministic and holds no tensors.

use std::collections::{BTreeMap, BTreeSet};

use kamera_store::{ChunkId, Key, ModelFp};

use crate::cost::{CanonicalSource, CostModel};
use crate::error::{Error, Result};
use crate::plan::{Plan, Step};

mod place;
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
    /// Repair survivors of evictions where the cost model says blind ones cost more KL than its
    /// budget (an insert or a recall before it places its chunk, [`Window::repair`] in the
    /// background); off: survivors stay re-rotated blind.
    pub repair: bool,
}

impl WindowConfig {
    pub fn new(budget_tokens: usize, model: ModelFp) -> WindowConfig {
        WindowConfig {
            budget_tokens,
            model,
            cost: CostModel::default(),
            evict: Order::Arrival,
            repair: true,
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
    /// Recall placements by their patch key (the chunk, what precedes it, where): how often each
    /// context has occurred in this window, the evidence that it recurs.
    contexts: BTreeMap<Key, u32>,
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
            contexts: BTreeMap::new(),
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
    /// The budget left to placed (unpinned) chunks: the window the blind KLs scale with.
    fn unpinned_budget(&self) -> usize {
        self.cfg.budget_tokens.saturating_sub(self.pinned_tokens())
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
