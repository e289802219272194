//! What a task's run produces: per method its scores and costs ([`TaskMethod`]), the task's
//! diagnostics, and the helpers that fill a method's row from its cost and scores.

use std::collections::BTreeMap;

use kamera_eval::{Scores, gap_recovered};
use serde::{Deserialize, Serialize};

/// One method on one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskMethod {
    pub kl: f64,
    pub top1: f64,
    pub exact_match: bool,
    pub answer_logprob: f64,
    pub gap_recovered: f64,
    /// Bytes stored for the task's chunks / their canonical KV bytes, as kamera-store encodes
    /// them (canonical KV records in bf16, patch records in their own factor type).
    pub bytes_ratio: f64,
    /// The largest patch record / that chunk's canonical record, over the chunks whose patch
    /// keeps a direction (the bytes a patch adds per patched chunk; 0 without patches).
    #[serde(default)]
    pub chunk_bytes_max: f64,
    /// Blind KL on the orderings this method was evaluated on (the task's; every ordering of
    /// the orbit for orbit methods): its gap is measured against this.
    #[serde(default)]
    pub blind_kl: f64,
    /// Orderings of the chunks this method was evaluated on.
    #[serde(default)]
    pub orderings: usize,
    /// Time to produce the chunks' KV for this reuse (relocate + patch, or recompute).
    pub assemble_ms: f64,
    /// One-time cost of forming the patches (conditioned forward(s) + SVD).
    pub patch_ms: f64,
    /// Share of the chunks' tokens recomputed (token-recompute methods).
    pub recompute_share: f64,
}

/// Diagnostics of one task: per layer (K top 8/16/32, V top 8/16/32 energy share, K and V
/// deficit energy relative to the canonical KV), averaged over the chunks that have antecedents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TaskDiagnostics {
    pub layers: Vec<[f64; 8]>,
    /// (share, KL) of the oracle token curve.
    pub oracle_curve: Vec<(f64, f64)>,
    /// Per layer, why the orbit mean fails (see [`crate::OrbitLayer`]; empty without orbits).
    #[serde(default)]
    pub orbit_layers: Vec<[f64; 10]>,
}

/// All methods on one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    pub id: String,
    pub chunk_tokens: Vec<usize>,
    pub question_tokens: usize,
    pub answer_tokens: usize,
    /// Prefill time of all chunks after the system prefix (what a re-prefill costs each reuse).
    pub full_ms: f64,
    pub blind_kl: f64,
    pub methods: BTreeMap<String, TaskMethod>,
    pub diagnostics: TaskDiagnostics,
}

pub(crate) fn method_cost(bytes_ratio: f64, assemble_ms: f64, patch_ms: f64, recompute_share: f64) -> TaskMethod {
    TaskMethod {
        kl: 0.0,
        top1: 0.0,
        exact_match: false,
        answer_logprob: 0.0,
        gap_recovered: 0.0,
        bytes_ratio,
        chunk_bytes_max: 0.0,
        blind_kl: 0.0,
        orderings: 0,
        assemble_ms,
        patch_ms,
        recompute_share,
    }
}

/// The scores of a method (means over `orderings` orderings) against a blind KL on the same ones.
pub(crate) fn finish(s: Scores, blind_kl: f64, orderings: usize, cost: TaskMethod) -> TaskMethod {
    TaskMethod {
        kl: s.kl,
        top1: s.top1,
        exact_match: s.exact_match,
        answer_logprob: s.answer_logprob,
        gap_recovered: gap_recovered(s.kl, blind_kl),
        blind_kl,
        orderings,
        ..cost
    }
}
