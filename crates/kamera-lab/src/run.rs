//! The dispatcher: per task, each method's context for the chunks with the question and answer
//! prefilled on top, scored against the full re-prefill's answer-token distributions, plus the
//! task's diagnostics (deficit spectra, the oracle token curve, the orbit's layers).

use std::collections::BTreeMap;
use std::time::Instant;

use kamera_eval::{Task, score};
use kamera_model::Selection;
use kamera_ops::ChunkKv;

use crate::error::{ModelCtx, Result, invalid};
use crate::evaluator::{Evaluator, Formed, Prepared, Spectra, ms};
use crate::method::Method;
use crate::orbit::OrbitState;
use crate::task_result::{TaskDiagnostics, TaskResult, finish, method_cost};
use crate::weighted::WeightState;

impl Evaluator<'_> {
    /// Runs `methods` (spec as given, parsed) on one task.
    pub fn run_task(&self, task: &Task, methods: &[(String, Method)]) -> Result<TaskResult> {
        self.run_task_with(task, methods, None)
    }

    /// [`Evaluator::run_task`], with `other` the task whose pages `recall-foreign` patches are
    /// formed after.
    // Long: one arm per method family over the task's shared state (blind scores, spectra, orbit, weights).
    pub fn run_task_with(&self, task: &Task, methods: &[(String, Method)], other: Option<&Task>) -> Result<TaskResult> {
        let p = self.prepare(task)?;
        let rope = self.model.rope();
        let vocab = self.model.config().vocab;
        let blind_ctx = self.with_region(&p, &p.blind)?;
        let blind_rows = self.answer_rows(&p, &blind_ctx)?;
        let blind_scores = score(&p.full_rows, &blind_rows, &p.answer, vocab);
        let needs_spectra = self.cfg.diagnostics || methods.iter().any(|(_, m)| matches!(m, Method::Kamera(_)));
        let own: Vec<Vec<ChunkKv>> = p.cond.iter().map(|c| vec![c.clone()]).collect();
        let spectra = if needs_spectra {
            Some(self.spectra(&p, &own)?)
        } else {
            None
        };
        let mut orbit: Option<OrbitState> = None;
        let mut weights: Option<WeightState> = None;
        let mut results = BTreeMap::new();
        for (spec, m) in methods {
            let (rows, cost) = match m {
                Method::Full => (p.full_rows.clone(), method_cost(0.0, p.full_ms, 0.0, 1.0)),
                Method::Blind => (blind_rows.clone(), method_cost(1.0, p.blind_ms, 0.0, 0.0)),
                Method::Prefix => {
                    let t = Instant::now();
                    let mut ctx = p.sys_ctx.clone();
                    ctx.push(&p.canon[0]).model("prefix push")?;
                    let rest: Vec<u32> = p.chunk_toks[1..].concat();
                    let mut share = 0.0;
                    if !rest.is_empty() {
                        let pf = self.model.prefill(&rest, ctx.end(), &ctx).model("prefix recompute")?;
                        ctx.push(&pf.chunk).model("prefix push")?;
                        share = rest.len() as f64 / (rest.len() + p.chunk_toks[0].len()) as f64;
                    }
                    let t = ms(t);
                    (self.answer_rows(&p, &ctx)?, method_cost(1.0, t, 0.0, share))
                }
                Method::Kamera(spec) => {
                    let s = spectra.as_ref().ok_or_else(|| invalid("kamera needs spectra"))?;
                    let (svds, ws, svd_ms) = if spec.weighting.any() {
                        if weights.is_none() {
                            weights = Some(self.weight_state());
                        }
                        let state = weights.as_mut().ok_or_else(|| invalid("weight state"))?;
                        let (svds, ws, t) = self.weighted_svds(&p, state, &s.deficits, spec.weighting)?;
                        (svds, Some(ws), t)
                    } else {
                        (&s.svds[..], None, s.ms)
                    };
                    let plain = (spec.weighting.plain_ranks).then_some(&s.svds[..]);
                    let (patches, t) = self.spec_patches(&p, svds, ws, plain, spec)?;
                    let all: Vec<Option<&Formed>> = patches.iter().map(Some).collect();
                    let (ctx, cost) = self.patched(&p, &all, p.full_ms + svd_ms + t)?;
                    (self.answer_rows(&p, &ctx)?, cost)
                }
                Method::Orbit { kind, patch } => {
                    if orbit.is_none() {
                        orbit = Some(self.orbit_state(task, &p)?);
                    }
                    let o = orbit.as_mut().ok_or_else(|| invalid("orbit state"))?;
                    let done = self.run_orbit(&p, o, *kind, patch)?;
                    results.insert(spec.clone(), done);
                    continue;
                }
                Method::CacheBlend { fraction } => {
                    let groups = p.chunk_toks.iter().zip(&p.offs).map(|(c, &o)| (o, c.len())).collect();
                    let sel = Selection::Deviation {
                        check_layer: self.cfg.check_layer.min(self.model.config().n_layers - 1),
                        fraction: *fraction,
                        groups,
                    };
                    let (ctx, cost) = self.selective(&p, sel)?;
                    (self.answer_rows(&p, &ctx)?, cost)
                }
                Method::Epic { tokens } => {
                    let sel: Vec<usize> = p
                        .chunk_toks
                        .iter()
                        .zip(&p.offs)
                        .flat_map(|(c, &o)| o..o + (*tokens).min(c.len()))
                        .collect();
                    let (ctx, cost) = self.selective(&p, Selection::Tokens(sel))?;
                    (self.answer_rows(&p, &ctx)?, cost)
                }
                Method::OracleTokens { fraction } => {
                    let t = Instant::now();
                    let region = self.oracle_region(&p, *fraction)?;
                    let t = ms(t) + p.blind_ms;
                    let ctx = self.with_region(&p, &region)?;
                    (self.answer_rows(&p, &ctx)?, method_cost(1.0 + fraction, t, 0.0, 0.0))
                }
                Method::Recall { visit, patch } => {
                    let (ctx, cost) = self.recall(task, &p, *visit, other, patch)?;
                    (self.answer_rows(&p, &ctx)?, cost)
                }
                Method::KvQuant { fraction, deficit } => {
                    let (ctx, cost) = self.kv_quant(&p, *fraction, *deficit)?;
                    (self.answer_rows(&p, &ctx)?, cost)
                }
                Method::OracleLayer { layer, k, v, except } => {
                    let t = Instant::now();
                    let (base, donor) = if *except {
                        (&p.conditioned, &p.blind)
                    } else {
                        (&p.blind, &p.conditioned)
                    };
                    let region = crate::kv::swap_layer(base, donor, *layer, *k, *v)?;
                    let t = ms(t) + p.blind_ms;
                    let ctx = self.with_region(&p, &region)?;
                    (self.answer_rows(&p, &ctx)?, method_cost(1.0, t, 0.0, 0.0))
                }
            };
            let s = score(&p.full_rows, &rows, &p.answer, vocab);
            results.insert(spec.clone(), finish(s, blind_scores.kl, 1, cost));
        }
        let mut diagnostics = TaskDiagnostics::default();
        if self.cfg.diagnostics
            && let Some(s) = &spectra
        {
            diagnostics.layers = layer_diagnostics(&p, s, rope)?;
            for &share in &self.cfg.oracle_curve {
                let ctx = self.with_region(&p, &self.oracle_region(&p, share)?)?;
                let rows = self.answer_rows(&p, &ctx)?;
                diagnostics
                    .oracle_curve
                    .push((share, score(&p.full_rows, &rows, &p.answer, vocab).kl));
            }
            if let Some(o) = &mut orbit {
                diagnostics.orbit_layers = self.orbit_diagnostics(o)?;
            }
        }
        Ok(TaskResult {
            id: task.id.clone(),
            chunk_tokens: p.chunk_toks.iter().map(Vec::len).collect(),
            question_tokens: p.q_len,
            answer_tokens: p.answer.len(),
            full_ms: p.full_ms,
            blind_kl: blind_scores.kl,
            methods: results,
            diagnostics,
        })
    }
}

