//! Plans: every decision of the scheduler is an explicit list of steps that the executor
//! ([`crate::Executor`], the only one) runs in order, the steps that may run later off the path
//! to the first token, and the cost model's explanation of each choice.

use std::fmt;

use kamera_store::{ChunkId, Key};
use serde::{Deserialize, Serialize};

use crate::cost::Decision;
use crate::error::short;

/// One step for the runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Encode + prefill `chunk`'s tokens. `alone`: at position 0 with no context, giving the
    /// canonical KV(B|∅) (staged for `StoreCanonical` / `Place`); otherwise at `at`, after the
    /// window's KV of positions `0..at`, and the result is the chunk's KV in the window (exact).
    Prefill { chunk: ChunkId, at: i64, alone: bool },
    /// Write the staged canonical KV of `chunk` to the store.
    StoreCanonical { chunk: ChunkId },
    /// Load `chunk`'s canonical KV from the store (memory tier, else disk) into staging.
    Recall { chunk: ChunkId },
    /// Form the patch `key` of `chunk` conditioned on the window's KV of positions `0..at` (one
    /// conditioned prefill of the chunk at `at`, then a truncated SVD), and store it.
    FormPatch { chunk: ChunkId, key: Key, at: i64 },
    /// Form the patch `key` of `chunk`, just prefilled in place, from the difference of its
    /// in-place KV and its staged canonical KV (a truncated SVD; no forward pass), and store it:
    /// a later recall after the same earlier context is then a relocation + this patch.
    StorePatch { chunk: ChunkId, key: Key },
    /// Form the orbit patches `keys` of the chunks of `set` from prefills of the set under each
    /// of `orderings`, all placed at `at` after the window's KV of positions `0..at`: a key
    /// without a slot averages the chunk's deficit over every ordering, a key with a slot over
    /// the orderings that put the chunk at that slot of the set.
    FormOrbit {
        set: Vec<ChunkId>,
        keys: Vec<OrbitKey>,
        orderings: Vec<Vec<ChunkId>>,
        at: i64,
    },
    /// Put the staged canonical KV of `chunk` into the window at `at`: relocate by `at` (exact
    /// RoPE re-rotation) and add `patch` if any, in one pass.
    Place {
        chunk: ChunkId,
        at: i64,
        patch: Option<Key>,
    },
    /// Re-rotate a resident chunk's KV by `delta` positions (exact; no patch).
    Relocate { chunk: ChunkId, delta: i64 },
    /// Store the resident KV of `chunk`, relocated to position 0, as its canonical record where
    /// the store has none (no forward pass): the KV it was met with, conditioned on what preceded
    /// it then. A later recall relocates it (and patches it, where a patch is kept). `exact`: the
    /// patch key of the context this KV is exact in, stored with a rank-0 patch when the record
    /// is written, so a later session placing it after that context knows relocation is exact.
    KeepCanonical {
        chunk: ChunkId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exact: Option<Key>,
    },
    /// Drop `chunk`'s KV from the window; its canonical KV stays in the store.
    EvictToStore { chunk: ChunkId },
    /// Drop the live tail's KV (`tokens` of them): what it attended to has changed.
    DropTail { tokens: usize },
}

/// One orbit patch to form: `chunk`'s, stored under `key`, for every ordering of its set
/// (`slot` None) or for the orderings that put it at `slot` (0-based within the set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrbitKey {
    pub chunk: ChunkId,
    pub slot: Option<usize>,
    pub key: Key,
}

impl OrbitKey {
    /// Whether `ordering` is one this patch averages over.
    pub fn covers(&self, ordering: &[ChunkId]) -> bool {
        self.slot
            .is_none_or(|s| ordering.iter().position(|c| *c == self.chunk) == Some(s))
    }

    /// Of `conds` (this chunk's KV under `orderings[i]`, one per ordering), the ones this
    /// patch averages over: what an executor hands to `kamera_ops::orbit_patch`.
    pub fn covered<T: Clone>(&self, conds: &[T], orderings: &[Vec<ChunkId>]) -> Vec<T> {
        conds
            .iter()
            .zip(orderings)
            .filter(|(_, o)| self.covers(o))
            .map(|(kv, _)| kv.clone())
            .collect()
    }
}

