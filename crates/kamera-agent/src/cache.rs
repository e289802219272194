//! The chunk cache seam and the context window (a small stand-in scheduler until kamera-store and
//! kamera-sched are plugged in): canonical KV by content id, and an explicit plan per step.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kamera_ops::ChunkKv;
use serde::{Deserialize, Serialize};

/// Content id of a chunk: blake3 over the model fingerprint, the chunk text and the screenshot's sha256.
pub fn chunk_id(fingerprint: &str, text: &str, screenshot_sha256: &str) -> String {
    let mut h = blake3::Hasher::new();
    for part in [fingerprint, text, screenshot_sha256] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// Canonical KV (prefilled alone at position 0) by chunk id.
pub trait ChunkCache: Send {
    fn get(&self, id: &str) -> Option<Arc<ChunkKv>>;
    /// Stores canonical KV that took `cost_us` microseconds to prefill.
    fn put(&mut self, id: &str, kv: Arc<ChunkKv>, cost_us: u64);
    fn len(&self) -> usize;
    /// Makes what was put durable (a no-op in memory).
    fn flush(&mut self) {}
    /// The conditioning patch of `chunk` after exactly `antecedents` (chunk ids, in order), if kept.
    fn get_patch(&self, _chunk: &str, _antecedents: &[String]) -> Option<Arc<kamera_ops::Patch>> {
        None
    }
    /// Keeps a patch formed in `cost_us` microseconds (a no-op where patches are not kept).
    fn put_patch(&mut self, _chunk: &str, _antecedents: &[String], _patch: Arc<kamera_ops::Patch>, _cost_us: u64) {}
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An in-process [`ChunkCache`].
#[derive(Default)]
pub struct MemoryCache {
    map: HashMap<String, Arc<ChunkKv>>,
}

impl ChunkCache for MemoryCache {
    fn get(&self, id: &str) -> Option<Arc<ChunkKv>> {
        self.map.get(id).cloned()
    }
    fn put(&mut self, id: &str, kv: Arc<ChunkKv>, _cost_us: u64) {
        self.map.insert(id.to_string(), kv);
    }
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// What happened to one chunk in a step's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Already in the window at the same position: used as is.
    Hit,
    /// In the window or the cache, placed at a new position: exact RoPE re-rotation, no prefill.
    Relocate,
    /// Evicted earlier, brought back from the canonical store (relocated, no prefill).
    Recall,
    /// Never seen: prefilled once to canonical KV.
    Miss,
    /// Dropped from the window to fit the token budget (still in the store).
    Evict,
}

/// One entry of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanOp {
    pub chunk: String,
    pub op: Op,
    pub tokens: usize,
    /// Position of the chunk's first token in the context (after the prefix), `None` when evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<i64>,
    /// Whether the chunk was placed with its conditioning patch (`relocate + patch`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub patch: bool,
}

/// The window: page chunks after a fixed prefix, most recently seen last, within a token budget.
#[derive(Debug, Clone)]
pub struct Window {
    budget: usize,
    prefix_tokens: usize,
    /// (chunk id, tokens, position last placed at)
    entries: Vec<(String, usize, i64)>,
    evicted: HashSet<String>,
}

impl Window {
    /// A window of `budget` page tokens after a prefix of `prefix_tokens`.
    pub fn new(budget: usize, prefix_tokens: usize) -> Window {
        Window {
            budget,
            prefix_tokens,
            entries: Vec::new(),
            evicted: HashSet::new(),
        }
    }

    /// Chunk ids in context order.
    pub fn chunks(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.0.clone()).collect()
    }

    /// Places the chunk just observed (`cached`: whether the store already has it) at the end,
    /// evicts the oldest chunks beyond the budget and lays the rest out again. Returns the plan.
    pub fn observe(&mut self, id: &str, tokens: usize, cached: bool) -> Vec<PlanOp> {
        let mut plan = Vec::new();
        let was_in_window = self.entries.iter().position(|e| e.0 == id);
        let new_op = match was_in_window {
            Some(i) => {
                self.entries.remove(i);
                Op::Relocate
            }
            None if self.evicted.remove(id) => Op::Recall,
            None if cached => Op::Relocate,
            None => Op::Miss,
        };
        self.entries.push((id.to_string(), tokens, i64::MIN));
        while self.entries.iter().map(|e| e.1).sum::<usize>() > self.budget && self.entries.len() > 1 {
            let (cid, t, _) = self.entries.remove(0);
            self.evicted.insert(cid.clone());
            plan.push(PlanOp {
                chunk: cid,
                op: Op::Evict,
                tokens: t,
                at: None,
                patch: false,
            });
        }
        let mut pos = self.prefix_tokens as i64;
        let last = self.entries.len() - 1;
        for (i, (cid, t, at)) in self.entries.iter_mut().enumerate() {
            let op = if i == last {
                new_op
            } else if *at == pos {
                Op::Hit
            } else {
                Op::Relocate
            };
            *at = pos;
            plan.push(PlanOp {
                chunk: cid.clone(),
                op,
                tokens: *t,
                at: Some(pos),
                patch: false,
            });
            pos += *t as i64;
        }
        plan
    }

    /// Position one past the last page token.
    pub fn end(&self) -> i64 {
        self.prefix_tokens as i64 + self.entries.iter().map(|e| e.1).sum::<usize>() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_hit_relocate_evict_recall() {
        let mut w = Window::new(100, 10);
        let p = w.observe("a", 40, false);
        assert_eq!(p[0].op, Op::Miss);
        let p = w.observe("b", 40, false);
        assert_eq!((p[0].op, p[1].op), (Op::Hit, Op::Miss));
        // a recurs: moves to the end, b shifts down.
        let p = w.observe("a", 40, true);
        assert_eq!((p[0].chunk.as_str(), p[0].op), ("b", Op::Relocate));
        assert_eq!((p[1].chunk.as_str(), p[1].op, p[1].at), ("a", Op::Relocate, Some(50)));
        // c pushes b out.
        let p = w.observe("c", 40, false);
        assert_eq!((p[0].chunk.as_str(), p[0].op), ("b", Op::Evict));
        // b comes back from the store.
        let p = w.observe("b", 40, true);
        assert!(p.iter().any(|o| o.chunk == "b" && o.op == Op::Recall));
        assert_eq!(w.end(), 90);
    }
}
