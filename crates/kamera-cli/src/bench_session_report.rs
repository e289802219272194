//! The report of `kamera bench session`: per method the percentiles of time to first token, the
//! mean total work (deferred work included), fidelity to the full re-prefill at every step, ratios
//! to Kamera measured in the same run, the machine (CPU, load before and after, commit, threads);
//! a Markdown table and an SVG plot of time to first token per step.

use std::fmt::Write;

use kamera_agent::SessionStats;
use serde::Serialize;

#[path = "bench_session_svg.rs"]
mod svg_plot;

use crate::bench_session::radix::RadixStats;
use crate::bench_session::{METHODS, StepRow};
pub use svg_plot::svg;

/// Where and when the bench ran.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu: String,
    /// CPUs this process may run on.
    pub cores: usize,
    /// When the bench started, UTC `YYYY-MM-DD HH:MM`.
    pub date: String,
    pub loadavg_start: String,
    pub loadavg_end: String,
    pub commit: String,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

impl Machine {
    /// The CPU and its cores, the date, the load average now, and the commit
    /// (`$KAMERA_GIT_COMMIT`, else the one this binary was built from, `-dirty` when tracked
    /// files differed from it then: build.rs; a binary copied elsewhere keeps its own).
    pub fn now() -> Machine {
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("unknown")
            .trim()
            .to_string();
        let commit = std::env::var("KAMERA_GIT_COMMIT").unwrap_or_else(|_| env!("KAMERA_BUILD_COMMIT").to_string());
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            date: crate::bench_agent_report::utc_now(),
            loadavg_start: read("/proc/loadavg").trim().to_string(),
            loadavg_end: String::new(),
            commit,
        }
    }

    /// The same, with the load average at the end.
    pub fn finish(mut self) -> Machine {
        self.loadavg_end = read("/proc/loadavg").trim().to_string();
        self
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// The command that made the report, every flag as given.
    pub command: String,
    pub model: String,
    /// What the methods read of a page: text, screenshot or both.
    pub observe: String,
    /// Chromium's viewport (the screenshots' size before the resize).
    pub viewport: String,
    pub window: usize,
    pub orders: usize,
    /// The patches the sessions form: `--rank R` (f32 factors) or the cost model's point.
    pub patch: String,
    /// The KL each blind placement is predicted to cost (recall, survivors, a question's read):
    /// the model's measured values, or the defaults.
    pub blind_kl: [f64; 3],
    pub seed: u64,
    /// Candle's rayon threads = llama.cpp's n_threads.
    pub threads: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// f32 K and V of one token over all layers (ours; llama.cpp keeps f16, half of it).
    pub kv_bytes_per_token: usize,
    /// What the radix cache and llama.cpp's prompt cache may hold.
    pub radix_budget_bytes: usize,
    pub radix_peak_note: &'static str,
    /// How the radix cache's budget was set.
    pub radix_budget_rule: &'static str,
    /// The RAM given to llama.cpp's prompt cache.
    pub llamacpp_cache_bytes: usize,
    pub radix_bytes_end: usize,
    /// The radix cache's cache of vision-tower outputs (SGLang's `MultiModalCache`): its budget,
    /// screenshots encoded and served from it.
    pub radix_tower_budget_bytes: usize,
    pub radix_tower_encoded: usize,
    pub radix_tower_hits: usize,
    /// Kamera's store (canonical KV and patches of every page met) at the end.
    pub kamera_store_bytes_end: usize,
    /// Kamera's window at its budget (pinned prefix + pages).
    pub kamera_window_bytes: usize,
    /// The bench process's peak resident memory (every method runs in it, the model loaded once).
    pub peak_rss_mb: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MethodSummary {
    pub name: &'static str,
    /// "run", or "not run: <reason>" (then every figure is null).
    pub status: String,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p25_ms: Option<f64>,
    pub ttft_p75_ms: Option<f64>,
    pub ttft_mean_ms: Option<f64>,
    /// Time to first token plus the work deferred past it, mean per step.
    pub work_mean_ms: Option<f64>,
    pub work_p50_ms: Option<f64>,
    /// KL of the next-token distribution to the full re-prefill (ours) of the same sequence,
    /// over every step.
    pub mean_kl: Option<f64>,
    pub max_kl: Option<f64>,
    /// llama.cpp: the same to llama.cpp's own full re-prefill (no engine difference).
    pub mean_kl_own_engine: Option<f64>,
    pub max_kl_own_engine: Option<f64>,
    /// Steps whose chosen token (answer on question steps) is the full re-prefill's.
    pub action_agreement: Option<f64>,
    /// Question steps answered with the site's true status.
    pub correct: Option<usize>,
    pub prefill_tokens: Option<usize>,
    /// Screenshots run through the vision tower, over every step.
    pub images_encoded: Option<usize>,
    /// This method / Kamera, same run.
    pub ttft_p50_vs_kamera: Option<f64>,
    pub work_mean_vs_kamera: Option<f64>,
}

/// The tokens no cache can hold over a session: of each step, the content read for the first
/// time, counted two ways and the lesser taken — as pieces (the pinned prefix, the page's text
/// and screenshot, what a prefix cache's request holds; a text past its longest common start
/// with any text read before, which is all a prefix cache could match of it) and as the chunks in
/// Kamera's window (a page's blocks that the window reads, its screenshot; a block met but
/// evicted before it was read is not content the model read) — plus of the prompt what follows
/// its longest common start with an earlier prompt, at least one token (the next token's logits
/// need a forward pass in the step's context). An engine caching pages, chunks or prefixes
/// prefills at least these; their ratio to a method's tokens prefilled bounds what such a cache
/// could save on it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Floor {
    pub tokens: usize,
    /// Of content read for the first time.
    pub content_tokens: usize,
    /// Of prompts.
    pub prompt_tokens: usize,
    #[serde(skip)]
    pieces: Vec<Vec<u32>>,
    #[serde(skip)]
    chunks: std::collections::HashSet<kamera_store::ChunkId>,
    #[serde(skip)]
    prompts: Vec<Vec<u32>>,
}

