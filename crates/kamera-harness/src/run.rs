//! Convenience around [`run_episode`]: serve what a scenario needs on loopback, launch Chromium,
//! open a [`Session`] over the given store, run with the scenario's policy, and replay a trace
//! without a browser.

use std::path::Path;
use std::sync::Arc;

use kamera_agent::{
    Env, Error, ModelPolicy, ModelSource, OnStep, Parts, Policy, PolicyKind, Result, RunOptions, RunSummary,
    RuntimeConfig, Scenario, ScriptedPolicy, Session, Trace, TraceWriter, open_runtime, run_episode,
};
use kamera_browser::{
    Action, BrowserOptions, ChromiumBrowser, ChromiumConfig, Content, Origins, ReplayBrowser, Server,
};
use kamera_model::Model;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::miniwob;

/// A scenario's site, served on loopback for as long as this lives.
pub struct Served {
    pub server: Option<Server>,
    pub env: Env,
    pub origins: Origins,
}

/// Starts the local site or the suite (MiniWoB++, fetched into `home`) a scenario names.
pub async fn serve(scenario: &Scenario, home: &Path) -> Result<Served> {
    let server = if let Some(s) = &scenario.site {
        Some(Server::start(Content::Memory(kamera_site::generate_with(s.seed, s.perturb))).await?)
    } else if let Some(e) = &scenario.episode {
        if e.suite != miniwob::SUITE {
            return Err(Error::Suite {
                suite: e.suite.clone(),
                detail: format!("this harness serves only the {} suite", miniwob::SUITE),
            });
        }
        let home = home.to_path_buf();
        let dir = tokio::task::spawn_blocking(move || miniwob::ensure(&home))
            .await
            .map_err(|e| miniwob::suite_error(e.to_string()))??;
        Some(Server::start(Content::Dir(dir)).await?)
    } else {
        None
    };
    let origin = server.as_ref().map(|s| s.origin()).unwrap_or_default();
    let start = if scenario.start.starts_with('/') {
        format!("{origin}{}", scenario.start)
    } else {
        scenario.start.clone()
    };
    let mut allowed = scenario.allowed_origins.clone();
    if !origin.is_empty() {
        allowed.push(origin.clone());
    }
    if allowed.is_empty() {
        allowed.push(start.clone());
    }
    let origins = Origins::new(&allowed)?;
    Ok(Served {
        server,
        env: Env {
            origin,
            start_url: start,
        },
        origins,
    })
}

/// The policy a scenario asks for.
pub fn policy_for(scenario: &Scenario, origin: &str) -> Box<dyn Policy> {
    match scenario.policy {
        PolicyKind::Scripted => {
            Box::new(ScriptedPolicy::new(scenario.steps.clone(), origin).with_uploads(scenario.uploads.clone()))
        }
        PolicyKind::Model => Box::new(ModelPolicy::new(scenario.decoding)),
    }
}

/// Options of [`run_scenario`].
#[derive(Default)]
pub struct RunConfig {
    /// Record a trace here.
    pub trace_dir: Option<std::path::PathBuf>,
    pub cancel: CancellationToken,
    pub on_step: Option<OnStep>,
    /// What the session is assembled from ([`open_runtime`]): calibration, patch basis, store
    /// (default: a fresh in-memory store for this run), backend, reuse. The model passed to
    /// [`run_scenario`] and the scenario's budget replace its `model` and `budget`.
    pub runtime: RuntimeConfig,
    /// Time a full re-prefill of the answering window too ([`RunOptions::baseline`]).
    pub baseline: bool,
    /// The action cache's folder ([`kamera_agent::ActionCache`]), when the run keeps one.
    pub action_cache: Option<std::path::PathBuf>,
    /// The browser's profile, storage state and place (default: an isolated local Chromium).
    /// Its `downloads` folder, when unset, is `<trace_dir>/downloads` (a temporary folder,
    /// removed after the run, without a trace): a run's downloads are always saved and listed.
    pub browser: BrowserOptions,
}

