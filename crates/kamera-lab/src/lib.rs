//! kamera-lab: reuse experiments on real weights. Every method (full re-prefill, prefix cache,
//! blind reuse, Kamera patches, orbit patches, CacheBlend, EPIC, the token oracle, the runtime's
//! recall case, the equal-bytes KV quantiser) builds the context of a task's chunks with the model
//! for real; answer-token distributions are compared to the full re-prefill (kamera-eval's
//! metrics) alongside bytes stored and time. `kamera eval` runs it.
//!
//! Modules by layer (a module imports only from layers below it; `tests/no_import_cycles.rs`
//! keeps the graph acyclic):
//! - bottom: `error`, `kv` (KV slicing), `deficit`, `tail`, `mixed`, `alloc` (patch pieces),
//!   `config` ([`EvalConfig`]), `task_result` (per-method rows), `split`;
//! - `method` (the method and modifier language), `evaluator` ([`Evaluator`] and what every
//!   method shares);
//! - methods (`impl Evaluator` blocks): `qcal`, `klt`, `weighted`, `form`, `orbit`, `recall`,
//!   `kvq`, `noise`;
//! - top: `run` (the dispatcher), `report`, `sensitivity`, and [`evaluate`] here.

mod alloc;
mod config;
mod deficit;
mod error;
mod evaluator;
mod form;
mod klt;
mod kv;
mod kvq;
mod method;
mod mixed;
mod noise;
mod orbit;
mod qcal;
mod recall;
mod report;
mod run;
mod sensitivity;
mod split;
mod tail;
mod task_result;
mod weighted;

pub use alloc::Alloc;
pub use config::{DEFAULT_SYSTEM, EvalConfig};
pub use error::{Error, Result};
pub use evaluator::Evaluator;
pub use kamera_eval::{
    BasisHeader, DeficitBasis, GenConfig, Rng, Scores, Task, filler_text, gap_recovered, generate, kl, load_tasks,
    log_softmax, parse_tasks, save_tasks, score, tasks_to_jsonl,
};
pub use kamera_ops::orbit_orderings;
pub use klt::calibrate_basis;
pub use kvq::{GroupQuant, MAX_GROUP, quantise_kv};
pub use method::{Method, OrbitKind, PatchSpec, Visit, WEIGHT_FLOOR, Weighting, parse_methods};
pub use mixed::Form;
pub use noise::{NoiseFloor, TaskNoise, precision_noise};
pub use qcal::{QueryCalibration, calibrate_queries};
pub use report::{Diagnostics, LayerEnergy, MethodSummary, OraclePoint, OrbitLayer, Report, gap_se, summarize};
pub use sensitivity::layer_sensitivity;
pub use split::{Split, TaskRange, TaskSelection};
pub use tail::Tail;
pub use task_result::{TaskDiagnostics, TaskMethod, TaskResult};

/// Runs `methods` on every task and aggregates; `on_task` is called after each task.
pub fn evaluate(
    model: &kamera_model::Model,
    model_name: &str,
    tasks: &[Task],
    methods: &[(String, Method)],
    cfg: EvalConfig,
    on_task: &mut dyn FnMut(usize, &TaskResult),
) -> Result<Report> {
    let ev = Evaluator::new(model, cfg);
    let mut per_task = Vec::with_capacity(tasks.len());
    for (i, t) in tasks.iter().enumerate() {
        // `recall-foreign` forms a page's patch after the next task's pages (cyclically).
        let other = (tasks.len() > 1).then(|| &tasks[(i + 1) % tasks.len()]);
        let r = ev.run_task_with(t, methods, other)?;
        on_task(i, &r);
        per_task.push(r);
    }
    let order: Vec<String> = methods.iter().map(|(s, _)| s.clone()).collect();
    let mut report = summarize(model_name, &order, ev.config(), per_task);
    report.prefill_precision = Some(model.prefill_precision());
    Ok(report)
}