/// A piece by its key (text tokens, or a screenshot's one key) and its rows.
pub type Keyed = (Vec<u32>, usize);

/// Rows of `rows` whose key (`key`, one per row for text, or one for all of a screenshot's)
/// lies past its longest common start with any key of `seen`, which holds it after.
fn past_common_start(seen: &mut Vec<Vec<u32>>, key: Vec<u32>, rows: usize) -> usize {
    let common = seen
        .iter()
        .map(|s| s.iter().zip(&key).take_while(|(a, b)| a == b).count())
        .max()
        .unwrap_or(0);
    let novel = rows * (key.len() - common) / key.len().max(1);
    if common < key.len() {
        seen.push(key);
    }
    novel
}

impl Floor {
    /// Counts one step: its content as pieces and as window chunks, then the prompt. Returns
    /// the step's tokens no cache holds.
    pub fn step(&mut self, pieces: Vec<Keyed>, chunks: Vec<(kamera_store::ChunkId, usize)>, prompt: &[u32]) -> usize {
        let as_pieces: usize = pieces
            .into_iter()
            .map(|(key, rows)| past_common_start(&mut self.pieces, key, rows))
            .sum();
        let as_chunks: usize = chunks
            .into_iter()
            .filter_map(|(key, rows)| self.chunks.insert(key).then_some(rows))
            .sum();
        let content = as_pieces.min(as_chunks);
        let prompt_novel = past_common_start(&mut self.prompts, prompt.to_vec(), prompt.len()).max(1);
        self.content_tokens += content;
        self.prompt_tokens += prompt_novel;
        self.tokens += content + prompt_novel;
        content + prompt_novel
    }
}

/// The steps of one kind of Kamera visit (hit, new, recall; a question's apart): the floor's
/// tokens and, for Kamera and the radix cache, tokens prefilled and total work, so a reader sees
/// where each spends beyond the floor.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VisitKind {
    pub visit: String,
    pub steps: usize,
    pub floor_tokens: usize,
    pub kamera_tokens: usize,
    pub radix_tokens: usize,
    pub kamera_work_ms: f64,
    pub radix_work_ms: f64,
}

