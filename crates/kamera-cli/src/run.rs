//! `kamera run SCENARIO`, `kamera record SCENARIO --out DIR`, `kamera replay DIR`: the agent
//! runtime on real Chromium with the embedded default model, and browser-free replay.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use std::sync::Arc;

use kamera_agent::{
    BasisSource, CalibrationSource, ModelSource, RunSummary, RuntimeConfig, Scenario, StepRecord, StoreSource,
};
use kamera_harness::RunConfig;
use kamera_model::Model;

use crate::browser_args::BrowserArgs;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct RunArgs {
    /// A scenario file (scenarios/*.toml) or a bare scenario name; several (or --parallel) run as
    /// separate episodes in one process, sharing the model and the store.
    #[arg(required = true, num_args = 1.., value_name = "SCENARIO")]
    pub(crate) scenarios: Vec<String>,
    /// Run the scenarios as concurrent episodes, at most N at a time, each with its own session,
    /// trace and isolated browser, sharing the model's weights and the chunk store; prints each
    /// episode's result, episodes per minute and the peak memory of the process and its browsers.
    #[arg(long, value_name = "N")]
    pub(crate) parallel: Option<usize>,
    /// Also write an HTML report (step screenshots, timing chart, cache hits).
    #[arg(long)]
    pub(crate) report: Option<PathBuf>,
    /// Keep the trace in this folder, every step's screenshot included (default: no trace, and
    /// screenshots only where the model reads them; with --report, a temporary one).
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// At the answering step also time a full re-prefill of the context (the baseline).
    #[arg(long)]
    pub(crate) baseline: bool,
    /// Reuse no KV between steps: every model call re-prefills the whole window from scratch and
    /// nothing is stored or formed (the baseline to time a scenario against; compare the
    /// `time` line of `kamera run X` and `kamera run X --no-reuse`).
    #[arg(long)]
    pub(crate) no_reuse: bool,
    /// Keep an action cache in this folder: a step taken before on the same page is replayed
    /// with no model call; where the page changed it is healed (its target found again by its
    /// features, or re-inferred by one model call) and the entry updated. The summary reports
    /// `model_calls` and `cache_hits`.
    #[arg(long, value_name = "DIR")]
    pub(crate) action_cache: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) browser: BrowserArgs,
    #[command(flatten)]
    pub(crate) model: ModelArg,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

#[derive(Args, Clone)]
pub struct ModelArg {
    /// The model: a built-in name, a name added with `kamera models add`, a .gguf file or a
    /// model directory (a Qwen2.5-VL for `observe = "screenshot"`). Default: the embedded
    /// SmolLM2-135M-Instruct.
    #[arg(long, alias = "model-dir")]
    model: Option<String>,
    /// Arithmetic of prefills of 8+ tokens on quantized weights: f32 or bf16 (AVX512_BF16
    /// CPUs). Default: the fastest this CPU runs.
    #[arg(long)]
    prefill_precision: Option<kamera_model::PrefillPrecision>,
    /// The model's patch basis (written by `kamera eval --calibrate-basis`): patches are then
    /// transform-coded in it where the cost model's measured points favour that (Gemma 3).
    /// Default: `$KAMERA_HOME/bases/<fp>.bin` when it exists (<fp>: the first 16 hex digits of
    /// the model's weights-and-configuration fingerprint, whatever the prefill precision).
    #[arg(long)]
    patch_basis: Option<PathBuf>,
    /// The cost model's machine rates: a file written by `kamera calibrate`. Default: the one
    /// `kamera calibrate --model M` keeps for this model, else the stated defaults (with a
    /// warning).
    #[arg(long)]
    calibration: Option<PathBuf>,
}

impl ModelArg {
    pub(crate) fn name(&self) -> &str {
        self.model
            .as_deref()
            .unwrap_or(kamera_model::ModelName::Smollm2_135m.as_str())
    }
}

