//! The API an app embeds: [`Agent::builder`] builds an [`Agent`] that keeps its browser, model,
//! chunk store and context window across tasks; [`Agent::run`] works a task to a typed
//! [`History`], [`Agent::act`], [`Agent::perform`], [`Agent::navigate`], [`Agent::observe`],
//! [`Agent::extract`] and [`Agent::extract_json`] take one step (app/step.rs).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kamera_browser::{Action, Browser, BrowserOptions, ChromiumBrowser, ChromiumConfig, Origins};
use kamera_model::Model;
use kamera_store::ChunkStore;
use tokio_util::sync::CancellationToken;

use crate::agent::{Env, OnStep, Parts, RunOptions, RunSummary, run_episode};
use crate::assemble::{
    BasisSource, CalibrationSource, ModelSource, RuntimeConfig, StoreSource, load_model, open_runtime,
};
use crate::error::{Error, Result};
use crate::language_model::LanguageModel;
use crate::llm::Llm;
use crate::policy::{Decoding, ModelPolicy, Policy};
use crate::runtime::Session;
use crate::scenario::{Budget, Observe, PolicyKind, Scenario, Success};
use crate::trace::StepRecord;

mod step;

/// What a run did, step by step (observation, plan, model call, action, result, timings) and how
/// it ended (answer, success, error). Serialises to the trace's JSON.
pub type History = RunSummary;

type SharedOnStep = Arc<Mutex<OnStep>>;

/// Builds an [`Agent`]; only the model is required to come from somewhere (the embedded default
/// model is fetched when none is given).
#[derive(Default)]
pub struct AgentBuilder {
    task: Option<String>,
    start_url: Option<String>,
    origins: Vec<String>,
    /// Model, calibration, patch basis, store, backend: what [`open_runtime`] assembles.
    runtime: RuntimeConfig,
    browser: Option<Box<dyn Browser>>,
    policy: Option<Box<dyn Policy>>,
    language_model: Option<Arc<dyn LanguageModel>>,
    decoding: Decoding,
    observe: Observe,
    budget: Option<Budget>,
    deadline: Option<Duration>,
    cancel: Option<CancellationToken>,
    on_step: Option<OnStep>,
    action_cache: Option<PathBuf>,
    browser_options: BrowserOptions,
}

impl AgentBuilder {
    /// Where the Chromium the agent launches keeps its state ([`BrowserOptions`]: a profile kept
    /// between runs, a storageState file); ignored with [`AgentBuilder::browser`].
    pub fn browser_options(mut self, options: BrowserOptions) -> Self {
        self.browser_options = options;
        self
    }

