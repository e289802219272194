//! kamera-eval: reuse experiments on real weights. Every method (full re-prefill, prefix cache,
//! blind reuse, Kamera patches, orbit patches, CacheBlend, EPIC, the token oracle) builds the
//! context of a task's chunks with the model for real; answer-token distributions are compared
//! to the full re-prefill (KL, top-1, exact match, log-prob, share of the blind gap recovered)
//! alongside bytes stored and time. (`kamera bench reuse`, which times reuse against re-prefill on
//! the runtime's path, lives in kamera-cli.)

mod alloc;
mod deficit;
mod error;
mod generate;
mod klt;
mod kv;
mod kvq;
mod method;
mod metrics;
mod mixed;
mod noise;
mod orbit;
mod qcal;
mod recall;
mod report;
mod run;
mod split;
mod tail;
mod task;
mod weighted;

pub use alloc::{Alloc, layer_sensitivity};
pub use error::{Error, Result};
pub use generate::{GenConfig, Rng, filler_text, generate};
pub use kamera_ops::orbit_orderings;
pub use klt::{BasisHeader, DeficitBasis, calibrate_basis};
pub use kvq::{GroupQuant, MAX_GROUP, quantise_kv};
pub use method::{Method, OrbitKind, PatchSpec, Tail, Visit, WEIGHT_FLOOR, Weighting, parse_methods};
pub use metrics::{Scores, gap_recovered, kl, log_softmax, score};
pub use mixed::Form;
pub use noise::{NoiseFloor, TaskNoise, precision_noise};
pub use qcal::{QueryCalibration, calibrate_queries};
pub use report::{Diagnostics, LayerEnergy, MethodSummary, OraclePoint, OrbitLayer, Report, gap_se, summarize};
pub use run::{DEFAULT_SYSTEM, EvalConfig, Evaluator, TaskDiagnostics, TaskMethod, TaskResult};
pub use split::{Split, TaskRange, TaskSelection};
pub use task::{Task, load_tasks, parse_tasks, save_tasks, tasks_to_jsonl};

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