#[derive(Args, Clone)]
pub struct StoreArgs {
    /// Keep canonical chunks only in memory for this run (no persistent chunk store).
    #[arg(long)]
    pub(crate) no_store: bool,
    /// The persistent chunk store: a directory (default: $KAMERA_HOME/store), or a Redis URL
    /// (`redis://[user:pass@]host:port/db`) shared by a fleet, tiered memory -> local sled -> Redis.
    #[arg(long)]
    pub(crate) store: Option<String>,
    /// With a Redis store: write to Redis from a bounded queue of this many records instead of
    /// waiting for each write (write-behind; a queued record not yet written is lost to the fleet,
    /// not to this host, if the process dies).
    #[arg(long)]
    write_behind: Option<usize>,
    /// With `rediss://`: a PEM file of the CA (or self-signed certificate) to check the server
    /// against, instead of the system's roots.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
}

impl StoreArgs {
    /// No persistent store: memory only (what a replay keeps).
    pub fn none() -> StoreArgs {
        StoreArgs {
            no_store: true,
            store: None,
            write_behind: None,
            tls_ca: None,
        }
    }

    /// The chunk store asked for: memory with `--no-store`, else the tiered stack (a memory tier
    /// over the sled store, over Redis for a `redis://` URL); [`kamera_agent::open_store`] opens it.
    pub fn source(&self) -> StoreSource {
        if self.no_store {
            return StoreSource::Memory;
        }
        let redis = self
            .store
            .clone()
            .filter(|s| s.starts_with("redis://") || s.starts_with("rediss://"));
        let dir = match (&self.store, &redis) {
            (Some(p), None) => Some(PathBuf::from(p)),
            _ => None,
        };
        StoreSource::Stack {
            dir,
            redis,
            write_behind: self.write_behind,
            tls_ca: self.tls_ca.clone(),
        }
    }
}

#[derive(Args)]
pub struct RecordArgs {
    scenario: String,
    /// The trace folder (trace.ndjson, resources/, recorder.json).
    #[arg(long)]
    out: PathBuf,
    #[arg(long)]
    report: Option<PathBuf>,
    #[command(flatten)]
    browser: BrowserArgs,
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Args)]
pub struct ReplayArgs {
    /// A trace folder written by `kamera record` (or `kamera run --trace`).
    dir: PathBuf,
    #[arg(long)]
    json: bool,
    /// The model the trace was recorded with (as `kamera run --model`).
    #[command(flatten)]
    model: ModelArg,
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

pub(crate) fn load_model(m: &ModelArg) -> Result<Arc<Model>> {
    let name = m.name();
    let model =
        crate::models::load_with(name, m.prefill_precision).with_context(|| format!("loading the model {name:?}"))?;
    Ok(Arc::new(model))
}

/// A token cancelled at the first [`stop_signal`].
pub(crate) fn cancel_on_stop_signal(rt: &tokio::runtime::Runtime) -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    rt.spawn(async move {
        stop_signal().await;
        t.cancel();
    });
    token
}

/// Resolves at the next Ctrl-C (SIGINT) or, on Unix, SIGTERM: what MCP hosts, process managers
/// and `kill` send to stop a server. Both take the graceful path (the browser closed, the
/// trace and store flushed); before, SIGTERM killed the process and left its Chromium running.
/// Never resolves when neither signal can be listened to.
pub(crate) async fn stop_signal() {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        tokio::select! {
            r = tokio::signal::ctrl_c() => {
                if r.is_err() {
                    term.recv().await;
                }
            }
            _ = term.recv() => {}
        }
        return;
    }
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// On a fresh machine the Quick start's `kamera run` finds no chromium: run the repository's
/// installer (Debian's chromium via apt-get, idempotent) once, then go on.
pub(crate) fn ensure_chromium() -> Result<()> {
    let exe = std::env::var_os("KAMERA_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if exe.exists() {
        return Ok(());
    }
    let script = Path::new("scripts/install-chromium.sh");
    if !script.exists() {
        bail!(
            "chromium not found at {}: run scripts/install-chromium.sh from the repository (Debian's chromium) or set KAMERA_CHROMIUM",
            exe.display()
        );
    }
    eprintln!(
        "kamera: chromium not found at {}; running {}",
        exe.display(),
        script.display()
    );
    let status = std::process::Command::new("bash")
        .arg(script)
        .stdout(std::process::Stdio::null())
        .status()
        .context("running scripts/install-chromium.sh")?;
    if !status.success() || !exe.exists() {
        bail!("scripts/install-chromium.sh failed ({status}); install Debian's chromium as root and retry");
    }
    Ok(())
}

