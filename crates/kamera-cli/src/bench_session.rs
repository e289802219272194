//! `kamera bench session`: one long browsing session on the local site (real Chromium, revisits,
//! back-and-forth, questions along the way) under a tight window, every method on the same step
//! prompts in one process: the Kamera session, a radix prefix cache (a token trie over every
//! request, LRU by bytes) on its own transcript layout, a full re-prefill of Kamera's window every
//! step (the no-reuse baseline's re-encode: screenshots through the vision tower again), and with
//! `--against-llamacpp` llama.cpp's prompt cache and context shift on the same GGUF. Pages are
//! read as text, as screenshots (image chunks of a vision-language model) or both (`--observe`).
//! Per step and method: time to first token, total work (deferred work included), tokens
//! prefilled, KL of the next-token distribution to the full re-prefill of the same sequence, and
//! whether the chosen token (the chosen answer on question steps) is the same.

#[path = "bench_session_llama.rs"]
mod llama;
#[path = "bench_session_prefix.rs"]
mod prefix;
#[path = "bench_session_radix.rs"]
pub(crate) mod radix;
#[path = "bench_session_walk.rs"]
mod walk;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Args;
use kamera_agent::{Llm, Observe, Session};
use kamera_gpu::CpuBackend;
use kamera_store::{ChunkStore, MemStore};
use serde::Serialize;

use crate::bench_session_report as report;

/// The methods, in the report's order.
pub const METHODS: [&str; 5] = [
    "kamera",
    "radix-cache",
    "full-reprefill",
    "llama.cpp-prompt-cache",
    "llama.cpp-context-shift",
];

#[derive(Args)]
pub struct SessionArgs {
    /// Model name or path to a .gguf file.
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
    /// Steps of the browsing session (page visits).
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Page tokens the window holds (after the pinned prefix); the radix layout's too.
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Rank of the patches the session forms (fixed, f32 factors); unset: the cost model's
    /// measured point for this model, as `kamera run` forms them.
    #[arg(long)]
    rank: Option<usize>,
    /// Site seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Orders the agent works on (three pages each).
    #[arg(long, default_value_t = 3)]
    orders: usize,
    /// Do not repair the survivors of evictions after each answer (they are only re-rotated).
    #[arg(long)]
    no_repair: bool,
    /// The cost model's KL budget (most predicted answer KL a placement without a forward pass
    /// may cost); above the predicted KL of blind recalls and survivors (0.1 by default) the
    /// session places blind: the cheap end of the work/KL front.
    #[arg(long)]
    kl_budget: Option<f64>,
    /// More Kamera policies to run beside the default on the same steps, by KL budget (e.g.
    /// `0.1,1`): each a session of its own, reported as `kamera@kl<budget>` with the work/KL
    /// Pareto front of every method run.
    #[arg(long, value_delimiter = ',')]
    front: Vec<f64>,
    /// Bytes of KV the radix cache may hold. Default: what Kamera holds, measured after each of
    /// its steps (its window's and kept prompt rows' f32 KV plus every record in its store,
    /// patches included), the peak so far, so the trie never has more memory than Kamera has
    /// used. llama.cpp's prompt cache gets this figure, or else the bound Kamera may reach (the
    /// window, every distinct page once and `PROMPT_ROWS_TOKENS` prompt rows), fixed at its start.
    #[arg(long)]
    radix_bytes: Option<usize>,
    /// MB of vision-tower outputs the radix cache keeps by screenshot (SGLang's
    /// `SGLANG_VLM_CACHE_SIZE_MB`, whose default is 100), apart from its KV budget.
    #[arg(long, default_value_t = 100)]
    radix_tower_mb: usize,
    /// Also run llama.cpp (prompt cache, context shift) through scripts/bench_session_llamacpp.py
    /// (text models: `--observe text`).
    #[arg(long)]
    against_llamacpp: bool,
    /// What each method reads of a page: `text` (its chunk text), `screenshot` (its viewport
    /// screenshot as an image chunk; needs a vision-language model, `--model DIR` of a
    /// Qwen2.5-VL) or `both` (the text, then the screenshot, as `kamera run` observes).
    #[arg(long, default_value = "text")]
    observe: Observe,
    /// Chromium's viewport, WIDTHxHEIGHT: the screenshots' size before the session's resize to
    /// its pixel budget (`Budget::screenshot_pixels`).
    #[arg(long, default_value = "1280x720")]
    viewport: String,
    /// Folder for session.json, session.md and session.svg.
    #[arg(long, default_value = "bench-session")]
    out: PathBuf,
}

