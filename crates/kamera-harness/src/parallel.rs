//! Several episodes at once in one process ([`run_parallel`], `kamera run --parallel N`): one
//! copy of the model's weights and one chunk store shared by every episode, at most N episodes
//! running together on tokio, each with its own session (window, remembered values), policy,
//! trace and browser.
//!
//! Each episode launches a Chromium of its own rather than a browser context in a shared one:
//! confinement intercepts every request at the browser target (kamera-browser's `confine`), so
//! a shared browser could only be held to the union of the episodes' origins. A browser per
//! episode keeps each held to its own; it costs one Chromium's memory per extra episode, which
//! `kamera run --parallel` reports.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use kamera_agent::{Error, ModelSource, Result, RunSummary, RuntimeConfig, Scenario};
use kamera_browser::BrowserOptions;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::run::{RunConfig, run_scenario};

/// One episode to run.
pub struct Job {
    pub scenario: Scenario,
    /// Its trace folder (none: no trace kept).
    pub trace_dir: Option<PathBuf>,
}

/// How one episode ended.
pub struct Outcome {
    /// The job's place in the list given.
    pub index: usize,
    pub scenario: String,
    /// Its trace folder, as the job gave it.
    pub trace_dir: Option<PathBuf>,
    /// Milliseconds from the start of [`run_parallel`] to this episode's start and end.
    pub started_ms: f64,
    pub ended_ms: f64,
    pub result: Result<RunSummary>,
}

/// Whether `browser` suits parallel episodes: a profile, a storage-state file and an attached
/// browser belong to one run at a time (the error names which).
pub fn check_browser(browser: &BrowserOptions) -> Result<()> {
    let one_run = [
        ("--profile", browser.profile.is_some()),
        ("--storage-state", browser.storage_state.is_some()),
        ("--browser-url", browser.browser_url.is_some()),
    ];
    match one_run.iter().find(|(_, set)| *set) {
        Some((what, _)) => Err(Error::Build {
            detail: format!(
                "parallel runs: {what} belongs to one run at a time; parallel episodes each get an isolated browser"
            ),
        }),
        None => Ok(()),
    }
}

/// Runs `jobs`, at most `concurrency` at a time, every episode's runtime from `runtime` (a
/// [`RuntimeConfig::shared`] one, so weights and store are shared; its budget is replaced by
/// each scenario's) and a fresh isolated browser from `browser`. Outcomes come back in the
/// jobs' order; an episode's error does not stop the others. `cancel` stops them all.
pub async fn run_parallel(
    jobs: Vec<Job>,
    concurrency: usize,
    runtime: &RuntimeConfig,
    home: &Path,
    browser: BrowserOptions,
    cancel: CancellationToken,
) -> Result<Vec<Outcome>> {
    if concurrency == 0 {
        return Err(Error::Build {
            detail: "parallel runs: --parallel must be at least 1".into(),
        });
    }
    check_browser(&browser)?;
    let ModelSource::Loaded(model) = &runtime.model else {
        return Err(Error::Build {
            detail: "parallel runs: the runtime must be opened once first (RuntimeConfig::shared) so episodes share the weights".into(),
        });
    };
    let slots = Arc::new(Semaphore::new(concurrency));
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let n = jobs.len();
    for (index, job) in jobs.into_iter().enumerate() {
        let slots = slots.clone();
        let trace_dir = job.trace_dir.clone();
        let cfg = RunConfig {
            trace_dir: job.trace_dir,
            cancel: cancel.clone(),
            on_step: None,
            runtime: runtime.duplicate(),
            baseline: false,
            action_cache: None,
            browser: browser.clone(),
        };
        let model = model.clone();
        let home = home.to_path_buf();
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await;
            let started_ms = t0.elapsed().as_secs_f64() * 1e3;
            tracing::info!(index, scenario = %job.scenario.name, "episode starts");
            let result = run_scenario(&job.scenario, model, &home, cfg).await;
            let ended_ms = t0.elapsed().as_secs_f64() * 1e3;
            tracing::info!(index, scenario = %job.scenario.name, ok = result.is_ok(), ms = ended_ms - started_ms, "episode ends");
            Outcome {
                index,
                scenario: job.scenario.name.clone(),
                trace_dir,
                started_ms,
                ended_ms,
                result,
            }
        });
    }
    let mut out = Vec::with_capacity(n);
    while let Some(r) = tasks.join_next().await {
        out.push(r.map_err(|e| Error::Build {
            detail: format!("parallel runs: an episode's task ended abnormally: {e}"),
        })?);
    }
    out.sort_by_key(|o| o.index);
    Ok(out)
}