/// What `kamera run`/`record` assemble the runtime from (kamera-agent's [`RuntimeConfig`], as
/// `Agent::builder` does): the model, its calibration and basis, the store stack.
pub fn runtime_config(model: Arc<Model>, m: &ModelArg, store: &StoreArgs, reuse: bool) -> RuntimeConfig {
    RuntimeConfig {
        model: ModelSource::Loaded(model),
        calibration: match &m.calibration {
            Some(p) => CalibrationSource::Path(p.clone()),
            None => CalibrationSource::Installed,
        },
        basis: match &m.patch_basis {
            Some(p) => BasisSource::Path(p.clone()),
            None => BasisSource::Installed,
        },
        store: store.source(),
        reuse,
        ..RuntimeConfig::default()
    }
}

/// How a run is set up.
struct Setup<'a> {
    trace_dir: Option<&'a Path>,
    report: Option<&'a Path>,
    store: &'a StoreArgs,
    model: &'a ModelArg,
    baseline: bool,
    reuse: bool,
    action_cache: Option<&'a Path>,
    browser: &'a BrowserArgs,
}

fn execute(scenario_arg: &str, setup: Setup<'_>) -> Result<RunSummary> {
    let Setup {
        trace_dir,
        report,
        store,
        model: model_arg,
        baseline,
        reuse,
        action_cache,
        browser,
    } = setup;
    let path = kamera_agent::resolve(scenario_arg);
    let scenario = kamera_harness::load_scenario(&path)?;
    ensure_chromium()?;
    let model = load_model(model_arg)?;
    let runtime_cfg = runtime_config(model.clone(), model_arg, store, reuse);
    let rt = runtime()?;
    let cancel = cancel_on_stop_signal(&rt);
    let pb = crate::progress::bar(scenario.budget.steps, "steps");
    let pb2 = pb.clone();
    let on_step = Box::new(move |s: &StepRecord| {
        pb2.inc(1);
        pb2.set_message(s.action.as_ref().map(|a| a.label()).unwrap_or_default());
        tracing::info!(step = s.step, url = %s.observation.url, action = ?s.action, result = %s.result, ms = s.timings.total_ms, "step");
    });
    let home = kamera_model::default_home();
    let browser = browser.options(&home)?;
    let summary = rt.block_on(kamera_harness::run_scenario(
        &scenario,
        model,
        &home,
        RunConfig {
            trace_dir: trace_dir.map(Path::to_path_buf),
            cancel,
            on_step: Some(on_step),
            runtime: runtime_cfg,
            baseline,
            action_cache: action_cache.map(Path::to_path_buf),
            browser,
        },
    ))?;
    pb.finish_and_clear();
    if let Some(r) = report {
        let resources = trace_dir.map(|d| d.join("resources"));
        kamera_harness::report::write_html(&summary, resources.as_deref(), r)?;
    }
    Ok(summary)
}