fn by_visit(rows: &[StepRow]) -> Vec<VisitKind> {
    let mut kinds: std::collections::BTreeMap<String, VisitKind> = Default::default();
    for r in rows {
        let visit = format!("{}{}", r.visit, if r.question { ", question" } else { "" });
        let k = kinds.entry(visit.clone()).or_insert_with(|| VisitKind {
            visit,
            ..VisitKind::default()
        });
        k.steps += 1;
        k.floor_tokens += r.novel_tokens;
        if let Some(m) = r.methods.get(METHODS[0]) {
            k.kamera_tokens += m.prefill_tokens.unwrap_or(0);
            k.kamera_work_ms += m.work_ms;
        }
        if let Some(m) = r.methods.get(METHODS[1]) {
            k.radix_tokens += m.prefill_tokens.unwrap_or(0);
            k.radix_work_ms += m.work_ms;
        }
    }
    kinds.into_values().collect()
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub params: Params,
    pub machine: Machine,
    pub steps: usize,
    pub questions: usize,
    pub methods: Vec<MethodSummary>,
    /// More Kamera policies run on the same steps (`--front`), by KL budget.
    pub policies: Vec<MethodSummary>,
    /// The methods and policies on the work/KL Pareto front: none of the others has both less
    /// mean work and less mean KL.
    pub pareto: Vec<&'static str>,
    /// Tokens no engine can skip over these steps.
    pub floor: Floor,
    /// The floor, Kamera's and the radix cache's tokens and work by kind of visit.
    pub by_visit: Vec<VisitKind>,
    pub memory: Memory,
    pub session: SessionStats,
    pub radix: RadixStats,
    /// The llama.cpp script's report (version, system info), or why it did not run.
    pub llamacpp: serde_json::Value,
}

pub(crate) fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let i = ((xs.len() - 1) as f64 * p).round() as usize;
    xs[i]
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

fn method(name: &'static str, rows: &[StepRow], not_run: Option<&str>) -> MethodSummary {
    let steps: Vec<_> = rows.iter().filter_map(|r| r.methods.get(name)).collect();
    if let Some(why) = not_run.filter(|_| steps.is_empty()) {
        return MethodSummary {
            name,
            status: why.to_string(),
            ..MethodSummary::default()
        };
    }
    let ttft: Vec<f64> = steps.iter().map(|s| s.ttft_ms).collect();
    let work: Vec<f64> = steps.iter().map(|s| s.work_ms).collect();
    let kls: Vec<f64> = steps.iter().map(|s| s.kl).collect();
    let own: Vec<f64> = steps.iter().filter_map(|s| s.kl_own_engine).collect();
    let prefill: Option<usize> = steps.iter().map(|s| s.prefill_tokens).sum();
    let images: Option<usize> = steps.iter().map(|s| s.images_encoded).sum();
    MethodSummary {
        name,
        status: "run".into(),
        ttft_p50_ms: Some(percentile(ttft.clone(), 0.5)),
        ttft_p95_ms: Some(percentile(ttft.clone(), 0.95)),
        ttft_p25_ms: Some(percentile(ttft.clone(), 0.25)),
        ttft_p75_ms: Some(percentile(ttft.clone(), 0.75)),
        ttft_mean_ms: Some(mean(&ttft)),
        work_mean_ms: Some(mean(&work)),
        work_p50_ms: Some(percentile(work, 0.5)),
        mean_kl: Some(mean(&kls)),
        max_kl: kls.iter().copied().reduce(f64::max),
        mean_kl_own_engine: (!own.is_empty()).then(|| mean(&own)),
        max_kl_own_engine: own.iter().copied().reduce(f64::max),
        action_agreement: Some(steps.iter().filter(|s| s.agree).count() as f64 / steps.len().max(1) as f64),
        correct: Some(
            rows.iter()
                .filter(|r| r.truth.is_some() && r.methods.get(name).is_some_and(|s| s.answer == r.truth))
                .count(),
        ),
        prefill_tokens: prefill,
        images_encoded: images,
        ttft_p50_vs_kamera: None,
        work_mean_vs_kamera: None,
    }
}

