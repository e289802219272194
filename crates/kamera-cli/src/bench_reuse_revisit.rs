//! `kamera bench reuse`, the revisit: time to first token of pages coming back, on the path the
//! runtime takes. A [`Session`] (pinned prefix, a window holding every chunk) meets the chunks in
//! order, evicts them, and meets them again in the reverse order, which forms each chunk's patch
//! for that context (a conditioned prefill, the SVD in the background); they are evicted again.
//! Each timed revisit then meets them once more in the reverse order: the window plans a recall
//! with the patch cached for that exact context, kamera-sched's executor reads the canonical KV
//! and the patch from the store, relocates and patches it through the `Backend`, and the session
//! encoder writes it into the live context; the question is prefilled on that context. The full
//! re-prefill of the same tokens is its pair, alternating which goes first; the revisit's
//! next-token KL to it is measured in every pair.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail, ensure};
use kamera_agent::{Llm, Session, SessionConfig};
use kamera_gpu::CpuBackend;
use kamera_model::Model;
use kamera_ops::{DType, PatchConfig};
use kamera_store::{ChunkId, MemStore};
use serde::Serialize;

use crate::bench_stats::{Spread, paired};

/// The revisit's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Revisit {
    /// Chunks in the order of the timed revisits (indices into the chunks of the first visit).
    pub order: Vec<usize>,
    pub prefix_tokens: usize,
    pub chunk_tokens: Vec<usize>,
    pub question_tokens: usize,
    /// The window's KV (the executor's) and the patches' factors.
    pub kv_dtype: String,
    pub patch_dtype: String,
    pub rank: usize,
    /// `Session::observe` of every chunk and the model's read of the window (`context()`, where
    /// the held plans run): the window's plan, the executor's recall and place (store read,
    /// relocate + patch), the write into the live context.
    pub place_ms: Spread,
    /// The question prefilled on the live context.
    pub question_ms: Spread,
    pub ttft_ms: Spread,
    /// Full re-prefill of the same tokens (prefix, chunks in the revisit's order, question).
    pub full_ms: Spread,
    /// Full re-prefill / revisit, per pair.
    pub speedup: Spread,
    /// The revisit's placement in KV GB/s (f32 bytes read + written), from the median.
    pub place_gbs: f64,
    /// KL of the revisit's next-token distribution to the full re-prefill's (the largest over
    /// the pairs; they are the same computation each time), and whether the argmax agrees.
    pub kl: f64,
    pub top1_agree: bool,
    /// Per timed revisit: tokens placed from the store, patches applied, tokens prefilled (0:
    /// nothing of the chunks went through the model).
    pub placed_tokens: usize,
    pub patches_applied: usize,
    pub prefill_tokens: usize,
    /// The runtime's default would place these recalls blind (the model's measured blind KL
    /// within the cost model's budget); the bench times the patched recall regardless.
    pub blind_by_default: bool,
}