/// Per layer: K top-8/16/32 energy share, V top-8/16/32, K and V deficit energy relative to the
/// canonical KV; averaged over the chunks with antecedents (all chunks when there is one).
fn layer_diagnostics(p: &Prepared, s: &Spectra, _rope: &kamera_ops::RopeSpec) -> Result<Vec<[f64; 8]>> {
    let n_layers = p.canon.first().map_or(0, |c| c.layers().len());
    let chunks: Vec<usize> = if p.canon.len() > 1 {
        (1..p.canon.len()).collect()
    } else {
        vec![0]
    };
    let mut out = vec![[0.0f64; 8]; n_layers];
    let share = |sv: &[f32], r: usize| {
        let sq = |x: &f32| (*x as f64) * (*x as f64);
        let total: f64 = sv.iter().map(sq).sum();
        if total == 0.0 {
            1.0
        } else {
            sv.iter().take(r).map(sq).sum::<f64>() / total
        }
    };
    let energy = |m: &kamera_ops::Mat| m.to_f32_vec().iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
    for &c in &chunks {
        for l in 0..n_layers {
            let (sk, sv) = &s.svds[c][l];
            let (dk, dv) = &s.deficits[c].layers[l];
            let cl = &p.canon[c].layers()[l];
            let row = [
                share(&sk.singular, 8),
                share(&sk.singular, 16),
                share(&sk.singular, 32),
                share(&sv.singular, 8),
                share(&sv.singular, 16),
                share(&sv.singular, 32),
                energy(dk) / energy(&cl.k).max(1e-30),
                energy(dv) / energy(&cl.v).max(1e-30),
            ];
            for (o, x) in out[l].iter_mut().zip(row) {
                *o += x / chunks.len() as f64;
            }
        }
    }
    Ok(out)
}