// Each argument is one section of the report, filled by a different part of the bench.
#[allow(clippy::too_many_arguments)]
pub fn summarize(
    extra: &[&'static str],
    params: Params,
    machine: Machine,
    rows: &[StepRow],
    session: &SessionStats,
    radix: RadixStats,
    floor: Floor,
    memory: Memory,
    llamacpp: std::result::Result<serde_json::Value, String>,
) -> Summary {
    let not_run = llamacpp.as_ref().err().map(String::as_str);
    let mut methods: Vec<MethodSummary> = METHODS.iter().map(|m| method(m, rows, not_run)).collect();
    let (k_ttft, k_work) = (methods[0].ttft_p50_ms, methods[0].work_mean_ms);
    let mut policies: Vec<MethodSummary> = extra.iter().map(|m| method(m, rows, None)).collect();
    for m in methods.iter_mut().chain(&mut policies) {
        m.ttft_p50_vs_kamera = m.ttft_p50_ms.zip(k_ttft).map(|(a, b)| a / b);
        m.work_mean_vs_kamera = m.work_mean_ms.zip(k_work).map(|(a, b)| a / b);
    }
    let pareto = pareto(methods.iter().chain(&policies));
    Summary {
        params,
        machine,
        steps: rows.len(),
        questions: rows.iter().filter(|r| r.question).count(),
        methods,
        policies,
        pareto,
        floor,
        by_visit: by_visit(rows),
        memory,
        session: session.clone(),
        radix,
        llamacpp: match llamacpp {
            Ok(v) => v,
            Err(e) => serde_json::json!({ "status": e }),
        },
    }
}

/// The names of the run methods that no other run method beats on both mean work and mean KL.
fn pareto<'a>(all: impl Iterator<Item = &'a MethodSummary> + Clone) -> Vec<&'static str> {
    let point = |m: &MethodSummary| m.work_mean_ms.zip(m.mean_kl);
    all.clone()
        .filter_map(|m| point(m).map(|p| (m.name, p)))
        .filter(|(_, (w, kl))| {
            !all.clone()
                .filter_map(point)
                .any(|(w2, kl2)| w2 <= *w && kl2 <= *kl && (w2 < *w || kl2 < *kl))
        })
        .map(|(n, _)| n)
        .collect()
}

fn f(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn e(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.1e}"))
}