/// Page-like text of at least `n` tokens, cut at the fewest words that reach it, and its tokens
/// as the session reads a page.
pub fn page_text(llm: &Llm, seed: u64, n: usize) -> Result<(String, Vec<u32>)> {
    let mut sentences = n / 16 + 1;
    let text = loop {
        let text = kamera_eval::filler_text(seed, sentences);
        if llm.tokens(&text, false)?.len() >= n {
            break text;
        }
        sentences *= 2;
    };
    let words: Vec<&str> = text.split(' ').collect();
    let cut = |k: usize| words[..k].join(" ");
    // The fewest words whose text has at least n tokens (token counts grow with words).
    let (mut lo, mut hi) = (1, words.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if llm.tokens(&cut(mid), false)?.len() >= n {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let text = cut(hi);
    let toks = llm.tokens(&text, false)?;
    Ok((text, toks))
}

/// Evicts the chunks of `ids` from the window, the last placed first (nothing moves), and reads
/// the window (the session holds plans until a read: an eviction left unread would let the next
/// visit find the chunks' KV still in place, and nothing would be timed).
fn evict_all(session: &mut Session, ids: &[ChunkId]) -> Result<()> {
    for id in ids.iter().rev() {
        session.evict(id)?;
    }
    session.context()?;
    session.settle()?;
    Ok(())
}

pub struct RevisitConfig<'a> {
    pub goal: &'a str,
    /// The chunks' texts and tokens ([`page_text`]).
    pub pages: &'a [(String, Vec<u32>)],
    pub question: &'a [u32],
    pub rank: usize,
    pub patch_dtype: DType,
    pub pairs: usize,
}

// Long: the bench's phases (first visit, revisits, timed pairs, scores) share one session and its chunk ids.
pub fn revisit(model: &Arc<Model>, c: &RevisitConfig<'_>) -> Result<Revisit> {
    let llm = Llm::new(model.clone());
    let mut cost = kamera_agent::cost_model(
        model,
        &kamera_agent::CalibrationSource::Installed,
        &kamera_agent::BasisSource::None,
        &kamera_model::default_home(),
    )?;
    // This bench times the patched recall: where the model's measured blind KL is within the
    // budget (Qwen2.5-0.5B), the session would place these chunks blind instead, cheaper still;
    // the report says which the runtime would do.
    let blind_by_default = cost.recall_blind_kl <= cost.kl_budget;
    cost.recall_blind_kl = f64::INFINITY;
    let pages = c.pages;
    let cfg = SessionConfig {
        window_tokens: pages.iter().map(|p| p.1.len()).sum(),
        patch: PatchConfig::fixed(c.rank, c.patch_dtype),
        cost,
        ..SessionConfig::default()
    };
    let mut session = Session::new(model.clone(), Arc::new(MemStore::new()), Box::new(CpuBackend), cfg);
    session.pin(&llm.prefix_text(c.goal))?;
    session.settle()?;
    let ids: Vec<ChunkId> = pages.iter().map(|p| session.chunk_id(&p.0)).collect();
    let order: Vec<usize> = (0..pages.len()).rev().collect();
    let revisit_ids: Vec<ChunkId> = order.iter().map(|&i| ids[i]).collect();
    // The first visit, in order; then the first revisit in the new order forms the patches. The
    // model reads the window after each visit, as an agent step does (the session holds its
    // plans until a read).
    for (text, _) in pages {
        session.observe(text)?;
        session.context()?;
    }
    session.settle()?;
    evict_all(&mut session, &ids)?;
    for &i in &order {
        session.observe(&pages[i].0)?;
        session.context()?;
    }
    session.settle()?;
    evict_all(&mut session, &revisit_ids)?;

    let full_tokens: std::cell::RefCell<Vec<u32>> = Default::default();
    let (mut place, mut question, mut revisit_logits, mut full_logits) = (vec![], vec![], vec![], vec![]);
    let mut per_revisit = (0, 0, 0);
    let runs = paired(
        c.pairs,
        || {
            let before = session.stats().clone();
            let t0 = Instant::now();
            let mut decisions = Vec::new();
            for &i in &order {
                let applied = session.observe(&pages[i].0)?;
                decisions.extend(applied.plan.decisions.iter().map(|d| d.to_string()));
            }
            // The session holds its plans until the model reads the window: the placement runs
            // in `context()`, so it is timed up to there.
            let ctx = session.context()?;
            let placed = t0.elapsed().as_secs_f64() * 1e3;
            let base = ctx.len();
            let logits = model.extend(c.question, ctx)?.logits;
            let ttft = t0.elapsed().as_secs_f64() * 1e3;
            ctx.truncate(base);
            let work = session.stats().since(&before);
            per_revisit = (work.placed_tokens, work.patches_applied, work.prefill_tokens);
            if work.prefill_tokens != 0 || work.patches_applied != pages.len() {
                bail!(
                    "the revisit did not place every chunk with a stored patch ({} patches applied, {} tokens prefilled); the window decided: {}",
                    work.patches_applied,
                    work.prefill_tokens,
                    decisions.join("; ")
                );
            }
            if full_tokens.borrow().is_empty() {
                let mut t = session.window_tokens();
                t.extend(c.question);
                *full_tokens.borrow_mut() = t;
            }
            place.push(placed);
            question.push(ttft - placed);
            revisit_logits.push(logits);
            evict_all(&mut session, &revisit_ids)?;
            Ok(ttft)
        },
        || {
            // The first pair runs the revisit first, so the tokens are known here.
            let tokens = full_tokens.borrow();
            ensure!(!tokens.is_empty(), "bench: the full re-prefill ran before a revisit");
            let t = Instant::now();
            let logits = model.prefill(&tokens, 0, &model.empty_context())?.logits;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            full_logits.push(logits);
            Ok(ms)
        },
    )?;
    let ttft: Vec<f64> = runs.iter().map(|p| p.0).collect();
    let full: Vec<f64> = runs.iter().map(|p| p.1).collect();
    let kls: Vec<f64> = revisit_logits
        .iter()
        .zip(&full_logits)
        .map(|(r, f)| kamera_eval::kl(f, r))
        .collect();
    let top1_agree = revisit_logits
        .iter()
        .zip(&full_logits)
        .all(|(r, f)| kamera_model::argmax(r) == kamera_model::argmax(f));
    let layout = model.layout();
    let kv_per_token = 4 * layout.n_layers * (layout.k_features() + layout.v_features());
    let chunk_tokens: Vec<usize> = order.iter().map(|&i| pages[i].1.len()).collect();
    let place_s = Spread::of(&place);
    Ok(Revisit {
        order,
        prefix_tokens: session.pinned_tokens(),
        place_gbs: 2.0 * (kv_per_token * chunk_tokens.iter().sum::<usize>()) as f64 / (place_s.median.max(1e-9) * 1e6),
        chunk_tokens,
        question_tokens: c.question.len(),
        kv_dtype: "f32".into(),
        patch_dtype: format!("{:?}", c.patch_dtype).to_lowercase(),
        rank: c.rank,
        place_ms: place_s,
        question_ms: Spread::of(&question),
        ttft_ms: Spread::of(&ttft),
        full_ms: Spread::of(&full),
        speedup: Spread::of(&full.iter().zip(&ttft).map(|(f, r)| f / r.max(1e-9)).collect::<Vec<_>>()),
        kl: kls.iter().copied().fold(0.0, f64::max),
        top1_agree,
        placed_tokens: per_revisit.0,
        patches_applied: per_revisit.1,
        prefill_tokens: per_revisit.2,
        blind_by_default,
    })
}
