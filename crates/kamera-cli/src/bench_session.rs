//! `kamera bench session`: one long browsing session on the local site (real Chromium, revisits,
//! back-and-forth, questions along the way) under a tight window, run three ways in one process
//! on the same pages: the Kamera session, a prefix cache, and a full re-prefill every step.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Args;
use kamera_agent::{Llm, Session, SessionConfig};
use kamera_browser::{Browser, ChromiumBrowser, ChromiumConfig, Content, Origins, Server};
use kamera_gpu::CpuBackend;
use kamera_model::{Context, Model};
use kamera_ops::{DType, PatchConfig};
use kamera_store::MemStore;
use serde::Serialize;

use crate::bench_session_report as report;

#[derive(Args)]
pub struct SessionArgs {
    /// Model name or path to a .gguf file.
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
    /// Steps of the browsing session (page visits).
    #[arg(long, default_value_t = 40)]
    steps: usize,
    /// Page tokens the window holds (after the pinned prefix).
    #[arg(long, default_value_t = 768)]
    window: usize,
    /// Rank of the patches the session forms.
    #[arg(long, default_value_t = 16)]
    rank: usize,
    /// Site seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Orders the agent works on (three pages each).
    #[arg(long, default_value_t = 3)]
    orders: usize,
    /// Do not repair the survivors of evictions after each answer (they are only re-rotated).
    #[arg(long)]
    no_repair: bool,
    /// Folder for session.json, session.md and session.svg.
    #[arg(long, default_value = "bench-session")]
    out: PathBuf,
}

/// One step of the walk: a page, and a question asked on it.
#[derive(Debug, Clone, Serialize)]
pub struct WalkStep {
    pub path: String,
    pub question: Option<String>,
    pub answer: Option<String>,
}

/// One method's figures at one step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MethodStep {
    pub ttft_ms: f64,
    /// Work done after the first token (Kamera: a new page's canonical KV and difference patch).
    pub deferred_ms: f64,
    /// Kamera: the plan's execution (the rest of the time to first token is the prompt).
    pub plan_ms: f64,
    pub prefill_tokens: usize,
    pub bytes_moved: u64,
    /// KL of the answer distribution to the full re-prefill (question steps).
    pub kl: Option<f64>,
    pub answer: Option<String>,
}

