//! The harness: per task, the full re-prefill (the reference and the conditioned KV of every
//! chunk), the canonical KV of every chunk, then each method's context for the chunks with the
//! question and answer prefilled on top; answer-token distributions are compared to full's.

use std::collections::BTreeMap;
use std::time::Instant;

use kamera_model::{Context, Model, PrefillOptions, Selection};
use kamera_ops::{ChunkKv, DType, Deficit, Patch, Placement, Svd, assemble};
use kamera_store::{ChunkId, Key, ModelFp, Record, codec};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ModelCtx, OpsCtx, Result};
use crate::kv::slice;
use crate::method::Method;
use crate::metrics::{Scores, gap_recovered, score};
use crate::task::Task;

mod form;

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
    /// (`alloc::layer_sensitivity` of an `oracle-except` run), for `/ls` budgets; empty: none.
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
    /// The per-model deficit basis `/klt` codes patches in (`--deficit-basis`; kamera-eval
    /// `klt`). Not written to reports (its header is, below).
    #[serde(skip)]
    pub deficit_basis: Option<std::sync::Arc<crate::klt::DeficitBasis>>,
    /// Where `deficit_basis` came from (its header; none without a basis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deficit_basis_from: Option<crate::klt::BasisHeader>,
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

/// Everything a task's methods share.
pub(crate) struct Prepared {
    pub(crate) sys_ctx: Context,
    pub(crate) start: i64,
    pub(crate) chunk_toks: Vec<Vec<u32>>,
    /// Start of each chunk within the region.
    pub(crate) offs: Vec<usize>,
    pub(crate) qa: Vec<u32>,
    pub(crate) q_len: usize,
    pub(crate) answer: Vec<u32>,
    pub(crate) full_rows: Vec<f32>,
    pub(crate) full_ms: f64,
    pub(crate) conditioned: ChunkKv,
    pub(crate) cond: Vec<ChunkKv>,
    pub(crate) canon: Vec<ChunkKv>,
    /// Encoded bytes of the chunks' canonical KV records (bf16, as kamera-store writes them).
    pub(crate) canon_bytes: usize,
    /// The same, per chunk.
    pub(crate) chunk_bytes: Vec<usize>,
    pub(crate) blind: ChunkKv,
    pub(crate) blind_ms: f64,
}

/// Per chunk, the SVDs of its deficit per layer (K, V), and the time they took.
pub(crate) struct Spectra {
    pub(crate) svds: Vec<Vec<(Svd, Svd)>>,
    pub(crate) deficits: Vec<Deficit>,
    pub(crate) ms: f64,
}

/// The dtype kamera-store writes by default; the bytes of canonical KV are counted in it.
pub(crate) const STORE_DTYPE: DType = DType::Bf16;

/// The payload bytes of `kv` stored as [`STORE_DTYPE`] (what a byte budget refers to).
pub(crate) fn store_kv_bytes(kv: &ChunkKv) -> usize {
    kv.kv_bytes() / kv.dtype().size() * STORE_DTYPE.size()
}

fn store_err(op: &'static str) -> impl FnOnce(kamera_store::Error) -> Error {
    move |source| Error::Store {
        op,
        source: Box::new(source),
    }
}

/// Encoded record bytes of `patches`, exactly as kamera-store writes them (with `dtype: None`:
/// the factors in their own type or as quantised codes).
pub(crate) fn stored_bytes<'p>(patches: impl IntoIterator<Item = &'p Patch>) -> Result<usize> {
    let m = ModelFp::of("kamera-eval");
    let key = Key::patch(m, ChunkId::of(b"chunk", "eval", m), &[], 0);
    let mut total = 0;
    for p in patches {
        let rec = Record::patch(m, 0, p.clone());
        total += codec::encode(&key, &rec, None).map_err(store_err("patch bytes"))?.len();
    }
    Ok(total)
}

pub(crate) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// A chunk's patch and, for a simulated type the record codec does not have, its record bytes.
pub(crate) type Formed = (Patch, Option<usize>);

/// Runs the methods of a task list on one model.
pub struct Evaluator<'a> {
    pub(crate) model: &'a Model,
    pub(crate) cfg: EvalConfig,
}

