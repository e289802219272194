//! Convenience around [`run_episode`]: serve what a scenario needs on loopback, launch Chromium,
//! run with the default scripted or model policy, and replay a trace without a browser.

use std::path::Path;
use std::sync::Arc;

use kamera_browser::{Action, ChromiumBrowser, ChromiumConfig, Content, Origins, ReplayBrowser, Server};
use kamera_model::{Model, ModelName};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::agent::{Env, RunOptions, RunSummary, run_episode};
use crate::cache::{ChunkCache, MemoryCache};
use crate::error::{Error, Result, model};
use crate::llm::Llm;
use crate::policy::{ModelPolicy, Policy, ScriptedPolicy};
use crate::scenario::{PolicyKind, Scenario};
use crate::trace::{Trace, TraceWriter};
use crate::{miniwob, site};

/// A scenario's site, served on loopback for as long as this lives.
pub struct Served {
    pub server: Option<Server>,
    pub env: Env,
    pub origins: Origins,
}

/// Starts the local site or MiniWoB++ server a scenario names (MiniWoB++ fetched into `home`).
pub async fn serve(scenario: &Scenario, home: &Path) -> Result<Served> {
    let server = if let Some(s) = &scenario.site {
        Some(Server::start(Content::Memory(site::generate(s.seed))).await?)
    } else if scenario.miniwob.is_some() {
        let home = home.to_path_buf();
        let dir = tokio::task::spawn_blocking(move || miniwob::ensure(&home))
            .await
            .map_err(|e| Error::MiniWob(e.to_string()))??;
        Some(Server::start(Content::Dir(dir)).await?)
    } else {
        None
    };
    let origin = server.as_ref().map(|s| s.origin()).unwrap_or_default();
    let start = if let Some(mw) = &scenario.miniwob {
        format!("{origin}{}", miniwob::task_path(&mw.task))
    } else if scenario.start.starts_with('/') {
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

/// Fetches (once, cached under `home`) and loads the embedded default model, SmolLM2-135M-Instruct.
pub fn default_model(home: &Path) -> Result<Arc<Model>> {
    let path = kamera_model::fetch(ModelName::Smollm2_135m, home).map_err(model("fetch"))?;
    Ok(Arc::new(Model::load(&path).map_err(model("load"))?))
}

/// The policy a scenario asks for.
pub fn policy_for(scenario: &Scenario, origin: &str) -> Box<dyn Policy> {
    match scenario.policy {
        PolicyKind::Scripted => Box::new(ScriptedPolicy::new(scenario.steps.clone(), origin)),
        PolicyKind::Model => Box::new(ModelPolicy::default()),
    }
}

/// Options of [`run_scenario`].
#[derive(Default)]
pub struct RunConfig {
    /// Record a trace here.
    pub trace_dir: Option<std::path::PathBuf>,
    pub cancel: CancellationToken,
    pub on_step: Option<crate::agent::OnStep>,
    /// The chunk cache; `None` is a fresh in-memory cache for this run.
    pub cache: Option<Box<dyn ChunkCache>>,
    /// Time a full re-prefill of the answering context too ([`RunOptions::baseline`]).
    pub baseline: bool,
}

/// Serves, launches Chromium, runs, closes. The chunk cache lives for this run only.
pub async fn run_scenario(scenario: &Scenario, llm: &Llm, home: &Path, cfg: RunConfig) -> Result<RunSummary> {
    let served = serve(scenario, home).await?;
    let mut browser = ChromiumBrowser::launch(ChromiumConfig::new(served.origins.clone())).await?;
    let mut policy = policy_for(scenario, &served.env.origin);
    let mut cache: Box<dyn ChunkCache> = cfg.cache.unwrap_or_else(|| Box::new(MemoryCache::default()));
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
    };
    let r = run_episode(
        &mut browser,
        policy.as_mut(),
        llm,
        cache.as_mut(),
        scenario,
        &served.env,
        opts,
    )
    .await;
    let _ = kamera_browser::Browser::close(&mut browser).await;
    r
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

/// Re-runs the agent on a trace's recorded observations, no browser, and compares the actions.
pub async fn replay(dir: &Path, llm: &Llm) -> Result<ReplayReport> {
    let trace = Trace::read(dir)?;
    let scenario = Scenario::parse(&trace.header.scenario, &dir.join("trace.ndjson"))?;
    let mut browser = ReplayBrowser::new(trace.observations()?);
    let mut policy = policy_for(&scenario, &trace.header.origin);
    let mut cache = MemoryCache::default();
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
    let summary = run_episode(&mut browser, policy.as_mut(), llm, &mut cache, &scenario_r, &env, opts).await?;
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