    /// Keeps an action cache in `dir` ([`crate::ActionCache`]): a step taken before on the same
    /// page is replayed with no model call, and healed (re-found by its target's features, or
    /// re-inferred by one model call) where the page changed. Opened, and every entry checked, at
    /// each run; a corrupt entry or one of another version fails the run, naming the file.
    pub fn action_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.action_cache = Some(dir.into());
        self
    }
    /// What the agent is asked to achieve (shown to the model; [`Agent::run`] works it).
    pub fn task(mut self, task: impl Into<String>) -> Self {
        self.task = Some(task.into());
        self
    }
    /// The page the first run starts on; its origin is allowed.
    pub fn start_url(mut self, url: impl Into<String>) -> Self {
        self.start_url = Some(url.into());
        self
    }
    /// Another origin navigations may reach (anything else is refused).
    pub fn allow_origin(mut self, origin: impl Into<String>) -> Self {
        self.origins.push(origin.into());
        self
    }
    /// A loaded model (shared: several agents may hold it).
    pub fn model(mut self, model: Arc<Model>) -> Self {
        self.runtime.model = ModelSource::Loaded(model);
        self
    }
    /// How a model this builder loads multiplies prefills of 8+ tokens by its quantized
    /// weights (default: the fastest this CPU runs, bf16 on AVX512_BF16 CPUs; a model given by
    /// [`AgentBuilder::model`] keeps its own).
    pub fn prefill_precision(mut self, p: kamera_model::PrefillPrecision) -> Self {
        self.runtime.precision = Some(p);
        self
    }
    /// A GGUF file to load as the model.
    pub fn model_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.runtime.model = ModelSource::Path(path.into());
        self
    }
    /// The chunk store for canonical KV and patches (default: in memory, this agent only).
    pub fn store(mut self, store: Arc<dyn ChunkStore>) -> Self {
        self.runtime.store = StoreSource::Given(store);
        self
    }
    /// The whole runtime configuration (model, calibration, patch basis, store, backend), as
    /// `kamera run` builds it; the builder's other runtime setters change it further, and a
    /// budget given to the builder replaces its `budget`.
    pub fn runtime(mut self, cfg: RuntimeConfig) -> Self {
        self.runtime = cfg;
        self
    }
    /// Where the cost model's machine rates come from (default: `kamera calibrate`'s file for
    /// the model, when there is one).
    pub fn calibration(mut self, source: CalibrationSource) -> Self {
        self.runtime.calibration = source;
        self
    }
    /// The model's patch basis for transform-coded patches (default: the installed one, if any).
    pub fn patch_basis(mut self, source: BasisSource) -> Self {
        self.runtime.basis = source;
        self
    }
    /// `false`: the no-reuse baseline, every model call re-prefills the window (default: true).
    pub fn reuse(mut self, reuse: bool) -> Self {
        self.runtime.reuse = reuse;
        self
    }
    /// The browser to drive (default: headless Chromium, launched at first use).
    pub fn browser(mut self, browser: impl Browser + 'static) -> Self {
        self.browser = Some(Box::new(browser));
        self
    }
    /// The policy that picks actions (default: the model policy).
    pub fn policy(mut self, policy: impl Policy + 'static) -> Self {
        self.policy = Some(Box::new(policy));
        self
    }
    /// The model the policy asks instead of the local one (a remote model, say). The local
    /// model still runs the session (pages are placed, reused and recalled as KV), but the
    /// plugged model reads the window as text, so it gets none of that reuse; see the README.
    pub fn language_model(mut self, lm: impl LanguageModel + 'static) -> Self {
        self.language_model = Some(Arc::new(lm));
        self
    }
    /// How the default model policy decodes (default: ranked, always a valid action).
    pub fn decoding(mut self, decoding: Decoding) -> Self {
        self.decoding = decoding;
        self
    }
    /// What of each page the session reads: its text (default), its screenshot as an image
    /// chunk (needs a Qwen2.5-VL model directory), or both.
    pub fn observe(mut self, observe: Observe) -> Self {
        self.observe = observe;
        self
    }
    /// Step and context budgets (default: [`Budget::default`]).
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = Some(budget);
        self
    }
    /// Most actions per run.
    pub fn max_steps(mut self, steps: usize) -> Self {
        self.budget.get_or_insert_with(Budget::default).steps = steps;
        self
    }
    /// Each run ends with [`Error::Deadline`] after this long (checked between steps).
    pub fn deadline(mut self, limit: Duration) -> Self {
        self.deadline = Some(limit);
        self
    }
    /// Cancelling this token ends a run with [`Error::Cancelled`] (checked between steps).
    pub fn cancel_token(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }
    /// Called after every step of every run (progress, UIs).
    pub fn on_step(mut self, f: impl FnMut(&StepRecord) + Send + 'static) -> Self {
        self.on_step = Some(Box::new(f));
        self
    }

    /// The agent. Opens the runtime ([`open_runtime`]: the model from `model_path`, else the
    /// embedded default, fetched once; the calibration, patch points and basis for it; the
    /// store); fails with [`Error::Build`] on a bad URL, no origin to allow, or a budget too
    /// small.
    pub fn build(self) -> Result<Agent> {
        let bad = |detail: String| Error::Build { detail };
        let budget = self.budget.unwrap_or_else(|| self.runtime.budget.clone());
        if budget.steps == 0 || budget.window_tokens < 64 {
            return Err(bad(format!(
                "budget: steps must be > 0 and window_tokens >= 64 (got {} and {})",
                budget.steps, budget.window_tokens
            )));
        }
        let mut allowed = self.origins.clone();
        allowed.extend(self.start_url.clone());
        if allowed.is_empty() && self.browser.is_none() {
            return Err(bad(
                "give a start_url or allow_origin: Chromium may visit nothing else".into()
            ));
        }
        let origins = Origins::new(&allowed).map_err(|e| bad(e.to_string()))?;
        let task = self.task.unwrap_or_default();
        let origin = self.start_url.as_deref().map(origin_of).unwrap_or_default();
        let scenario = Scenario {
            name: "agent".into(),
            goal: task,
            start: self.start_url.clone().unwrap_or_default(),
            allowed_origins: Vec::new(),
            policy: PolicyKind::Model,
            decoding: self.decoding,
            observe: self.observe,
            site: None,
            episode: None,
            budget,
            uploads: None,
            steps: Vec::new(),
            success: Success::default(),
        };
        let session = open_runtime(RuntimeConfig {
            budget: scenario.budget.clone(),
            ..self.runtime
        })?;
        let agent = Agent {
            llm: Llm::new(session.model().clone()),
            lm: self.language_model,
            session,
            scenario,
            browser: self.browser,
            origins,
            policy: self.policy.unwrap_or_else(|| Box::new(ModelPolicy::new(self.decoding))),
            env: Env {
                origin,
                start_url: self.start_url.unwrap_or_default(),
            },
            deadline: self.deadline,
            cancel: self.cancel.unwrap_or_default(),
            on_step: self.on_step.map(|f| Arc::new(Mutex::new(f))),
            action_cache: self.action_cache,
            browser_options: self.browser_options,
        };
        Ok(agent)
    }
}

