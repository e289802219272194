//! The harness: per task, the full re-prefill (the reference and the conditioned KV of every
//! chunk), the canonical KV of every chunk, then each method's context for the chunks with the
//! question and answer prefilled on top; answer-token distributions are compared to full's.

use std::collections::BTreeMap;
use std::time::Instant;

use kamera_model::{Context, Model, PrefillOptions, Selection};
use kamera_ops::{ChunkKv, DType, Deficit, LayerPatch, Patch, PatchConfig, Placement, RankPolicy, Svd, assemble};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ModelCtx, OpsCtx, Result};
use crate::generate::Rng;
use crate::kv::{slice, splice, token_deviation, top_k};
use crate::method::Method;
use crate::metrics::{Scores, gap_recovered, score};
use crate::task::Task;

/// Harness settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalConfig {
    /// Orderings sampled to form an orbit patch (never the evaluated one unless
    /// `orbit_include_eval`).
    pub orbit_orderings: usize,
    /// Make the evaluated ordering the first of the orbit's orderings (a check: with one ordering
    /// the orbit patch is then the Kamera patch).
    #[serde(default)]
    pub orbit_include_eval: bool,
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
}

/// The default system prefix.
pub const DEFAULT_SYSTEM: &str = "You are a web agent. These are the pages you have visited so far.\n";

