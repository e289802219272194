//! The harness settings every experiment takes: orbit sampling, CacheBlend's check layer, the
//! diagnostics, the system prefix, and the per-model tables (layer sensitivities, query
//! calibration, deficit basis) that method modifiers read.

use std::sync::Arc;

use kamera_eval::{BasisHeader, DeficitBasis};
use serde::{Deserialize, Serialize};

/// Harness settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalConfig {
    /// The most orderings of a task's chunk set an orbit is formed from: the task's own ordering
    /// first, then every other one when the set has at most this many orderings (all of them
    /// for up to 4 chunks at the default 24), else this many sampled distinct orderings.
    pub orbit_orderings: usize,
    /// CacheBlend's check layer (layers `0..=check_layer` are recomputed for every token).
    pub check_layer: usize,
    /// Token shares of the oracle token curve (empty: no curve).
    pub oracle_curve: Vec<f64>,
    /// Deficit spectrum diagnostics (one SVD per chunk, layer, K/V).
    pub diagnostics: bool,
    /// Seed of the orbit orderings.
    pub seed: u64,
    /// System prefix every request starts with (after BOS where the model adds one): computed
    /// once, shared by every method, and the context the canonical KV of a chunk is prefilled
    /// after (so KV(B|∅) means "no antecedent page", and no chunk ever plays the attention sink).
    /// Empty for the bare setting.
    pub system: String,
    /// Per layer, the (K, V) share of the blind KL lost when that layer's K (V) is left blind
    /// (`sensitivity::layer_sensitivity` of an `oracle-except` run), for `/ls` budgets; empty: none.
    #[serde(default)]
    pub layer_sensitivity: Vec<(f64, f64)>,
    /// Per layer, the calibrated second moments of the question queries (`qcal`'s table, per
    /// query head and dim) that `/wq=cal` weighs K's feature columns by; empty: none. Not
    /// written to reports (its provenance is, below).
    #[serde(skip)]
    pub query_calibration: Vec<Vec<f32>>,
    /// Where `query_calibration` came from: the model and calibration task ids it was measured
    /// on (empty: no table).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_calibration_tasks: Vec<String>,
    /// The per-model deficit basis `/klt` codes patches in (`--deficit-basis`; kamera-lab
    /// `klt`). Not written to reports (its header is, below).
    #[serde(skip)]
    pub deficit_basis: Option<Arc<DeficitBasis>>,
    /// Where `deficit_basis` came from (its header; none without a basis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deficit_basis_from: Option<BasisHeader>,
}

/// The default system prefix.
pub const DEFAULT_SYSTEM: &str = "You are a web agent. These are the pages you have visited so far.\n";

impl Default for EvalConfig {
    fn default() -> EvalConfig {
        EvalConfig {
            orbit_orderings: 24,
            check_layer: 1,
            oracle_curve: vec![0.1, 0.25, 0.5, 0.75],
            diagnostics: true,
            seed: 0,
            system: DEFAULT_SYSTEM.to_string(),
            layer_sensitivity: Vec::new(),
            query_calibration: Vec::new(),
            query_calibration_tasks: Vec::new(),
            deficit_basis: None,
            deficit_basis_from: None,
        }
    }
}