/// Fetches (once, cached under `home`) and loads the embedded default model,
/// SmolLM2-135M-Instruct, with the fastest prefill precision this CPU runs: what
/// [`AgentBuilder::build`] loads when given no model.
pub fn default_model(home: &std::path::Path) -> Result<Arc<Model>> {
    load_model(&ModelSource::Default, None, home)
}

fn origin_of(url: &str) -> String {
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let scheme = url.split("://").next().unwrap_or("");
    format!("{scheme}://{host}")
}

/// A web agent that keeps its browser, model, chunk store and context window across tasks: a
/// page seen by an earlier task is recalled from the store, not prefilled again.
///
/// ```no_run
/// # async fn demo() -> kamera_agent::Result<()> {
/// use kamera_agent::Agent;
/// let mut agent = Agent::builder()
///     .task("Find the shipping status of order A-1042")
///     .start_url("http://127.0.0.1:8080/")
///     .max_steps(8)
///     .deadline(std::time::Duration::from_secs(120))
///     .build()?;
/// let history = agent.run().await?;
/// println!("{:?} after {} steps", history.end.answer, history.steps.len());
/// agent.close().await
/// # }
/// ```
pub struct Agent {
    llm: Llm,
    /// A plugged model; `None`: `llm`.
    lm: Option<Arc<dyn LanguageModel>>,
    session: Session,
    scenario: Scenario,
    browser: Option<Box<dyn Browser>>,
    origins: Origins,
    policy: Box<dyn Policy>,
    env: Env,
    deadline: Option<Duration>,
    cancel: CancellationToken,
    on_step: Option<SharedOnStep>,
    action_cache: Option<PathBuf>,
    browser_options: BrowserOptions,
}

impl Agent {
    /// Starts building an agent.
    pub fn builder() -> AgentBuilder {
        AgentBuilder::default()
    }

    /// The session (window, store, statistics).
    pub fn session(&self) -> &Session {
        &self.session
    }

    pub(crate) async fn browser(&mut self) -> Result<&mut Box<dyn Browser>> {
        if self.browser.is_none() {
            let mut cfg = ChromiumConfig::new(self.origins.clone());
            cfg.options = self.browser_options.clone();
            let b = ChromiumBrowser::launch(cfg).await?;
            self.browser = Some(Box::new(b));
        }
        self.browser.as_mut().ok_or(Error::Runtime {
            op: "Agent::browser",
            detail: "no browser".into(),
        })
    }

    /// Works the task given to the builder; the first run starts at `start_url`, later ones go on
    /// from the current page.
    pub async fn run(&mut self) -> Result<History> {
        if self.scenario.goal.trim().is_empty() {
            return Err(Error::Build {
                detail: "no task: call AgentBuilder::task or Agent::run_task".into(),
            });
        }
        let policy = std::mem::replace(&mut self.policy, Box::new(ModelPolicy::default()));
        let r = self.episode(policy, None).await;
        self.policy = r.1;
        r.0
    }