/// The run's table (what `kamera run` prints, and the MCP server's `run_scenario` returns); `reuse: false` (`--no-reuse`): the window column says so instead of the plan,
/// which the window made but the session did not execute.
// Long: the run's table, one line per statement in print order.
pub(crate) fn summary_text(s: &RunSummary, reuse: bool) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    _ = writeln!(o, "scenario  {}", s.scenario);
    _ = writeln!(
        o,
        "window    how the page's chunk was met (hit, new, recall, stored) and the plan's steps as made (held until the model reads the window; \"rebuilt\": that read built the window afresh instead)"
    );
    _ = writeln!(
        o,
        "{:>4}  {:<28} {:<34} {:<34} {:>8} {:>8} {:>8}  result",
        "step", "page", "action", "window", "encode", "model", "total"
    );
    for st in &s.steps {
        let n = |name: &str| st.plan.iter().filter(|p| p.name() == name).count();
        let window = if reuse {
            format!(
                "{:?}: {}pf {}pl {}rl {}ev {}patch",
                st.visit,
                n("prefill"),
                n("place"),
                n("relocate"),
                n("evict"),
                n("form-patch") + n("store-patch") + n("form-orbit"),
            ) + if st.rebuilt { "; rebuilt" } else { "" }
        } else {
            format!("{:?}: window re-prefilled", st.visit)
        }
        .to_lowercase();
        let t = &st.timings;
        let page: String = st.observation.title.chars().take(28).collect();
        let action: String = st
            .action
            .as_ref()
            .map(|a| a.label())
            .unwrap_or_default()
            .chars()
            .take(34)
            .collect();
        _ = writeln!(
            o,
            "{:>4}  {:<28} {:<34} {:<34} {:>6.0}ms {:>6.0}ms {:>6.0}ms  {}",
            st.step,
            page,
            action,
            window,
            t.encode_ms + t.patch_ms,
            t.reuse_ms + t.prefill_ms + t.decode_ms,
            t.total_ms,
            st.result
        );
    }
    let c = &s.session;
    _ = writeln!(
        o,
        "session   {} hit, {} new, {} recall, {} from the store, {} evict, {} relocate; {} tokens placed without prefill, {} prefilled",
        c.hits, c.new, c.recalls, c.stored, c.evictions, c.relocations, c.placed_tokens, c.prefill_tokens
    );
    if reuse {
        let planned: usize = s
            .steps
            .iter()
            .flat_map(|st| &st.plan)
            .filter(|p| p.name() == "prefill")
            .count();
        let rebuilt = s.steps.iter().filter(|st| st.rebuilt).count();
        _ = writeln!(
            o,
            "lazy      {planned} prefills planned; {rebuilt} model reads built the window afresh instead of running the held plans"
        );
    }
    if c.patches_formed > 0 || c.patches_applied > 0 {
        let patch_ms: f64 = s.steps.iter().map(|st| st.timings.patch_ms).sum();
        _ = writeln!(
            o,
            "patches   {} formed ({patch_ms:.0} ms), {} placements relocated + patched",
            c.patches_formed, c.patches_applied
        );
    }
    if let Some(m) = s.steps.iter().rev().find_map(|st| st.model.as_ref()) {
        _ = writeln!(
            o,
            "model     context {} tokens (the live window); question {} tokens prefilled in {:.0} ms; answer in {:.0} ms",
            m.context_tokens, m.prompt_tokens, m.timings.prefill_ms, m.timings.decode_ms
        );
        if !m.scores.is_empty() {
            let scores: Vec<String> = m.scores.iter().map(|(c, v)| format!("{c} {v:.2}")).collect();
            _ = writeln!(o, "scores    {}", scores.join(", "));
        }
    }
    if let Some(st) = s.steps.iter().rev().find(|st| st.timings.baseline_prefill_ms.is_some())
        && let (Some(base), Some(m)) = (st.timings.baseline_prefill_ms, st.model.as_ref())
    {
        let reuse = st.timings.reuse_ms + st.timings.patch_ms;
        _ = writeln!(
            o,
            "baseline  full re-prefill of the {}-token context {base:.0} ms vs this step's reuse {:.1} ms + patch {:.0} ms ({:.1}x)",
            m.context_tokens,
            st.timings.reuse_ms,
            st.timings.patch_ms,
            base / reuse.max(1e-3)
        );
    }
    match &s.cache {
        Some(c) => {
            _ = writeln!(
                o,
                "cache     {} model calls, {} cache hits, {} healed, {} stored, {} replays that led elsewhere",
                s.model_calls, s.cache_hits, s.cache_healed, c.stored, c.mismatches
            )
        }
        None => {
            _ = writeln!(
                o,
                "cache     {} model calls, {} cache hits (no action cache)",
                s.model_calls, s.cache_hits
            )
        }
    }
    _ = writeln!(o, "answer    {}", s.end.answer.as_deref().unwrap_or("-"));
    if let Some(e) = &s.expected {
        _ = writeln!(o, "expected  {e}");
    }
    if let Some(r) = s.end.reward {
        _ = writeln!(o, "reward    {r:.3}");
    }
    if s.refused > 0 {
        _ = writeln!(o, "refused   {} navigation(s) off the allowed origins", s.refused);
    }
    for d in &s.end.downloads {
        _ = writeln!(o, "download  {} ({} bytes) from {}", d.path.display(), d.bytes, d.url);
    }
    if let Some(e) = &s.end.error {
        _ = writeln!(o, "error     {e}");
    }
    let verdict = match s.end.success {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "done (no success check)",
    };
    let sum = |f: fn(&kamera_agent::StepTimings) -> f64| s.steps.iter().map(|st| f(&st.timings)).sum::<f64>();
    let model_ms = sum(|t| t.reuse_ms + t.prefill_ms + t.decode_ms);
    _ = writeln!(
        o,
        "time      {:.2} s run; steps {:.2} s, of which model calls {:.2} s (context {:.2} s, prompt + answer {:.2} s)",
        s.wall_ms / 1e3,
        sum(|t| t.total_ms) / 1e3,
        model_ms / 1e3,
        sum(|t| t.reuse_ms) / 1e3,
        sum(|t| t.prefill_ms + t.decode_ms) / 1e3
    );
    _ = writeln!(
        o,
        "result    {verdict} in {} steps, {:.1} s",
        s.end.steps,
        s.wall_ms / 1e3
    );
    o
}