impl MethodStep {
    /// A baseline's step: all of its work is before the first token, nothing is moved.
    fn baseline(ttft_ms: f64, prefill_tokens: usize, kl: Option<f64>, answer: Option<String>) -> MethodStep {
        MethodStep {
            ttft_ms,
            prefill_tokens,
            kl,
            answer,
            ..MethodStep::default()
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StepRow {
    pub step: usize,
    pub path: String,
    pub visit: String,
    pub window_tokens: usize,
    pub question: bool,
    /// The site's true answer, on question steps.
    pub truth: Option<String>,
    pub kamera: MethodStep,
    pub prefix: MethodStep,
    pub full: MethodStep,
}

/// A walk over the site as an agent that works a few orders: first it opens each order's pages
/// (the list, the order, its shipment), then it goes back and forth over them (order, shipment,
/// the list, the next order) answering a status question on each pass, with a detour to the
/// catalogue now and then. The window holds about half of the working set, so revisits evict,
/// relocate and recall pages instead of hitting them.
fn walk(seed: u64, n: usize, orders: usize) -> Vec<WalkStep> {
    let data = kamera_site::data(seed);
    let orders = &data.orders[..orders.clamp(1, data.orders.len())];
    let visit = |p: &str| WalkStep {
        path: p.to_string(),
        question: None,
        answer: None,
    };
    let ask = |p: &str, order: &kamera_site::Order| WalkStep {
        path: p.to_string(),
        question: Some(format!("What is the shipping status of order {}?", order.id)),
        answer: Some(order.status.clone()),
    };
    let mut out = vec![visit("/"), visit("/orders")];
    for o in orders {
        out.push(visit(&format!("/orders/{}", o.id)));
        out.push(visit(&format!("/shipping/{}", o.tracking)));
    }
    let mut pass = 0;
    while out.len() < n {
        for (i, o) in orders.iter().enumerate() {
            out.push(visit("/orders"));
            out.push(visit(&format!("/orders/{}", o.id)));
            out.push(visit(&format!("/shipping/{}", o.tracking)));
            if (pass + i) % 2 == 0 {
                out.push(ask(&format!("/orders/{}", o.id), o));
            }
        }
        if pass % 2 == 1 {
            out.push(visit("/catalogue"));
        }
        pass += 1;
    }
    out.truncate(n);
    out
}

/// A prefix cache: the last few token sequences with their KV; a request reuses the longest
/// common token prefix of one of them, in place, and prefills the rest (vLLM's automatic prefix
/// caching and SGLang's radix cache serve exactly this prefix).
struct PrefixCache {
    entries: Vec<(Vec<u32>, Context)>,
    capacity: usize,
}

impl PrefixCache {
    fn run(&mut self, model: &Model, seq: &[u32]) -> Result<(Vec<f32>, usize)> {
        let lcp = |a: &[u32]| a.iter().zip(seq).take_while(|(x, y)| x == y).count();
        let best = (0..self.entries.len()).max_by_key(|&i| lcp(&self.entries[i].0));
        let (mut toks, mut ctx) = match best {
            Some(i) if lcp(&self.entries[i].0) > 0 => self.entries.remove(i),
            _ => {
                if self.entries.len() >= self.capacity {
                    self.entries.remove(0);
                }
                (Vec::new(), model.empty_context())
            }
        };
        let keep = lcp(&toks).min(seq.len() - 1);
        ctx.truncate(keep);
        toks.truncate(keep);
        let out = model.extend(&seq[keep..], &mut ctx)?;
        toks.extend_from_slice(&seq[keep..]);
        self.entries.push((toks, ctx));
        Ok((out.logits, seq.len() - keep))
    }
}

/// Observes every page of the walk once on real Chromium: the chunk text of each.
async fn observe_pages(seed: u64, walk: &[WalkStep]) -> Result<Vec<String>> {
    let server = Server::start(Content::Memory(kamera_site::generate(seed))).await?;
    let origin = server.origin();
    let mut browser =
        ChromiumBrowser::launch(ChromiumConfig::new(Origins::new(std::slice::from_ref(&origin))?)).await?;
    let mut out = Vec::new();
    for w in walk {
        browser.navigate(&server.url(&w.path)).await?;
        let obs = browser.observe().await?;
        out.push(kamera_agent::chunk_text(&obs, &origin));
    }
    browser.close().await?;
    Ok(out)
}

fn answer_of(llm: &Llm, logits: &[f32], choices: &[String]) -> Result<String> {
    // The choice whose first token the model finds most likely.
    let mut best = (f32::NEG_INFINITY, String::new());
    for c in choices {
        let t = llm.tokens(c, false)?;
        if let Some(&first) = t.first()
            && logits[first as usize] > best.0
        {
            best = (logits[first as usize], c.clone());
        }
    }
    Ok(best.1)
}

pub fn run(a: SessionArgs) -> Result<()> {
    let model = Arc::new(crate::models::load(&a.model)?);
    let llm = Llm::new(model.clone());
    let walk = walk(a.seed, a.steps, a.orders);
    eprintln!("observing {} pages on Chromium...", walk.len());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let pages = rt.block_on(observe_pages(a.seed, &walk))?;
    let goal = "Answer questions about orders and their shipments.";
    let choices: Vec<String> = kamera_site::STATUSES.iter().map(|s| s.to_string()).collect();
    let cfg = SessionConfig {
        window_tokens: a.window,
        patch: PatchConfig::fixed(a.rank, DType::F32),
        cost: kamera_agent::cost_model(
            &model,
            &kamera_agent::CalibrationSource::Installed,
            &kamera_agent::BasisSource::None,
            &kamera_model::default_home(),
        )?,
        repair: !a.no_repair,
        ..SessionConfig::default()
    };
    let mut session = Session::new(model.clone(), Arc::new(MemStore::new()), Box::new(CpuBackend), cfg);
    session.pin(&llm.prefix_text(goal))?;
    let mut cache = PrefixCache {
        entries: Vec::new(),
        capacity: 4,
    };
    let mut rows = Vec::new();
    for (i, (w, text)) in walk.iter().zip(&pages).enumerate() {
        let prompt = match &w.question {
            Some(q) => llm.question_prompt(q, &choices),
            // As the model policy asks: the instruction names the current page.
            None => llm.close_turn(&format!("Current page: {}. What should the agent do next?", w.path)),
        };
        let ptoks = llm.tokens(&prompt, false)?;
        // Kamera: the session's plan, then the prompt on the live context.
        let (moved0, prefilled0) = (session.stats().bytes_moved, session.stats().prefill_tokens);
        let t0 = Instant::now();
        let applied = session.observe(text)?;
        if let Some(q) = &w.question {
            session.recall_relevant(&format!("{goal}\n{q}"))?;
        }
        let k_plan = t0.elapsed().as_secs_f64() * 1e3;
        let ctx = session.context()?;
        let base = ctx.len();
        let k_logits = model.extend(&ptoks, ctx)?.logits;
        let k_ttft = t0.elapsed().as_secs_f64() * 1e3;
        ctx.truncate(base);
        let t0 = Instant::now();
        session.settle()?;
        let k_deferred = t0.elapsed().as_secs_f64() * 1e3;
        let mut seq = session.window_tokens();
        let window_tokens = seq.len();
        seq.extend(&ptoks);
        // Prefix cache over the same token sequence.
        let t0 = Instant::now();
        let (p_logits, p_prefill) = cache.run(&model, &seq)?;
        let p_ttft = t0.elapsed().as_secs_f64() * 1e3;
        // Full re-prefill.
        let t0 = Instant::now();
        let f_logits = llm.full_prefill(&seq)?;
        let f_ttft = t0.elapsed().as_secs_f64() * 1e3;
        let q = w.question.is_some();
        let kl = |l: &[f32]| q.then(|| kamera_eval::kl(&f_logits, l));
        let ans = |l: &[f32]| -> Result<Option<String>> { q.then(|| answer_of(&llm, l, &choices)).transpose() };
        let row = StepRow {
            step: i,
            path: w.path.clone(),
            visit: applied
                .visit
                .map(|v| format!("{v:?}").to_lowercase())
                .unwrap_or_default(),
            window_tokens,
            question: q,
            truth: w.answer.clone(),
            kamera: MethodStep {
                ttft_ms: k_ttft,
                deferred_ms: k_deferred,
                plan_ms: k_plan,
                // The plan's, the prompt's, and the repair's after the answer.
                prefill_tokens: session.stats().prefill_tokens - prefilled0 + ptoks.len(),
                bytes_moved: session.stats().bytes_moved - moved0,
                kl: kl(&k_logits),
                answer: ans(&k_logits)?,
            },
            prefix: MethodStep::baseline(p_ttft, p_prefill, kl(&p_logits), ans(&p_logits)?),
            full: MethodStep::baseline(f_ttft, seq.len(), kl(&f_logits), ans(&f_logits)?),
        };
        eprintln!(
            "step {i:>2} {:<22} {:<7} ttft kamera {:>7.0} ms (plan {:>5.0}), prefix {:>7.0} ms, full {:>7.0} ms{}",
            row.path,
            row.visit,
            k_ttft,
            k_plan,
            p_ttft,
            f_ttft,
            row.kamera.kl.map(|k| format!(", KL {k:.2e}")).unwrap_or_default()
        );
        rows.push(row);
    }
    let summary = report::summarize(&a.model, (a.window, a.orders, a.rank), &rows, session.stats());
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    std::fs::write(
        a.out.join("session.json"),
        serde_json::to_string_pretty(&serde_json::json!({ "summary": summary, "walk": walk, "steps": rows }))?,
    )?;
    let md = report::markdown(&summary);
    std::fs::write(a.out.join("session.md"), &md)?;
    std::fs::write(a.out.join("session.svg"), report::svg(&rows))?;
    println!("{md}");
    println!("wrote {}/session.{{json,md,svg}}", a.out.display());
    Ok(())
}