impl Default for EvalConfig {
    fn default() -> EvalConfig {
        EvalConfig {
            orbit_orderings: 2,
            orbit_include_eval: false,
            check_layer: 1,
            oracle_curve: vec![0.1, 0.25, 0.5, 0.75],
            diagnostics: true,
            seed: 0,
            system: DEFAULT_SYSTEM.to_string(),
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
    /// Bytes stored for the task's chunks / their canonical KV bytes.
    pub bytes_ratio: f64,
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
struct Prepared {
    sys_ctx: Context,
    start: i64,
    chunk_toks: Vec<Vec<u32>>,
    /// Start of each chunk within the region.
    offs: Vec<usize>,
    qa: Vec<u32>,
    q_len: usize,
    answer: Vec<u32>,
    full_rows: Vec<f32>,
    full_ms: f64,
    conditioned: ChunkKv,
    cond: Vec<ChunkKv>,
    canon: Vec<ChunkKv>,
    canon_bytes: usize,
    blind: ChunkKv,
    blind_ms: f64,
}

/// Per chunk, the SVDs of its deficit per layer (K, V), and the time they took.
struct Spectra {
    svds: Vec<Vec<(Svd, Svd)>>,
    deficits: Vec<Deficit>,
    ms: f64,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Runs the methods of a task list on one model.
pub struct Evaluator<'a> {
    model: &'a Model,
    cfg: EvalConfig,
}

impl<'a> Evaluator<'a> {
    pub fn new(model: &'a Model, cfg: EvalConfig) -> Evaluator<'a> {
        Evaluator { model, cfg }
    }

    pub fn config(&self) -> &EvalConfig {
        &self.cfg
    }

    fn encode(&self, id: &str, what: &str, text: &str) -> Result<Vec<u32>> {
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
    fn answer_rows(&self, p: &Prepared, ctx: &Context) -> Result<Vec<f32>> {
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

    fn with_region(&self, p: &Prepared, region: &ChunkKv) -> Result<Context> {
        let mut ctx = p.sys_ctx.clone();
        ctx.push(region).model("context push")?;
        Ok(ctx)
    }

    fn prepare(&self, task: &Task) -> Result<Prepared> {
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
        let canon_bytes = canon.iter().map(ChunkKv::kv_bytes).sum();
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
            blind,
            blind_ms,
        };
        let ctx = self.with_region(&p, &p.conditioned)?;
        p.full_rows = self.answer_rows(&p, &ctx)?;
        Ok(p)
    }

    fn spectra(&self, p: &Prepared, conditioned: &[Vec<ChunkKv>]) -> Result<Spectra> {
        let t = Instant::now();
        let rope = self.model.rope();
        let mut deficits = Vec::new();
        let mut svds = Vec::new();
        for (conds, canon) in conditioned.iter().zip(&p.canon) {
            let ds = conds
                .iter()
                .map(|c| kamera_ops::deficit(c, canon, rope))
                .collect::<kamera_ops::Result<Vec<_>>>()
                .ops("deficit")?;
            let d = Deficit::mean(&ds).ops("deficit mean")?;
            let s = d
                .layers
                .iter()
                .map(|(k, v)| Ok((Svd::compute(k)?, Svd::compute(v)?)))
                .collect::<kamera_ops::Result<Vec<_>>>()
                .ops("deficit svd")?;
            deficits.push(d);
            svds.push(s);
        }
        Ok(Spectra {
            svds,
            deficits,
            ms: ms(t),
        })
    }

    /// Conditioned KV of every chunk under sampled orderings other than the task's.
    fn orbit_conditioned(&self, task: &Task, p: &Prepared) -> Result<(Vec<Vec<ChunkKv>>, f64)> {
        let n = p.chunk_toks.len();
        let mut h = self.cfg.seed ^ 0xcbf2_9ce4_8422_2325;
        for b in task.id.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        let mut rng = Rng::new(h);
        let identity: Vec<usize> = (0..n).collect();
        let mut orders: Vec<Vec<usize>> = Vec::new();
        if self.cfg.orbit_include_eval {
            orders.push(identity.clone());
        }
        let distinct_orders = (1..=n).product::<usize>().saturating_sub(1);
        let want = self
            .cfg
            .orbit_orderings
            .max(1)
            .min(distinct_orders + usize::from(self.cfg.orbit_include_eval))
            .max(1);
        let mut tries = 0;
        while orders.len() < want && tries < 1000 {
            tries += 1;
            let mut o = identity.clone();
            rng.shuffle(&mut o);
            if (o != identity || n == 1) && !orders.contains(&o) && orders.len() < want {
                orders.push(o);
            }
        }
        let t = Instant::now();
        let mut out: Vec<Vec<ChunkKv>> = vec![Vec::new(); n];
        for o in &orders {
            let toks: Vec<u32> = o.iter().flat_map(|&i| p.chunk_toks[i].iter().copied()).collect();
            let pf = self.model.prefill(&toks, p.start, &p.sys_ctx).model("orbit prefill")?;
            let mut at = 0;
            for &i in o {
                let len = p.chunk_toks[i].len();
                out[i].push(slice(&pf.chunk, at, len)?);
                at += len;
            }
        }
        Ok((out, ms(t)))
    }

    fn fixed_patches(&self, p: &Prepared, s: &Spectra, rank: usize) -> Result<(Vec<Patch>, f64)> {
        let ranks: Vec<Vec<(usize, usize)>> = s.svds.iter().map(|l| vec![(rank, rank); l.len()]).collect();
        self.ranked_patches(p, s, &ranks)
    }

    /// Patches truncated to `ranks[chunk][layer] = (K rank, V rank)`.
    fn ranked_patches(&self, p: &Prepared, s: &Spectra, ranks: &[Vec<(usize, usize)>]) -> Result<(Vec<Patch>, f64)> {
        let t = Instant::now();
        let patches = s
            .svds
            .iter()
            .zip(&p.canon)
            .zip(ranks)
            .map(|((svds, c), rs)| {
                let layers = svds
                    .iter()
                    .zip(rs)
                    .map(|((k, v), &(rk, rv))| {
                        Ok(LayerPatch {
                            k: k.truncate(rk, DType::F32)?,
                            v: v.truncate(rv, DType::F32)?,
                        })
                    })
                    .collect::<kamera_ops::Result<Vec<_>>>()?;
                Patch::new(*c.layout(), c.n_tokens(), layers)
            })
            .collect::<kamera_ops::Result<Vec<_>>>()
            .ops("patch truncate")?;
        Ok((patches, ms(t)))
    }

    /// Assembles the chunks with `patches`, returning the region and the time it took.
    fn assemble(&self, p: &Prepared, patches: &[Patch]) -> Result<(ChunkKv, f64)> {
        let t = Instant::now();
        let parts: Vec<Placement<'_>> = p
            .canon
            .iter()
            .zip(patches)
            .map(|(c, pt)| Placement {
                chunk: c,
                patch: Some(pt),
            })
            .collect();
        let kv = assemble(&parts, self.model.rope(), p.start, DType::F32).ops("assemble")?;
        Ok((kv, ms(t)))
    }

    fn patched(&self, p: &Prepared, patches: &[Patch], patch_ms: f64) -> Result<(Context, TaskMethod)> {
        let (kv, t) = self.assemble(p, patches)?;
        let bytes: usize = patches.iter().map(Patch::bytes).sum();
        Ok((
            self.with_region(p, &kv)?,
            method_cost(1.0 + bytes as f64 / p.canon_bytes as f64, t, patch_ms, 0.0),
        ))
    }

    /// Oracle token selection: the `fraction` most-deviating tokens of each chunk.
    fn oracle_region(&self, p: &Prepared, fraction: f64) -> Result<ChunkKv> {
        let dev = token_deviation(&p.conditioned, &p.blind);
        let mut take = Vec::new();
        for (c, &o) in p.chunk_toks.iter().zip(&p.offs) {
            let k = (fraction * c.len() as f64).ceil() as usize;
            take.extend(top_k(&dev[o..o + c.len()], k).into_iter().map(|i| i + o));
        }
        splice(&p.blind, &p.conditioned, &take)
    }

    fn selective(&self, p: &Prepared, sel: Selection) -> Result<(Context, TaskMethod)> {
        let toks: Vec<u32> = p.chunk_toks.concat();
        let t = Instant::now();
        let out = self
            .model
            .selective_recompute(&toks, &p.sys_ctx, &p.blind, &sel)
            .model("selective recompute")?;
        let t = ms(t) + p.blind_ms;
        let share = out.selected.len() as f64 / toks.len() as f64;
        Ok((self.with_region(p, &out.chunk)?, method_cost(1.0, t, 0.0, share)))
    }

    /// Runs `methods` (spec as given, parsed) on one task.
    pub fn run_task(&self, task: &Task, methods: &[(String, Method)]) -> Result<TaskResult> {
        let p = self.prepare(task)?;
        let rope = self.model.rope();
        let vocab = self.model.config().vocab;
        let blind_ctx = self.with_region(&p, &p.blind)?;
        let blind_rows = self.answer_rows(&p, &blind_ctx)?;
        let blind_scores = score(&p.full_rows, &blind_rows, &p.answer, vocab);
        let needs_spectra = self.cfg.diagnostics
            || methods.iter().any(|(_, m)| {
                matches!(
                    m,
                    Method::Kamera { .. } | Method::KameraBudget { .. } | Method::KameraShare { .. }
                )
            });
        let own: Vec<Vec<ChunkKv>> = p.cond.iter().map(|c| vec![c.clone()]).collect();
        let spectra = if needs_spectra {
            Some(self.spectra(&p, &own)?)
        } else {
            None
        };
        let mut orbit: Option<(Spectra, f64)> = None;
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
                Method::Kamera { rank } => {
                    let s = spectra.as_ref().ok_or_else(|| invalid("kamera needs spectra"))?;
                    let (patches, t) = self.fixed_patches(&p, s, *rank)?;
                    let (ctx, cost) = self.patched(&p, &patches, p.full_ms + s.ms + t)?;
                    (self.answer_rows(&p, &ctx)?, cost)
                }
                Method::KameraBudget { fraction } | Method::KameraShare { fraction } => {
                    let s = spectra.as_ref().ok_or_else(|| invalid("kamera-budget needs spectra"))?;
                    let t = Instant::now();
                    let rank = match m {
                        Method::KameraShare { .. } => RankPolicy::BudgetShare { fraction: *fraction },
                        _ => RankPolicy::Budget { fraction: *fraction },
                    };
                    let cfg = PatchConfig {
                        rank,
                        dtype: DType::F32,
                    };
                    let patches = s
                        .deficits
                        .iter()
                        .zip(&p.canon)
                        .map(|(d, c)| kamera_ops::patch_from_deficit(d, c.layout(), c.kv_bytes(), &cfg))
                        .collect::<kamera_ops::Result<Vec<_>>>()
                        .ops("budget patch")?;
                    let (ctx, cost) = self.patched(&p, &patches, p.full_ms + ms(t))?;
                    (self.answer_rows(&p, &ctx)?, cost)
                }
                Method::Orbit { rank } => {
                    if orbit.is_none() {
                        let (conds, t) = self.orbit_conditioned(task, &p)?;
                        orbit = Some((self.spectra(&p, &conds)?, t));
                    }
                    let (s, prefill_ms) = orbit.as_ref().ok_or_else(|| invalid("orbit spectra"))?;
                    let (patches, t) = self.fixed_patches(&p, s, *rank)?;
                    let (ctx, cost) = self.patched(&p, &patches, prefill_ms + s.ms + t)?;
                    (self.answer_rows(&p, &ctx)?, cost)
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
            };
            let s = score(&p.full_rows, &rows, &p.answer, vocab);
            results.insert(spec.clone(), finish(s, blind_scores.kl, cost));
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

fn invalid(detail: &str) -> Error {
    Error::Invalid {
        op: "Evaluator::run_task",
        detail: detail.into(),
    }
}

fn method_cost(bytes_ratio: f64, assemble_ms: f64, patch_ms: f64, recompute_share: f64) -> TaskMethod {
    TaskMethod {
        kl: 0.0,
        top1: 0.0,
        exact_match: false,
        answer_logprob: 0.0,
        gap_recovered: 0.0,
        bytes_ratio,
        assemble_ms,
        patch_ms,
        recompute_share,
    }
}

fn finish(s: Scores, blind_kl: f64, cost: TaskMethod) -> TaskMethod {
    TaskMethod {
        kl: s.kl,
        top1: s.top1,
        exact_match: s.exact_match,
        answer_logprob: s.answer_logprob,
        gap_recovered: gap_recovered(s.kl, blind_kl),
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