pub fn run(a: RunArgs) -> Result<()> {
    if a.scenarios.len() > 1 || a.parallel.is_some() {
        return crate::run_parallel::run(a);
    }
    // A trace is written where it is kept or a report reads its screenshots; without one the
    // run takes screenshots only where the model reads them.
    let dir = match (&a.trace, &a.report) {
        (Some(d), _) => Some(d.clone()),
        (None, Some(_)) => Some(std::env::temp_dir().join(format!("kamera-run-{}", std::process::id()))),
        (None, None) => None,
    };
    let summary = execute(
        &a.scenarios[0],
        Setup {
            trace_dir: dir.as_deref(),
            report: a.report.as_deref(),
            store: &a.store,
            model: &a.model,
            baseline: a.baseline,
            reuse: !a.no_reuse,
            action_cache: a.action_cache.as_deref(),
            browser: &a.browser,
        },
    )?;
    if let (None, Some(dir)) = (&a.trace, &dir) {
        let _ = std::fs::remove_dir_all(dir);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        if a.no_reuse {
            println!("reuse     off (--no-reuse): every model call re-prefilled the window; nothing stored");
        }
        print!("{}", summary_text(&summary, !a.no_reuse));
    }
    if summary.end.success == Some(false) {
        std::process::exit(2);
    }
    Ok(())
}

pub fn record(a: RecordArgs) -> Result<()> {
    let summary = execute(
        &a.scenario,
        Setup {
            trace_dir: Some(&a.out),
            report: a.report.as_deref(),
            store: &a.store,
            model: &a.model,
            baseline: false,
            reuse: true,
            action_cache: None,
            browser: &a.browser,
        },
    )?;
    let trace = kamera_agent::Trace::read(&a.out)?;
    let scenario = Scenario::parse(&trace.header.scenario, &a.out)?;
    let start = trace
        .steps
        .first()
        .map(|s| s.observation.url.clone())
        .unwrap_or_default();
    let rec = kamera_agent::devtools_recorder(&scenario.name, &start, &trace.steps, 800, 600);
    std::fs::write(a.out.join("recorder.json"), serde_json::to_string_pretty(&rec)?)?;
    print!("{}", summary_text(&summary, true));
    println!(
        "trace     {} (trace.ndjson, resources/, recorder.json)",
        a.out.display()
    );
    Ok(())
}

pub fn replay(a: ReplayArgs) -> Result<()> {
    if !a.dir.exists() {
        bail!("no trace at {}", a.dir.display());
    }
    let model = load_model(&a.model)?;
    let rt = runtime()?;
    let runtime_cfg = runtime_config(model.clone(), &a.model, &StoreArgs::none(), true);
    let report = rt.block_on(kamera_harness::replay_with(&a.dir, model, runtime_cfg))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", replay_text(&report));
    }
    if !report.matches() {
        std::process::exit(3);
    }
    Ok(())
}

/// The replay's table and how many of its actions match the recording (what `kamera replay`
/// prints, and the MCP server's `replay` returns).
pub(crate) fn replay_text(report: &kamera_harness::ReplayReport) -> String {
    let matching = report
        .recorded
        .iter()
        .zip(&report.replayed)
        .filter(|(x, y)| x == y)
        .count();
    format!(
        "{}replay    {matching} of {} actions match{}\n",
        summary_text(&report.summary, true),
        report.recorded.len(),
        match report.first_mismatch {
            None => " (identical)".to_string(),
            Some(i) => format!("; first difference at action {i}"),
        }
    )
}