pub fn markdown(s: &Summary) -> String {
    let mut m = String::new();
    let p = &s.params;
    let _ = writeln!(
        m,
        "`{}` (observe {}, viewport {}, {} steps, window {}, {} orders, seed {}; {} patches; blind placements predicted at KL {:.1e} (recall) / {:.1e} (survivors) / {:.1e} (a question's read); {} question steps; {} threads on both engines)\n",
        p.command,
        p.observe,
        p.viewport,
        s.steps,
        p.window,
        p.orders,
        p.seed,
        p.patch,
        p.blind_kl[0],
        p.blind_kl[1],
        p.blind_kl[2],
        s.questions,
        p.threads
    );
    let _ = writeln!(
        m,
        "| method | TTFT p50 [p25, p75] | TTFT p95 | work mean (TTFT + deferred) | TTFT p50 / kamera | work / kamera | tokens prefilled | screenshots encoded | KL to full re-prefill, mean / max | same choice as full | correct answers |"
    );
    let _ = writeln!(m, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for x in s.methods.iter().chain(&s.policies) {
        if x.status != "run" {
            let _ = writeln!(m, "| {} | {} | | | | | | | | | |", x.name, x.status);
            continue;
        }
        let own = x
            .mean_kl_own_engine
            .map(|o| format!(" (own engine {o:.1e} / {})", e(x.max_kl_own_engine)))
            .unwrap_or_default();
        let _ = writeln!(
            m,
            "| {} | {} ms [{}, {}] | {} ms | {} ms | {}x | {}x | {} | {} | {} / {}{own} | {}% | {}/{} |",
            x.name,
            f(x.ttft_p50_ms, 0),
            f(x.ttft_p25_ms, 0),
            f(x.ttft_p75_ms, 0),
            f(x.ttft_p95_ms, 0),
            f(x.work_mean_ms, 0),
            f(x.ttft_p50_vs_kamera, 2),
            f(x.work_mean_vs_kamera, 2),
            x.prefill_tokens.map_or("-".into(), |t| t.to_string()),
            x.images_encoded.map_or("-".into(), |t| t.to_string()),
            e(x.mean_kl),
            e(x.max_kl),
            f(x.action_agreement.map(|a| 100.0 * a), 0),
            x.correct.unwrap_or(0),
            s.questions
        );
    }
    let _ = writeln!(
        m,
        "\nWork/KL Pareto front (no other row has both less mean work and less mean KL): {}.",
        s.pareto.join(", ")
    );
    let fl = &s.floor;
    let of = |name: &str| {
        s.methods
            .iter()
            .find(|x| x.name == name)
            .and_then(|x| x.prefill_tokens)
            .map_or("-".into(), |t| {
                format!("{:.2}x {name}'s {t}", fl.tokens as f64 / t.max(1) as f64)
            })
    };
    let _ = writeln!(
        m,
        "Tokens no cache holds: {} ({} of content read for the first time, {} of prompts past their common start with an earlier one, at least one a step): an engine caching pages, chunks or prefixes prefills at least these, {} and {}.",
        fl.tokens,
        fl.content_tokens,
        fl.prompt_tokens,
        of(METHODS[1]),
        of(METHODS[0]),
    );
    let _ = writeln!(
        m,
        "\n| Kamera's visit | steps | floor tokens | kamera tokens | radix-cache tokens | kamera work | radix-cache work |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for k in &s.by_visit {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {:.0} ms | {:.0} ms |",
            k.visit, k.steps, k.floor_tokens, k.kamera_tokens, k.radix_tokens, k.kamera_work_ms, k.radix_work_ms
        );
    }
    let _ = writeln!(m);
    let c = &s.session;
    let _ = writeln!(
        m,
        "Kamera: {} hit, {} new, {} recall, {} evict, {} relocate; {} patches formed, {} applied; {:.0} ms deferred work in all ({:.0} ms forward passes, {} of them repair tokens; {:.0} ms patch SVDs); {} tokens placed blind prefilled again before a question's answer.",
        c.hits,
        c.new,
        c.recalls,
        c.evictions,
        c.relocations,
        c.patches_formed,
        c.patches_applied,
        c.deferred_ms,
        c.deferred_prefill_ms,
        c.repair_tokens,
        c.deferred_patch_ms,
        c.read_repair_tokens
    );
    let r = &s.radix;
    let mem = &s.memory;
    let _ = writeln!(
        m,
        "Radix cache: {} of {} requests hit, {} tokens reused, {} inserted, {} nodes evicted ({:.1} MB); budget {:.1} MB ({}); llama.cpp's prompt cache {:.1} MB (Kamera's store at the end {:.1} MB + its window {:.1} MB).",
        r.hits,
        r.requests,
        r.tokens_reused,
        r.tokens_inserted,
        r.evicted_nodes,
        r.evicted_bytes as f64 / 1e6,
        mem.radix_budget_bytes as f64 / 1e6,
        mem.radix_budget_rule,
        mem.llamacpp_cache_bytes as f64 / 1e6,
        mem.kamera_store_bytes_end as f64 / 1e6,
        mem.kamera_window_bytes as f64 / 1e6,
    );
    if p.observe != "text" {
        let _ = writeln!(
            m,
            "Radix cache's tower outputs (SGLang's MultiModalCache, {:.0} MB): {} screenshots encoded, {} served from it.",
            mem.radix_tower_budget_bytes as f64 / (1 << 20) as f64,
            mem.radix_tower_encoded,
            mem.radix_tower_hits,
        );
    }
    let _ = writeln!(
        m,
        "Machine: {}; load {} at the start, {} at the end; commit {}; peak resident memory of the bench process {:.0} MB.",
        s.machine.cpu, s.machine.loadavg_start, s.machine.loadavg_end, s.machine.commit, mem.peak_rss_mb
    );
    m
}