    /// Works `task` next, in the same session (browser, context window and store kept).
    pub async fn run_task(&mut self, task: impl Into<String>) -> Result<History> {
        self.scenario.goal = task.into();
        self.run().await
    }

    /// One model step toward `instruction` (observe, decide, act): the action taken.
    pub async fn act(&mut self, instruction: &str) -> Result<Action> {
        let policy: Box<dyn Policy> = Box::new(ModelPolicy::new(self.scenario.decoding));
        let h = self.episode(policy, Some((instruction, 1))).await.0?;
        let step = h.steps.last().ok_or(Error::Runtime {
            op: "Agent::act",
            detail: "no step was taken".into(),
        })?;
        if let crate::trace::StepResult::NoElement { detail } | crate::trace::StepResult::Target { detail } =
            &step.result
        {
            return Err(Error::Step {
                step: 1,
                detail: detail.clone(),
            });
        }
        step.action.clone().ok_or(Error::Runtime {
            op: "Agent::act",
            detail: "the step chose no action".into(),
        })
    }

    /// The goal of the session's pinned prefix: the builder's task, or a neutral one.
    pub(crate) fn standing_goal(&self) -> &str {
        match self.scenario.goal.trim() {
            "" => "the user's requests, one at a time",
            g => g,
        }
    }

    /// Navigates to `start_url` the first time anything runs.
    pub(crate) async fn start(&mut self) -> Result<()> {
        if self.env.start_url.is_empty() {
            self.browser().await?;
            return Ok(());
        }
        let url = std::mem::take(&mut self.env.start_url);
        self.browser().await?.navigate(&url).await?;
        Ok(())
    }

    /// One run of `policy` (with `goal` and a step budget instead of the task's, for `act`);
    /// gives the policy back.
    pub(crate) async fn episode(
        &mut self,
        mut policy: Box<dyn Policy>,
        goal: Option<(&str, usize)>,
    ) -> (Result<History>, Box<dyn Policy>) {
        let mut scenario = self.scenario.clone();
        if let Some((g, steps)) = goal {
            scenario.goal = g.to_string();
            scenario.budget.steps = steps;
        }
        if let Err(e) = self.browser().await {
            return (Err(e), policy);
        }
        let action_cache = match self
            .action_cache
            .as_ref()
            .map(crate::cache::ActionCache::open)
            .transpose()
        {
            Ok(c) => c,
            Err(e) => return (Err(e), policy),
        };
        if self.session.pinned_tokens() == 0 {
            let prefix = self.llm.prefix_text(self.standing_goal());
            let session = &mut self.session;
            if let Err(e) = crate::agent::blocking(|| session.pin(&prefix)) {
                return (Err(e), policy);
            }
        }
        let cancel = self.cancel.child_token();
        let timer = self.deadline.map(|d| {
            let c = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                c.cancel();
            })
        });
        let on_step = self.on_step.clone().map(|f| -> OnStep {
            Box::new(move |s: &StepRecord| {
                if let Ok(mut f) = f.lock() {
                    f(s)
                }
            })
        });
        let opts = RunOptions {
            cancel: cancel.clone(),
            on_step,
            language_model: self.lm.clone(),
            action_cache,
            ..Default::default()
        };
        let t0 = Instant::now();
        let env = self.env.clone();
        let Some(browser) = self.browser.as_mut() else {
            return (
                Err(Error::Runtime {
                    op: "Agent::run",
                    detail: "no browser".into(),
                }),
                policy,
            );
        };
        let parts = Parts {
            browser: browser.as_mut(),
            policy: policy.as_mut(),
            session: &mut self.session,
        };
        let r = run_episode(parts, &scenario, &env, opts).await;
        // Later runs go on from the page this one left.
        self.env.start_url.clear();
        if let Some(t) = timer {
            t.abort();
        }
        let r = match r {
            Err(Error::Cancelled) if self.deadline.is_some() && !self.cancel.is_cancelled() => Err(Error::Deadline {
                after_ms: t0.elapsed().as_millis() as u64,
            }),
            r => r,
        };
        (r, policy)
    }

    /// Shuts the browser down.
    pub async fn close(mut self) -> Result<()> {
        if let Some(b) = self.browser.as_mut() {
            b.close().await?;
        }
        Ok(())
    }
}
