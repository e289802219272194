//! The evaluator and what every method shares: per task, the full re-prefill (the reference and
//! the conditioned KV of every chunk), the canonical KV of every chunk and their blind
//! relocation ([`Prepared`]); the answer rows of a context; and how bytes and time are counted.
//! The methods add their own `impl Evaluator` blocks; `run` dispatches to them.

use std::time::Instant;

use kamera_eval::Task;
use kamera_model::{Context, Model, PrefillOptions};
use kamera_ops::{ChunkKv, DType, Deficit, Patch, Placement, Svd, assemble};
use kamera_store::{ChunkId, Key, ModelFp, Record, codec};

use crate::config::EvalConfig;
use crate::error::{Error, ModelCtx, OpsCtx, Result};
use crate::kv::slice;

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