/// What the runner must do for one operation, and why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Run now, in order, before the model reads the window.
    pub steps: Vec<Step>,
    /// Run later, in order, off the path to the first token (the executor queues them until
    /// [`crate::Executor::settle`]): canonical KV formed alone, difference patches, repairs.
    pub background: Vec<Step>,
    pub decisions: Vec<Decision>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.background.is_empty()
    }
    /// Estimated cost of the chosen options, µs.
    pub fn cost_us(&self) -> f64 {
        self.decisions.iter().map(|d| d.chosen_cost()).sum()
    }
    pub(crate) fn push(&mut self, s: Step) {
        self.steps.push(s);
    }
    pub(crate) fn later(&mut self, s: Step) {
        self.background.push(s);
    }
    /// Appends `other`'s steps, background steps and decisions (they run after this plan's).
    pub fn append(&mut self, other: Plan) {
        self.steps.extend(other.steps);
        self.background.extend(other.background);
        self.decisions.extend(other.decisions);
    }
    /// Tokens prefilled by this plan's forward passes before the first token (`tokens` of each
    /// chunk by id), the passes that form orbit patches included.
    pub fn prefill_tokens(&self, tokens: impl Fn(&ChunkId) -> usize) -> usize {
        self.steps.iter().map(|s| s.prefill_tokens(&tokens)).sum()
    }
    /// Tokens prefilled by the background steps.
    pub fn background_prefill_tokens(&self, tokens: impl Fn(&ChunkId) -> usize) -> usize {
        self.background.iter().map(|s| s.prefill_tokens(&tokens)).sum()
    }
    /// Number of steps (now and later) of each name, for tests and logs.
    pub fn count(&self, name: &str) -> usize {
        self.steps
            .iter()
            .chain(&self.background)
            .filter(|s| s.name() == name)
            .count()
    }
}

impl Step {
    /// Tokens this step runs through a forward pass (`tokens` of each chunk by id).
    pub fn prefill_tokens(&self, tokens: &impl Fn(&ChunkId) -> usize) -> usize {
        match self {
            Step::Prefill { chunk, .. } | Step::FormPatch { chunk, .. } => tokens(chunk),
            Step::FormOrbit { orderings, .. } => orderings.iter().flatten().map(tokens).sum(),
            _ => 0,
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            Step::Prefill { .. } => "prefill",
            Step::StoreCanonical { .. } => "store",
            Step::Recall { .. } => "recall",
            Step::FormPatch { .. } => "form-patch",
            Step::StorePatch { .. } => "store-patch",
            Step::FormOrbit { .. } => "form-orbit",
            Step::Place { .. } => "place",
            Step::Relocate { .. } => "relocate",
            Step::KeepCanonical { .. } => "keep",
            Step::EvictToStore { .. } => "evict",
            Step::DropTail { .. } => "drop-tail",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Prefill { chunk, at, alone: true } => write!(
                f,
                "prefill {} alone at 0 (canonical; placed later at {at})",
                short(chunk)
            ),
            Step::Prefill { chunk, at, .. } => write!(f, "prefill {} at {at} after the window", short(chunk)),
            Step::StoreCanonical { chunk } => write!(f, "store canonical KV of {}", short(chunk)),
            Step::Recall { chunk } => write!(f, "recall canonical KV of {} from the store", short(chunk)),
            Step::FormPatch { chunk, key, at } => write!(f, "form patch {key} for {} at {at}", short(chunk)),
            Step::StorePatch { chunk, key } => {
                write!(f, "store patch {key} of {} (in-place minus canonical KV)", short(chunk))
            }
            Step::FormOrbit {
                set, keys, orderings, ..
            } => {
                let slots = if keys.iter().any(|k| k.slot.is_some()) {
                    " slot-conditioned"
                } else {
                    ""
                };
                write!(
                    f,
                    "form {}{slots} orbit patches for a set of {} chunks over {} orderings",
                    keys.len(),
                    set.len(),
                    orderings.len()
                )
            }
            Step::Place { chunk, at, patch } => match patch {
                Some(p) => write!(f, "place {} at {at} with patch {p}", short(chunk)),
                None => write!(f, "place {} at {at} (relocation only)", short(chunk)),
            },
            Step::Relocate { chunk, delta } => write!(f, "relocate {} by {delta}", short(chunk)),
            Step::KeepCanonical { chunk, .. } => {
                write!(f, "keep the KV of {} as met, at position 0, in the store", short(chunk))
            }
            Step::EvictToStore { chunk } => write!(f, "evict {} to the store", short(chunk)),
            Step::DropTail { tokens } => write!(f, "drop the {tokens}-token tail"),
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.steps {
            writeln!(f, "  {s}")?;
        }
        for s in &self.background {
            writeln!(f, "  later: {s}")?;
        }
        for d in &self.decisions {
            writeln!(f, "  why: {d}")?;
        }
        Ok(())
    }
}
