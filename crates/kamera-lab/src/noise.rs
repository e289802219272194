//! The precision noise floor: how far the full re-prefill's answer moves when the model's long
//! prefills run in another arithmetic (bf16 against f32), as a share of the blind gap. A reuse
//! method's gap recovered cannot be read closer than this share when the two precisions are
//! compared.

use kamera_model::{Model, PrefillPrecision};
use serde::{Deserialize, Serialize};

use kamera_eval::{Task, score};

use crate::config::EvalConfig;
use crate::error::{ModelCtx, Result};
use crate::evaluator::Evaluator;

/// One task's noise floor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskNoise {
    pub id: String,
    /// Mean over answer tokens of KL(full in `reference` ‖ full in `other`).
    pub kl: f64,
    /// KL(full ‖ blind), both in `reference`.
    pub blind_kl_reference: f64,
    /// KL(full ‖ blind), both in `other`.
    pub blind_kl_other: f64,
}

/// [`precision_noise`]'s result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoiseFloor {
    pub reference: PrefillPrecision,
    pub other: PrefillPrecision,
    /// Mean of the per-task KLs.
    pub kl: f64,
    pub blind_kl_reference: f64,
    pub blind_kl_other: f64,
    /// `kl / blind_kl_reference`: the share of the blind gap the precision alone moves.
    pub share_of_gap: f64,
    pub per_task: Vec<TaskNoise>,
}

/// Per task, the full re-prefill's answer distributions with the model's prefills in
/// `reference` and in `other`, and blind reuse's in each. The model's precision is restored.
pub fn precision_noise(
    model: &mut Model,
    tasks: &[Task],
    cfg: &EvalConfig,
    reference: PrefillPrecision,
    other: PrefillPrecision,
) -> Result<NoiseFloor> {
    let was = model.prefill_precision();
    let vocab = model.config().vocab;
    let mut rows = Vec::new();
    for p in [reference, other] {
        model.set_prefill_precision(p).model("set prefill precision")?;
        let ev = Evaluator::new(model, cfg.clone());
        let mut per = Vec::with_capacity(tasks.len());
        for t in tasks {
            let prep = ev.prepare(t)?;
            let blind_ctx = ev.with_region(&prep, &prep.blind)?;
            let blind = ev.answer_rows(&prep, &blind_ctx)?;
            let blind_kl = score(&prep.full_rows, &blind, &prep.answer, vocab).kl;
            per.push((prep.full_rows, prep.answer, blind_kl));
        }
        rows.push(per);
    }
    model.set_prefill_precision(was).model("set prefill precision")?;
    let per_task: Vec<TaskNoise> = tasks
        .iter()
        .zip(rows[0].iter().zip(&rows[1]))
        .map(|(t, ((fr, answer, br), (fo, _, bo)))| TaskNoise {
            id: t.id.clone(),
            kl: score(fr, fo, answer, vocab).kl,
            blind_kl_reference: *br,
            blind_kl_other: *bo,
        })
        .collect();
    let mean = |f: &dyn Fn(&TaskNoise) -> f64| per_task.iter().map(f).sum::<f64>() / per_task.len().max(1) as f64;
    let (kl, br, bo) = (
        mean(&|t| t.kl),
        mean(&|t| t.blind_kl_reference),
        mean(&|t| t.blind_kl_other),
    );
    Ok(NoiseFloor {
        reference,
        other,
        kl,
        blind_kl_reference: br,
        blind_kl_other: bo,
        share_of_gap: if br > 1e-12 { kl / br } else { 0.0 },
        per_task,
    })
}