/// One method's figures at one step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MethodStep {
    pub ttft_ms: f64,
    /// Time to first token plus the work deferred past it (Kamera: `SessionStats::deferred_ms`
    /// of this step; the radix cache: inserting the new rows and evicting; llama.cpp's prompt
    /// cache: saving its state).
    pub work_ms: f64,
    /// Tokens through the model (Kamera: the plan's, the prompt's and the deferred repairs').
    pub prefill_tokens: Option<usize>,
    /// KL of the next-token distribution to the full re-prefill (ours) of the same sequence.
    pub kl: f64,
    /// llama.cpp: KL to llama.cpp's own full re-prefill of the same sequence.
    pub kl_own_engine: Option<f64>,
    /// The chosen next token (the chosen answer on question steps) is the full re-prefill's.
    pub agree: bool,
    pub answer: Option<String>,
    /// Kamera: the plan's execution; the radix cache: copying matched rows from the trie.
    pub setup_ms: Option<f64>,
    /// Screenshots run through the vision tower (resize + tower) in this step's work.
    pub images_encoded: Option<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StepRow {
    pub step: usize,
    pub path: String,
    /// Kamera's visit (hit, new, recall, stored).
    pub visit: String,
    pub window_tokens: usize,
    /// The radix layout: its tokens, whether the page was in it, tokens dropped before it.
    pub radix_tokens: usize,
    pub radix_hit: bool,
    pub radix_dropped: usize,
    /// Tokens of this step no cache holds (`report::Floor`).
    pub novel_tokens: usize,
    pub question: bool,
    /// The site's true answer, on question steps.
    pub truth: Option<String>,
    pub methods: BTreeMap<&'static str, MethodStep>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// What a method chose: the answer on question steps, else the next token.
fn choice(llm: &Llm, logits: &[f32], choices: Option<&[String]>) -> Result<(String, Option<String>)> {
    Ok(match choices {
        Some(c) => {
            let a = walk::answer_of(llm, logits, c)?;
            (a.clone(), Some(a))
        }
        None => (kamera_model::argmax(logits).to_string(), None),
    })
}

/// One Kamera session's step: the visit's plan (and the question's recall), the prompt on the
/// live context (the last step's prompt rows reused where they match), then its deferred work.
struct KameraStep {
    logits: Vec<f32>,
    ttft_ms: f64,
    deferred_ms: f64,
    plan_ms: f64,
    prefilled: usize,
    images: usize,
    visit: String,
}

/// Kamera's step on `page`, read as `observe` says (`both`: the text's chunks, then the
/// screenshot's, as the agent loop does; the question recalls from the text's).
fn kamera_step(
    session: &mut Session,
    model: &kamera_model::Model,
    page: &walk::Page,
    observe: Observe,
    question: Option<&str>,
    ptoks: &[u32],
) -> Result<KameraStep> {
    let before = session.stats().clone();
    let t0 = Instant::now();
    let text = if observe.text() {
        Some(session.observe_page(&page.text)?)
    } else {
        None
    };
    let shot = if observe.screenshot() {
        Some(session.observe_screenshot(&page.png)?)
    } else {
        None
    };
    if let (Some(q), Some(p)) = (question, &text) {
        session.recall_relevant_page(q, &p.chunks)?;
    }
    let plan_ms = ms(t0);
    let (out, reused) = session.live()?.prompt(model, ptoks)?;
    let logits = out.logits;
    let ttft_ms = ms(t0);
    let d1 = session.stats().deferred_ms;
    session.settle()?;
    let done = session.stats().since(&before);
    let visit = text.as_ref().or(shot.as_ref()).and_then(|p| p.applied.visit);
    Ok(KameraStep {
        logits,
        ttft_ms,
        deferred_ms: session.stats().deferred_ms - d1,
        plan_ms,
        prefilled: done.prefill_tokens + ptoks.len() - reused,
        images: done.images_encoded,
        visit: visit.map(|v| format!("{v:?}").to_lowercase()).unwrap_or_default(),
    })
}

/// A full re-encode of `session`'s window (its no-reuse baseline's) and then the prompt: the
/// logits, the time and the tokens prefilled and screenshots encoded.
fn full_reencode(
    session: &mut Session,
    model: &kamera_model::Model,
    ptoks: &[u32],
) -> Result<(Vec<f32>, f64, usize, usize)> {
    let t0 = Instant::now();
    let mut w = session.reencode_window()?;
    let logits = model.extend(ptoks, &mut w.ctx)?.logits;
    Ok((logits, ms(t0), w.tokens + ptoks.len(), w.images))
}

impl KameraStep {
    fn judged(&self, llm: &Llm, reference: &[f32], asks: Option<&[String]>) -> Result<MethodStep> {
        let (kl, agree, answer) = judge(llm, &self.logits, reference, asks)?;
        Ok(MethodStep {
            ttft_ms: self.ttft_ms,
            work_ms: self.ttft_ms + self.deferred_ms,
            prefill_tokens: Some(self.prefilled),
            kl,
            kl_own_engine: None,
            agree,
            answer,
            setup_ms: Some(self.plan_ms),
            images_encoded: Some(self.images),
        })
    }
}

/// Fidelity of `logits` to `reference` (KL, same choice) and the answer.
fn judge(
    llm: &Llm,
    logits: &[f32],
    reference: &[f32],
    choices: Option<&[String]>,
) -> Result<(f64, bool, Option<String>)> {
    let (mine, answer) = choice(llm, logits, choices)?;
    let (theirs, _) = choice(llm, reference, choices)?;
    Ok((kamera_eval::kl(reference, logits), mine == theirs, answer))
}

// Long: one step of every method side by side, in one loop, is the bench's pairing; split, the
// order and timing of the methods would be spread over several functions.
pub fn run(a: SessionArgs) -> Result<()> {
    let env = report::Machine::now();
    let viewport = crate::bench_reuse::parse_size("--viewport", &a.viewport)?;
    let model = Arc::new(crate::models::load(&a.model)?);
    if a.observe.screenshot() {
        anyhow::ensure!(
            model.vision().is_some(),
            "--observe {} needs a vision-language model (--model DIR of a Qwen2.5-VL); {} reads text only",
            a.observe,
            a.model
        );
        anyhow::ensure!(
            !a.against_llamacpp,
            "--against-llamacpp runs llama.cpp on a GGUF text model: give --observe text"
        );
    }
    let llm = Llm::new(model.clone());
    let threads = threads();
    eprintln!("threads: {threads} (candle's rayon pool; llama.cpp's n_threads is the same)");
    let walk = walk::walk(a.seed, a.steps, a.orders);
    eprintln!("observing {} pages on Chromium...", walk.len());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let pages = rt.block_on(walk::observe_pages(
        a.seed,
        &walk,
        [viewport[0] as u32, viewport[1] as u32],
    ))?;
    let goal = "Answer questions about orders and their shipments.";
    let choices: Vec<String> = kamera_site::STATUSES.iter().map(|s| s.to_string()).collect();
    let mut cost = kamera_agent::cost_model(
        &model,
        &kamera_agent::CalibrationSource::Installed,
        &kamera_agent::BasisSource::None,
        &kamera_model::default_home(),
    )?;
    for b in a.kl_budget.iter().chain(&a.front) {
        anyhow::ensure!(b.is_finite() && *b >= 0.0, "KL budget {b}: expected a finite KL >= 0");
    }
    if let Some(b) = a.kl_budget {
        cost.kl_budget = b;
    }
    let prefix_text = llm.prefix_text(goal);
    // The product's own session settings (`kamera run`'s `session_config`) for this budget.
    let session_budget = kamera_agent::Budget {
        window_tokens: a.window,
        patch_rank: a.rank,
        repair: !a.no_repair,
        ..kamera_agent::Budget::default()
    };
    let open = |cost: kamera_sched::CostModel| -> Result<(Session, Arc<MemStore>)> {
        let cfg = kamera_agent::session_config(&session_budget, cost);
        let store = Arc::new(MemStore::new());
        let mut session = Session::new(model.clone(), store.clone(), Box::new(CpuBackend), cfg);
        session.pin(&prefix_text)?;
        session.settle()?;
        Ok((session, store))
    };
    let (mut session, store) = open(cost.clone())?;
    let mut others = Vec::new();
    for b in &a.front {
        let name: &'static str = Box::leak(format!("kamera@kl{b}").into_boxed_str());
        let c = kamera_sched::CostModel {
            kl_budget: *b,
            ..cost.clone()
        };
        others.push((name, open(c)?.0));
    }
    let pinned = llm.tokens(&prefix_text, true)?;
    let layout = model.layout();
    let kv_per_token = 4 * layout.n_layers * (layout.k_features() + layout.v_features());
    // Each page as the radix cache's requests hold it (text tokens, then the screenshot).
    let max_pixels = session.config().image_max_pixels;
    let pieces = page_pieces(&llm, &model, &pages, a.observe, max_pixels)?;
    // Kamera holds its window, a store with every page's canonical KV and the prompt rows it
    // keeps per window layout: the same bytes for the radix cache by default (the window's
    // tokens + every distinct page's tokens once + those prompt rows).
    let mut distinct: BTreeMap<&str, usize> = BTreeMap::new();
    for (w, p) in walk.iter().zip(&pieces) {
        distinct.insert(&w.path, p.iter().map(|x| x.tokens().len()).sum());
    }
    let page_tokens: usize = distinct.values().sum();
    // llama.cpp's prompt cache is sized once, at its start: the bound Kamera's holdings may reach.
    let budget = a
        .radix_bytes
        .unwrap_or(kv_per_token * (a.window + pinned.len() + page_tokens + kamera_agent::PROMPT_ROWS_TOKENS));
    let mut radix = prefix::RadixCache::new(a.radix_bytes.unwrap_or(0), a.radix_tower_mb << 20, max_pixels);
    // The references' tower outputs (untimed; one image's are the same every time).
    let mut reference_tower = prefix::Towers::new(usize::MAX);
    let mut held = HeldBytes::default();
    // The longest sequence either layout sends: the pinned prefix, a full window and a prompt.
    let n_ctx = pinned.len() + a.window + 256;
    let mut transcript = prefix::AppendLayout::new(pinned.clone(), a.window);
    let mut rows = Vec::new();
    let mut llama_status: std::result::Result<(), String> = Err("not run: --against-llamacpp not given".into());
    let mut llama_server = None;
    if a.against_llamacpp {
        match start_llamacpp(&a, &model, threads, budget, n_ctx) {
            Ok(s) => {
                llama_server = Some(s);
                llama_status = Ok(());
            }
            Err(e) => llama_status = Err(format!("not run: {e:#}")),
        }
    }
    // The radix layout's last reference (its full re-encode), kept while the request is the same.
    let mut radix_reference: Option<(Vec<u32>, Vec<f32>)> = None;
    let mut floor = report::Floor::default();
    for (i, (w, page)) in walk.iter().zip(&pages).enumerate() {
        let prompt = match &w.question {
            Some(q) => llm.question_prompt(q, &choices),
            // As the model policy asks: the instruction names the current page.
            None => llm.close_turn(&format!("Current page: {}. What should the agent do next?", w.path)),
        };
        let ptoks = llm.tokens(&prompt, false)?;
        let asks = w.question.as_ref().map(|_| choices.as_slice());
        let question = w.question.as_ref().map(|q| format!("{goal}\n{q}"));
        let k = kamera_step(&mut session, &model, page, a.observe, question.as_deref(), &ptoks)?;
        let (k_ttft, k_deferred) = (k.ttft_ms, k.deferred_ms);
        // Each piece apart: a text keyed by its tokens, a screenshot by its one key.
        let read = std::iter::once((pinned.clone(), pinned.len()))
            .chain(
                pieces[i]
                    .iter()
                    .map(|p| (prefix::keys(std::slice::from_ref(p)), p.tokens().len())),
            )
            .collect();
        let novel_tokens = floor.step(read, window_chunks(&session), &ptoks);
        let peak = held.measure(&session, ptoks.len(), store.as_ref(), kv_per_token)?;
        if a.radix_bytes.is_none() {
            radix.trie.set_budget(peak);
        }
        let mut seq = session.window_tokens();
        let window_tokens = seq.len();
        seq.extend(&ptoks);
        // Full re-encode of Kamera's window.
        let (f_logits, f_ttft, f_tokens, f_images) = full_reencode(&mut session, &model, &ptoks)?;
        // The radix cache on its own layout, and the full re-encode of that layout (reference).
        let change = transcript.visit(&w.path, &pieces[i]);
        let mut request = transcript.pieces();
        let radix_tokens = request.iter().map(|p| p.tokens().len()).sum();
        request.push(prefix::Piece::Text(ptoks.clone()));
        let rseq: Vec<u32> = request.iter().flat_map(|p| p.tokens().to_vec()).collect();
        let r = radix.run(&model, &request)?;
        let rkeys = prefix::keys(&request);
        let rf_logits = match &radix_reference {
            // Tokens alone name a sequence only without screenshots (one grid's pads are alike).
            _ if !a.observe.screenshot() && rseq == seq => f_logits.clone(),
            Some((keys, logits)) if *keys == rkeys => logits.clone(),
            _ => prefix::extend(
                &model,
                &request,
                0,
                max_pixels,
                &mut reference_tower,
                &mut model.empty_context(),
            )?,
        };
        radix_reference = Some((rkeys, rf_logits.clone()));
        let mut methods = BTreeMap::new();
        methods.insert(METHODS[0], k.judged(&llm, &f_logits, asks)?);
        for (name, other) in &mut others {
            let o = kamera_step(other, &model, page, a.observe, question.as_deref(), &ptoks)?;
            let reference = if other.window_chunks() == session.window_chunks() {
                f_logits.clone()
            } else {
                full_reencode(other, &model, &ptoks)?.0
            };
            methods.insert(*name, o.judged(&llm, &reference, asks)?);
        }
        let (kl, agree, answer) = judge(&llm, &r.logits, &rf_logits, asks)?;
        methods.insert(
            METHODS[1],
            MethodStep {
                ttft_ms: r.ttft_ms,
                work_ms: r.work_ms,
                prefill_tokens: Some(r.prefilled),
                kl,
                kl_own_engine: None,
                agree,
                answer,
                setup_ms: Some(r.copy_ms),
                images_encoded: Some(r.images),
            },
        );
        let (_, _, answer) = judge(&llm, &f_logits, &f_logits, asks)?;
        methods.insert(
            METHODS[2],
            MethodStep {
                ttft_ms: f_ttft,
                work_ms: f_ttft,
                prefill_tokens: Some(f_tokens),
                kl: 0.0,
                kl_own_engine: None,
                agree: true,
                answer,
                setup_ms: None,
                images_encoded: Some(f_images),
            },
        );
        let kl_k = methods[METHODS[0]].kl;
        eprintln!(
            "step {i:>3} {:<22} {:<7} ttft kamera {:>6.0} ms (+{:>4.0} deferred), radix {:>6.0} ms ({} of {} reused; trie {:.1} of {:.1} MB), full {:>6.0} ms; KL kamera {:.1e} radix {:.1e}",
            w.path,
            k.visit,
            k_ttft,
            k_deferred,
            r.ttft_ms,
            r.reused,
            r.reused + r.prefilled,
            radix.trie.bytes() as f64 / 1e6,
            a.radix_bytes.unwrap_or(peak) as f64 / 1e6,
            f_ttft,
            kl_k,
            methods[METHODS[1]].kl,
        );
        if let Some(server) = &mut llama_server {
            let step = llama::SeqStep {
                window: seq,
                radix: rseq,
                drop: (change.dropped > 0).then_some([transcript.prefix_len(), change.dropped]),
            };
            let (pc, cs) = server.step(&step)?;
            for (name, s, reference) in [(METHODS[3], pc, &f_logits), (METHODS[4], cs, &rf_logits)] {
                methods.insert(name, llama_judged(&llm, &s, reference, asks)?);
            }
        }
        rows.push(StepRow {
            step: i,
            path: w.path.clone(),
            visit: k.visit.clone(),
            window_tokens,
            radix_tokens,
            radix_hit: change.hit,
            radix_dropped: change.dropped,
            novel_tokens,
            question: w.question.is_some(),
            truth: w.answer.clone(),
            methods,
        });
    }
    let llama_status = match llama_server {
        Some(server) => server.finish().map_err(|e| format!("failed: {e:#}")),
        None => Err(llama_status.err().unwrap_or_default()),
    };
    if let Err(e) = &llama_status {
        eprintln!("llama.cpp: {e}");
    }
    let memory = report::Memory {
        kv_bytes_per_token: kv_per_token,
        radix_budget_bytes: a.radix_bytes.unwrap_or(held.peak),
        radix_budget_rule: if a.radix_bytes.is_some() {
            "fixed by --radix-bytes"
        } else {
            "Kamera's measured peak so far (live window and prompt + kept prompt rows + store), set before each trie step"
        },
        llamacpp_cache_bytes: budget,
        radix_peak_note: "the trie's bytes never exceed the budget after a request; each method also holds one live context",
        radix_bytes_end: radix.trie.bytes(),
        radix_tower_budget_bytes: a.radix_tower_mb << 20,
        radix_tower_encoded: radix.tower.encoded,
        radix_tower_hits: radix.tower.hits,
        kamera_store_bytes_end: held.store_bytes(),
        kamera_window_bytes: kv_per_token * (a.window + transcript.prefix_len()),
        peak_rss_mb: crate::bench::proc_status_mb("VmHWM"),
    };
    let params = report::Params {
        command: crate::bench::command_line(),
        model: a.model.clone(),
        observe: a.observe.to_string(),
        viewport: a.viewport.clone(),
        window: a.window,
        orders: a.orders,
        // What the sessions form, from the one function that decides it.
        patch: match (a.rank, cost.patch_point()) {
            (None, Some(p)) => p.label.clone(),
            _ => {
                let p = kamera_agent::session_config(&session_budget, cost.clone()).patch;
                format!("{:?} {:?}", p.rank, p.dtype).to_lowercase()
            }
        },
        // As predicted at this window (the survivors' and the read's scale with it).
        blind_kl: [cost.recall_blind_kl, cost.survivor_kl(a.window), cost.read_kl(a.window)],
        seed: a.seed,
        threads,
    };
    let extra: Vec<&'static str> = others.iter().map(|(n, _)| *n).collect();
    let summary = report::summarize(
        &extra,
        params,
        env.finish(),
        &rows,
        session.stats(),
        radix.trie.stats,
        floor,
        memory,
        llama_status,
    );
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

/// Each page's pieces as the radix cache's requests hold them: its text's tokens, its
/// screenshot (decoded once per distinct PNG), or both in that order, as `observe` says.
fn page_pieces(
    llm: &Llm,
    model: &kamera_model::Model,
    pages: &[walk::Page],
    observe: Observe,
    max_pixels: usize,
) -> Result<Vec<Vec<prefix::Piece>>> {
    let mut shots: BTreeMap<&[u8], Arc<prefix::Screenshot>> = BTreeMap::new();
    let mut out = Vec::with_capacity(pages.len());
    for p in pages {
        let mut pieces = Vec::new();
        if observe.text() {
            pieces.push(prefix::Piece::Text(llm.tokens(&p.text, false)?));
        }
        if observe.screenshot() {
            let shot = match shots.get(p.png.as_slice()) {
                Some(s) => s.clone(),
                None => {
                    let s = Arc::new(prefix::Screenshot::new(model, &p.png, max_pixels)?);
                    shots.insert(&p.png, s.clone());
                    s
                }
            };
            pieces.push(prefix::Piece::Image(shot));
        }
        out.push(pieces);
    }
    let mut keys: Vec<u32> = shots.values().map(|s| s.key).collect();
    keys.sort_unstable();
    keys.dedup();
    anyhow::ensure!(
        keys.len() == shots.len(),
        "two distinct screenshots share a radix key (a 31-bit hash collision): rerun with another --seed"
    );
    Ok(out)
}

/// The chunks in `session`'s window and their rows, for [`report::Floor`].
fn window_chunks(session: &Session) -> Vec<(kamera_store::ChunkId, usize)> {
    session
        .window_chunks()
        .into_iter()
        .map(|id| (id, session.chunk_tokens(&id).map_or(0, <[u32]>::len)))
        .collect()
}

/// Starts llama.cpp's step server on the model's GGUF.
fn start_llamacpp(
    a: &SessionArgs,
    model: &kamera_model::Model,
    threads: usize,
    budget: usize,
    n_ctx: usize,
) -> Result<llama::LlamaServer> {
    let gguf = crate::models::resolve(&a.model)?;
    anyhow::ensure!(
        gguf.extension().is_some_and(|e| e == "gguf"),
        "llama.cpp needs a GGUF model; {} is not one",
        gguf.display()
    );
    llama::LlamaServer::start(&gguf, threads, budget, n_ctx, model.config().vocab)
}

/// A llama.cpp method's step judged against our full re-prefill of its sequence (and its own).
fn llama_judged(llm: &Llm, s: &llama::LlamaStep, reference: &[f32], asks: Option<&[String]>) -> Result<MethodStep> {
    let (kl, agree, answer) = judge(llm, &s.logits, reference, asks)?;
    Ok(MethodStep {
        ttft_ms: s.ttft_ms,
        work_ms: s.work_ms,
        prefill_tokens: s.prefilled,
        kl,
        kl_own_engine: Some(kamera_eval::kl(&s.reference, &s.logits)),
        agree,
        answer,
        setup_ms: None,
        images_encoded: None,
    })
}

/// Threads both engines use: rayon's pool size (`RAYON_NUM_THREADS`, else the CPUs this process
/// may run on), passed to llama.cpp as its `n_threads`.
fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// What Kamera holds, in bytes: the f32 KV of its live context (the window and the prompt just
/// read) and of its kept prompt rows, and every record in its store; the peak over the steps
/// measured so far.
#[derive(Default)]
struct HeldBytes {
    records: std::collections::HashMap<kamera_store::Key, usize>,
    peak: usize,
}

impl HeldBytes {
    /// Measures `session` (over `store`, `prompt` tokens read after its window) now; returns the
    /// peak so far.
    fn measure(
        &mut self,
        session: &Session,
        prompt: usize,
        store: &dyn ChunkStore,
        kv_per_token: usize,
    ) -> Result<usize> {
        let keys: std::collections::HashSet<kamera_store::Key> = store.keys(None)?.into_iter().collect();
        self.records.retain(|k, _| keys.contains(k));
        for k in keys {
            if !self.records.contains_key(&k)
                && let Some(r) = store.get(&k)?
            {
                self.records.insert(k, r.bytes());
            }
        }
        let kv = kv_per_token * (session.window_tokens().len() + prompt + session.prompt_rows_tokens());
        self.peak = self.peak.max(kv + self.store_bytes());
        Ok(self.peak)
    }

    /// The store's bytes at the last measure.
    fn store_bytes(&self) -> usize {
        self.records.values().sum()
    }
}