/// Serves, launches Chromium, opens a session over `cfg.store`, runs, closes.
pub async fn run_scenario(scenario: &Scenario, model: Arc<Model>, home: &Path, cfg: RunConfig) -> Result<RunSummary> {
    let action_cache = match &cfg.action_cache {
        Some(d) => Some(kamera_agent::ActionCache::open(d)?),
        None => None,
    };
    let served = serve(scenario, home).await?;
    let mut session = session_with(scenario, model, cfg.runtime)?;
    let mut chromium = ChromiumConfig::new(served.origins.clone());
    chromium.options = cfg.browser;
    // Kept until the run ends: downloads land here when there is no trace to keep them.
    let mut scratch = None;
    if chromium.options.downloads.is_none() {
        chromium.options.downloads = Some(match &cfg.trace_dir {
            Some(d) => d.join("downloads"),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("kamera-downloads-")
                    .tempdir()
                    .map_err(|source| Error::Io {
                        op: "create a downloads folder",
                        path: std::env::temp_dir(),
                        source,
                    })?;
                scratch.insert(t).path().to_path_buf()
            }
        });
    }
    let mut browser = ChromiumBrowser::launch(chromium).await?;
    let mut policy = policy_for(scenario, &served.env.origin);
    let trace = match &cfg.trace_dir {
        Some(d) => Some(TraceWriter::create(d)?),
        None => None,
    };
    let opts = RunOptions {
        trace,
        cancel: cfg.cancel,
        on_step: cfg.on_step,
        recorded_end: None,
        baseline: cfg.baseline,
        language_model: None,
        action_cache,
    };
    let agent = Parts {
        browser: &mut browser,
        policy: policy.as_mut(),
        session: &mut session,
    };
    let r = run_episode(agent, scenario, &served.env, opts).await;
    let _ = kamera_browser::Browser::close(&mut browser).await;
    drop(scratch);
    r
}

/// A session for `scenario` as the runtime opens it by default (this machine's calibration, the
/// model's patch points and installed basis, an in-memory store, the CPU backend).
pub fn session_for(scenario: &Scenario, model: Arc<Model>) -> Result<Session> {
    session_with(scenario, model, RuntimeConfig::default())
}

/// A session for `scenario` from `runtime`, with `model` and the scenario's budget.
pub fn session_with(scenario: &Scenario, model: Arc<Model>, runtime: RuntimeConfig) -> Result<Session> {
    open_runtime(RuntimeConfig {
        model: ModelSource::Loaded(model),
        budget: scenario.budget.clone(),
        ..runtime
    })
}

/// The result of replaying a trace.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub summary: RunSummary,
    pub recorded: Vec<Action>,
    pub replayed: Vec<Action>,
    /// Index of the first differing action, if any.
    pub first_mismatch: Option<usize>,
    pub recorded_answer: Option<String>,
}

impl ReplayReport {
    pub fn matches(&self) -> bool {
        self.first_mismatch.is_none()
    }
}

/// Re-runs the agent on a trace's recorded observations, no browser, and compares the actions,
/// over the runtime as it opens by default ([`session_for`]).
pub async fn replay(dir: &Path, model: Arc<Model>) -> Result<ReplayReport> {
    replay_with(dir, model, RuntimeConfig::default()).await
}

/// [`replay`] over the runtime of `runtime` (the calibration, basis and store the recording ran
/// with), with `model` and the recorded scenario's budget.
pub async fn replay_with(dir: &Path, model: Arc<Model>, runtime: RuntimeConfig) -> Result<ReplayReport> {
    let trace = Trace::read(dir)?;
    let scenario = Scenario::parse(&trace.header.scenario, &dir.join("trace.ndjson"))?;
    let mut browser = ReplayBrowser::new(trace.observations()?);
    let mut policy = policy_for(&scenario, &trace.header.origin);
    let mut session = session_with(&scenario, model, runtime)?;
    let env = Env {
        origin: trace.header.origin.clone(),
        start_url: String::new(),
    };
    let mut scenario_r = scenario.clone();
    // Replay exactly as many steps as were recorded.
    scenario_r.budget.steps = trace.steps.len().max(1);
    let opts = RunOptions {
        recorded_end: trace.end.clone(),
        ..Default::default()
    };
    let agent = Parts {
        browser: &mut browser,
        policy: policy.as_mut(),
        session: &mut session,
    };
    let summary = run_episode(agent, &scenario_r, &env, opts).await?;
    let recorded = trace.actions();
    let replayed = summary.actions();
    let first_mismatch = (0..recorded.len().max(replayed.len())).find(|&i| recorded.get(i) != replayed.get(i));
    Ok(ReplayReport {
        summary,
        recorded,
        replayed,
        first_mismatch,
        recorded_answer: trace.end.and_then(|e| e.answer),
    })
}