impl<'a> Evaluator<'a> {
    pub fn new(model: &'a Model, cfg: EvalConfig) -> Evaluator<'a> {
        Evaluator { model, cfg }
    }

    pub fn config(&self) -> &EvalConfig {
        &self.cfg
    }

    pub(crate) fn encode(&self, id: &str, what: &str, text: &str) -> Result<Vec<u32>> {
        let ids = self.model.tokenizer().encode_raw(text).model("tokenize")?;
        if ids.is_empty() {
            return Err(Error::Task {
                id: id.into(),
                detail: format!("{what} tokenizes to no tokens"),
            });
        }
        Ok(ids)
    }

    /// Answer-token logit rows (`answer x vocab`) of question + answer prefilled after `ctx`.
    pub(crate) fn answer_rows(&self, p: &Prepared, ctx: &Context) -> Result<Vec<f32>> {
        let opts = PrefillOptions { all_logits: true };
        let out = self
            .model
            .prefill_with(kamera_model::Input::Tokens(&p.qa), ctx.end(), ctx, opts)
            .model("answer prefill")?;
        let all = out.all_logits.ok_or_else(|| Error::Invalid {
            op: "answer prefill",
            detail: "runner returned no per-position logits".into(),
        })?;
        let v = self.model.config().vocab;
        let from = p.q_len - 1;
        Ok(all[from * v..(from + p.answer.len()) * v].to_vec())
    }

    pub(crate) fn with_region(&self, p: &Prepared, region: &ChunkKv) -> Result<Context> {
        let mut ctx = p.sys_ctx.clone();
        ctx.push(region).model("context push")?;
        Ok(ctx)
    }

    pub(crate) fn prepare(&self, task: &Task) -> Result<Prepared> {
        task.validate()?;
        let m = self.model;
        let sys = system_tokens(m, &self.cfg.system)?;
        let chunk_toks = task
            .chunks
            .iter()
            .enumerate()
            .map(|(i, c)| self.encode(&task.id, &format!("chunk {i}"), c))
            .collect::<Result<Vec<_>>>()?;
        let q = self.encode(&task.id, "question", &task.question)?;
        let answer = self.encode(&task.id, "answer", &task.answer)?;
        let mut qa = q.clone();
        qa.extend(&answer);
        let sys_ctx = if sys.is_empty() {
            m.empty_context()
        } else {
            let pf = m.prefill(&sys, 0, &m.empty_context()).model("system prefill")?;
            Context::from_chunk(&pf.chunk).model("system context")?
        };
        let start = sys.len() as i64;
        let mut offs = Vec::new();
        let mut region_toks = Vec::new();
        for c in &chunk_toks {
            offs.push(region_toks.len());
            region_toks.extend(c);
        }
        let t = Instant::now();
        let full = m.prefill(&region_toks, start, &sys_ctx).model("full prefill")?;
        let full_ms = ms(t);
        let conditioned = full.chunk;
        let cond = chunk_toks
            .iter()
            .zip(&offs)
            .map(|(c, &o)| slice(&conditioned, o, c.len()))
            .collect::<Result<Vec<_>>>()?;
        let canon = chunk_toks
            .iter()
            .map(|c| Ok(m.prefill(c, start, &sys_ctx).model("canonical prefill")?.chunk))
            .collect::<Result<Vec<_>>>()?;
        let m_fp = ModelFp::of("kamera-eval");
        let key = Key::canonical(m_fp, ChunkId::of(b"chunk", "eval", m_fp));
        let mut chunk_bytes = Vec::new();
        for c in &canon {
            let rec = Record::kv(m_fp, 0, c.clone());
            chunk_bytes.push(
                codec::encode(&key, &rec, Some(STORE_DTYPE))
                    .map_err(store_err("canonical bytes"))?
                    .len(),
            );
        }
        let canon_bytes = chunk_bytes.iter().sum();
        let t = Instant::now();
        let parts: Vec<Placement<'_>> = canon.iter().map(|c| Placement { chunk: c, patch: None }).collect();
        let blind = assemble(&parts, m.rope(), start, DType::F32).ops("blind assemble")?;
        let blind_ms = ms(t);
        let mut p = Prepared {
            sys_ctx,
            start,
            chunk_toks,
            offs,
            qa,
            q_len: q.len(),
            answer,
            full_rows: vec![],
            full_ms,
            conditioned,
            cond,
            canon,
            canon_bytes,
            chunk_bytes,
            blind,
            blind_ms,
        };
        let ctx = self.with_region(&p, &p.conditioned)?;
        p.full_rows = self.answer_rows(&p, &ctx)?;
        Ok(p)
    }

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
        let mut orbit: Option<crate::orbit::OrbitState> = None;
        let mut weights: Option<crate::weighted::WeightState> = None;
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

/// BOS (where the model adds one) followed by the system prefix.
pub(crate) fn system_tokens(m: &Model, system: &str) -> Result<Vec<u32>> {
    let tok = m.tokenizer();
    let mut sys: Vec<u32> = match tok.bos() {
        Some(b) if tok.adds_bos() => vec![b],
        _ => vec![],
    };
    if !system.is_empty() {
        sys.extend(tok.encode_raw(system).model("tokenize system")?);
    }
    Ok(sys)
}

pub(crate) fn invalid(detail: &str) -> Error {
    Error::Invalid {
        op: "Evaluator::run_task",
        detail: detail.into(),
    }
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
