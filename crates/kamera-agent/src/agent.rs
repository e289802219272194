//! The agent loop: observe -> the session meets the page's chunk (the scheduler's plan, executed)
//! -> recall by relevance before a question -> policy (model) -> action, with a trace line per
//! step. [`run_episode`] is the embedding API: the caller brings browser, policy and session.

use std::sync::Arc;
use std::time::Instant;

use crate::ms;

use kamera_browser::{Action, Browser, Observation};
use kamera_store::ChunkId;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::language_model::{LanguageModel, View};
use crate::llm::Llm;
use crate::policy::{Mind, NextAction, Planned, Policy};
use crate::runtime::pages::merge;
use crate::runtime::{Applied, ApplyTimings, ObservedPage, Session, SessionStats};
use crate::scenario::Scenario;
use crate::trace::{
    EndRecord, Header, Line, ObsRecord, StepRecord, StepResult, StepTimings, TRACE_VERSION, TraceWriter, sha256_hex,
};

/// Where a run happens: the served origin and the start URL.
#[derive(Debug, Clone)]
pub struct Env {
    /// Origin of the served site (resolves scripted `navigate = "/path"`).
    pub origin: String,
    /// Where the run starts; empty: on the page the browser is on.
    pub start_url: String,
}

/// A callback after every step (progress bars, UIs).
pub type OnStep = Box<dyn FnMut(&StepRecord) + Send>;

/// Optional parts of a run.
#[derive(Default)]
pub struct RunOptions {
    pub trace: Option<TraceWriter>,
    pub cancel: CancellationToken,
    /// Called after every step (progress bars, UIs).
    pub on_step: Option<OnStep>,
    /// For replays: the recorded end (reward and JS check come from it; there is no page).
    pub recorded_end: Option<EndRecord>,
    /// At the answering step, also time a full re-prefill of the window (the baseline that
    /// reuse replaces) and record it as `baseline_prefill_ms`.
    pub baseline: bool,
    /// The model the policy asks (default: the session's local model, [`Llm`]). A plugged model
    /// reads the window as text ([`crate::View::text`]); the session still places the pages.
    pub language_model: Option<Arc<dyn LanguageModel>>,
    /// The action cache ([`crate::ActionCache`]): steps seen before are replayed from it with
    /// no model call, and healed where the page changed.
    pub action_cache: Option<crate::cache::ActionCache>,
}

/// The outcome of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunSummary {
    pub scenario: String,
    pub steps: Vec<StepRecord>,
    pub end: EndRecord,
    pub expected: Option<String>,
    /// What the session did during this run.
    pub session: SessionStats,
    pub refused: usize,
    pub wall_ms: f64,
    /// Steps that called the model (a policy's decision, a question, a target re-inferred).
    #[serde(default)]
    pub model_calls: usize,
    /// Steps the action cache replayed as recorded, with no model call.
    #[serde(default)]
    pub cache_hits: usize,
    /// Steps whose cache entry no longer fit the page and was updated (self-heal).
    #[serde(default)]
    pub cache_healed: usize,
    /// What the action cache did, when the run kept one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::CacheStats>,
    /// The plan the policy wrote before the first page, and the call that wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Planned>,
}

impl RunSummary {
    /// Actions in order (what a replay compares).
    pub fn actions(&self) -> Vec<Action> {
        self.steps.iter().filter_map(|s| s.action.clone()).collect()
    }
}

/// What a run drives: the page, the decisions, the context (the builder API's [`crate::Agent`]
/// owns them; this borrows them for one run).
pub struct Parts<'a> {
    pub browser: &'a mut dyn Browser,
    pub policy: &'a mut dyn Policy,
    pub session: &'a mut Session,
}

/// The page text a chunk holds: title, path (origin stripped so chunks repeat across servers), text.
pub fn chunk_text(obs: &Observation, origin: &str) -> String {
    let path = obs.url.strip_prefix(origin).unwrap_or(&obs.url);
    format!("Page \"{}\" ({path}):\n{}\n\n", obs.title, obs.text)
}

/// Runs `scenario` once. Ends on a `done` action, the step budget, a fatal error or
/// cancellation. A refused navigation or a vanished element is recorded and the run goes on; a
/// fatal error (the browser died, the policy failed, cancellation) ends the run with the trace's
/// end line saying why and is returned as the `Err`.
pub async fn run_episode(agent: Parts<'_>, scenario: &Scenario, env: &Env, opts: RunOptions) -> Result<RunSummary> {
    let mut run = Run {
        replay: agent.browser.is_replay(),
        llm: Llm::new(agent.session.model().clone()),
        stats0: agent.session.stats().clone(),
        agent,
        scenario,
        env,
        opts,
        summary: RunSummary {
            scenario: scenario.name.clone(),
            expected: scenario.success.answer.clone(),
            ..Default::default()
        },
        answer: None,
        reward: None,
        blocked_seen: 0,
        t0: Instant::now(),
    };
    let r = run.drive().await;
    run.finish(r).await
}

struct Run<'a, 's> {
    agent: Parts<'a>,
    llm: Llm,
    scenario: &'s Scenario,
    env: &'s Env,
    opts: RunOptions,
    summary: RunSummary,
    answer: Option<String>,
    reward: Option<f64>,
    replay: bool,
    /// Blocked requests already written into a step.
    blocked_seen: usize,
    stats0: SessionStats,
    t0: Instant,
}

pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Run<'_, '_> {
    async fn drive(&mut self) -> Result<()> {
        self.start().await?;
        for step in 0..self.scenario.budget.steps {
            if self.opts.cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            let (record, fatal) = self.step(step).await?;
            if let Some(t) = self.opts.trace.as_mut() {
                t.write(&Line::Step(Box::new(record.clone())))?;
            }
            if let Some(f) = self.opts.on_step.as_mut() {
                f(&record);
            }
            self.summary.steps.push(record);
            if let Some(e) = fatal {
                return Err(e);
            }
            if self.answer.is_some() || self.reward.is_some() {
                break;
            }
        }
        Ok(())
    }

    /// The trace header, the pinned prefix (system turn + goal), the start page.
    async fn start(&mut self) -> Result<()> {
        let model = self.agent.session.model().fingerprint().to_string();
        if let Some(t) = self.opts.trace.as_mut() {
            t.write(&Line::Header(Header {
                version: TRACE_VERSION,
                scenario: self.scenario.to_toml(),
                origin: self.env.origin.clone(),
                model,
                started_unix_ms: now_ms(),
            }))?;
        }
        // A session that works several tasks keeps the prefix it pinned first (pages follow it);
        // each model call's instruction names the current goal.
        let prefix = self.llm.prefix_text(&self.scenario.goal);
        if self.agent.session.pinned_tokens() == 0 {
            let session = &mut *self.agent.session;
            blocking(|| session.pin(&prefix))?;
        }
        // The plan follows a prefix that names this goal, before any page (an app pins its
        // standing goal itself; a session's later tasks keep the first one's pins and plan none).
        if self.agent.session.holds_only_pinned(&prefix)? {
            self.plan()?;
        }
        // An empty start URL continues on the current page (a session's next task).
        if !self.replay && !self.env.start_url.is_empty() {
            self.agent.browser.navigate(&self.env.start_url).await?;
            if let Some(e) = self.scenario.episode.as_ref().filter(|e| !e.start_js.is_empty()) {
                self.agent.browser.eval(&e.start_js).await?;
            }
        }
        Ok(())
    }

    /// The policy's plan, when it writes one: pinned after the goal as a chunk of its own
    /// (before any page, as pins must be).
    fn plan(&mut self) -> Result<()> {
        let (planned, _) = self.with_mind(|policy, mind| policy.plan(mind));
        let Some(p) = planned? else {
            return Ok(());
        };
        let session = &mut *self.agent.session;
        blocking(|| session.pin(&p.text))?;
        tracing::info!(plan = %p.text.trim_end(), "planned");
        self.summary.plan = Some(p);
        Ok(())
    }

    /// Runs `f` with the policy and a [`Mind`] over the window as it stands (the plugged model or
    /// the local one, the action cache, the goal), on the blocking thread; also returns the
    /// milliseconds spent bringing the window's context up to date (a re-prefill without reuse).
    fn with_mind<T>(&mut self, f: impl FnOnce(&mut dyn Policy, &mut Mind<'_>) -> Result<T>) -> (Result<T>, f64) {
        let session = &mut *self.agent.session;
        let policy = &mut *self.agent.policy;
        let llm: &dyn LanguageModel = match &self.opts.language_model {
            Some(m) => m.as_ref(),
            None => &self.llm,
        };
        let (goal, max_new) = (&self.scenario.goal, self.scenario.budget.max_new_tokens);
        let cache = self.opts.action_cache.as_mut();
        let origin = &self.env.origin;
        let mut context_ms = 0.0;
        let r = blocking(|| {
            let text = crate::language_model::window_text(session)?;
            let mut mind = Mind {
                llm,
                view: View::new(session, &text),
                goal,
                max_new_tokens: max_new,
                cache,
                origin,
            };
            let r = f(policy, &mut mind);
            context_ms = mind.view.context_ms;
            r
        });
        (r, context_ms)
    }

    /// One step: observe, plan + execute, decide, act. `Err` before a record exists; a record
    /// and the fatal error it ended with otherwise.
    // Long: one agent step in order (observe, place, decide, act, record), sharing its timings and trace.
    async fn step(&mut self, step: usize) -> Result<(StepRecord, Option<Error>)> {
        let t_step = Instant::now();
        let before = self.agent.session.stats().clone();
        let mut timings = StepTimings::default();
        let t = Instant::now();
        let (obs, settled) = self.observe_while_settling().await;
        let obs = obs?;
        timings.observe_ms = ms(t);
        // The earlier steps' deferred work ran beside the browser; it is this step's record's.
        let settled = settled?;
        timings.encode_ms += settled.prefill_ms;
        timings.patch_ms += settled.patch_ms;
        // No screenshot taken (text observed, no trace): recorded as "".
        let shot = match self.opts.trace.as_ref() {
            Some(tw) => tw.resource(&obs.screenshot_png, "png")?,
            None if obs.screenshot_png.is_empty() => String::new(),
            None => sha256_hex(&obs.screenshot_png),
        };
        let text = chunk_text(&obs, &self.env.origin);
        let session = &mut *self.agent.session;
        let observe = self.scenario.observe;
        let (mut applied, page, image_chunk) = blocking(|| -> Result<(Applied, ObservedPage, Option<ChunkId>)> {
            // `both`: the screenshot's chunk after the text's, the text's first chunk names the step.
            let page = if observe.text() {
                Some(session.observe_page(&text)?)
            } else {
                None
            };
            let image = if observe.screenshot() {
                Some(session.observe_screenshot(&obs.screenshot_png)?.applied)
            } else {
                None
            };
            let image_chunk = image.as_ref().and_then(|a| a.chunk);
            Ok(match (page, image) {
                (Some(mut p), Some(i)) => {
                    let mut t = std::mem::take(&mut p.applied);
                    merge(&mut t, i);
                    (t, p, image_chunk)
                }
                (Some(mut p), None) => (std::mem::take(&mut p.applied), p, None),
                (None, Some(i)) => (i, ObservedPage::default(), None),
                (None, None) => unreachable!("observe reads text, a screenshot or both"),
            })
        })?;
        if let Some(focus) = self.agent.policy.focus() {
            let query = [self.scenario.goal.clone(), focus]
                .into_iter()
                .chain(self.agent.policy.memory())
                .collect::<Vec<_>>()
                .join("\n");
            let session = &mut *self.agent.session;
            // The current page keeps up to half the window; the rest goes by relevance.
            let recalled = blocking(|| {
                if page.chunks.is_empty() {
                    session.recall_relevant(&query)
                } else {
                    session.recall_relevant_page(&query, &page.chunks)
                }
            })?;
            merge(&mut applied, recalled);
        }
        timings.encode_ms += applied.timings.prefill_ms;
        timings.patch_ms += applied.timings.patch_ms;
        timings.reuse_ms = applied.timings.place_ms + applied.timings.sync_ms;
        let chunk = applied.chunk.ok_or_else(|| Error::Runtime {
            op: "observe",
            detail: "the session's visit named no chunk".into(),
        })?;
        let (decision, context_ms) = self.decide(step, &obs);
        // The held plans (or the rebuild that replaced them) ran when the policy read the model.
        let read = self.agent.session.take_read_timings();
        timings.encode_ms += read.prefill_ms;
        timings.patch_ms += read.patch_ms;
        timings.reuse_ms += (context_ms - read.prefill_ms - read.patch_ms).max(0.0);
        let work = self.agent.session.stats().since(&before);
        let mut record = StepRecord {
            step,
            observation: ObsRecord {
                url: obs.url.clone(),
                title: obs.title.clone(),
                text: obs.text.clone(),
                elements: obs.elements.clone(),
                screenshot: shot,
            },
            chunk,
            chunks: if page.chunks.len() > 1 {
                page.chunks.clone()
            } else {
                Vec::new()
            },
            image_chunk,
            chunk_tokens: if page.chunks.is_empty() {
                self.agent.session.chunk_tokens(&chunk).map_or(0, <[u32]>::len)
            } else {
                page.tokens
            },
            visit: applied.visit.unwrap_or(kamera_sched::Visit::Hit),
            why: applied.plan.decisions.iter().map(|d| d.to_string()).collect(),
            plan: applied.plan.steps,
            prefill_tokens: work.prefill_tokens,
            rebuilt: work.rebuilds > 0,
            model: None,
            action: None,
            result: StepResult::Ok,
            blocked: Vec::new(),
            downloads: Vec::new(),
            reward: None,
            timings,
        };
        let fatal = match decision {
            Err(e) => {
                record.result = StepResult::Failed { error: e.to_string() };
                Some(e)
            }
            Ok(d) => self.act(d, &mut record).await,
        };
        record.timings.total_ms = ms(t_step);
        let blocked = self.agent.browser.blocked();
        record.blocked = blocked.get(self.blocked_seen..).unwrap_or_default().to_vec();
        self.blocked_seen = blocked.len();
        let downloads = self.agent.browser.downloads();
        record.downloads = downloads
            .get(self.summary.end.downloads.len()..)
            .unwrap_or_default()
            .to_vec();
        self.summary.end.downloads.extend(record.downloads.iter().cloned());
        Ok((record, fatal))
    }

    /// The policy's decision over the window's live context, and the milliseconds bringing that
    /// context up to date took (a full re-prefill without reuse).
    fn decide(&mut self, step: usize, obs: &Observation) -> (Result<NextAction>, f64) {
        self.with_mind(|policy, mind| {
            // The last step's cache entry, checked against the page it led to: a replayed step
            // that did nothing is taken again, re-inferred.
            if let Some(c) = mind.cache.as_deref_mut()
                && c.observed(obs, mind.origin)?
            {
                policy.retry_last();
            }
            policy.next(step, obs, mind)
        })
    }

    /// Carries out a decision: `done` answers (and times the baseline when asked), anything else
    /// goes to the browser. Returns the error that ends the run, if any.
    async fn act(&mut self, d: NextAction, record: &mut StepRecord) -> Option<Error> {
        if let Some(m) = &d.model {
            record.timings.prefill_ms = m.timings.prefill_ms;
            record.timings.decode_ms = m.timings.decode_ms;
        }
        record.model = d.model;
        record.action = Some(d.action.clone());
        if let Action::Done { answer } = &d.action {
            self.answer = Some(answer.clone());
            if self.opts.baseline {
                let tokens = self.agent.session.window_tokens();
                let t = Instant::now();
                if let Err(e) = blocking(|| self.llm.full_prefill(&tokens)) {
                    record.result = StepResult::Failed { error: e.to_string() };
                    return Some(e);
                }
                record.timings.baseline_prefill_ms = Some(ms(t));
            }
            return None;
        }
        // A model's reply never names a field for a remembered value (only a scenario does).
        if let Action::Type { text, .. } = &d.action
            && record.model.is_some()
            && let Some(v) = self
                .agent
                .policy
                .memory()
                .into_iter()
                .find(|v| !v.is_empty() && text.contains(v))
        {
            tracing::warn!(
                step = record.step,
                "refused to type a remembered value the scenario named no field for"
            );
            self.summary.refused += 1;
            record.result = StepResult::Refused {
                detail: format!(
                    "type: the text holds the remembered value {v:?}, and no scenario step names this field"
                ),
            };
            return None;
        }
        let t = Instant::now();
        let r = self.agent.browser.act(&d.action).await;
        record.timings.act_ms = ms(t);
        match r {
            Ok(()) => {}
            Err(e @ kamera_browser::Error::Refused { .. }) => {
                self.summary.refused += 1;
                tracing::warn!(step = record.step, error = %e, "navigation refused");
                record.result = StepResult::Refused { detail: e.to_string() };
            }
            Err(e @ kamera_browser::Error::NoElement { .. }) => {
                record.result = StepResult::NoElement { detail: e.to_string() };
            }
            Err(e @ kamera_browser::Error::Target { .. }) => {
                tracing::info!(step = record.step, error = %e, "action target");
                record.result = StepResult::Target { detail: e.to_string() };
            }
            Err(e) => {
                record.result = StepResult::Failed { error: e.to_string() };
                return Some(e.into());
            }
        }
        if let Some(e) = self.scenario.episode.as_ref().filter(|_| !self.replay) {
            match self.agent.browser.eval(&e.reward_js).await {
                Ok(v) if v[0].as_bool() == Some(true) => {
                    self.reward = v[1].as_f64();
                    record.reward = self.reward;
                }
                Ok(_) => {}
                Err(e) => {
                    record.result = StepResult::Failed { error: e.to_string() };
                    return Some(e.into());
                }
            }
        }
        None
    }

    /// Observes the page while the session's deferred work (the plans' background steps, repairs)
    /// runs on a worker thread, stopped once the page is in where what is left may wait (patches
    /// formed from snapshots, [`Session::settle_until`]), so no step waits for it beyond the page
    /// and the background step under way; on a current-thread runtime the work runs first, then
    /// the observation.
    async fn observe_while_settling(&mut self) -> (Result<Observation>, Result<ApplyTimings>) {
        // The screenshot is taken where the session reads it or a trace keeps it; Chromium's
        // capture is most of an observation (~50 ms of ~60 on a 2-core host).
        let screenshot = self.scenario.observe.screenshot() || self.opts.trace.is_some();
        let browser = &mut *self.agent.browser;
        let observe = async move {
            if screenshot {
                browser.observe().await
            } else {
                browser.observe_text().await
            }
        };
        let session = &mut *self.agent.session;
        let multi = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if !multi {
            let settled = session.settle();
            return (observe.await.map_err(Error::from), settled);
        }
        let handle = tokio::runtime::Handle::current();
        let observed = std::sync::atomic::AtomicBool::new(false);
        tokio::task::block_in_place(|| {
            std::thread::scope(|s| {
                // The worker stops once the page is in, where what is left may wait.
                let worker = s.spawn(|| session.settle_until(&|| observed.load(std::sync::atomic::Ordering::Relaxed)));
                let obs = handle.block_on(observe).map_err(Error::from);
                observed.store(true, std::sync::atomic::Ordering::Relaxed);
                let settled = worker.join().unwrap_or_else(|_| {
                    Err(Error::Runtime {
                        op: "settle",
                        detail: "the deferred-work thread panicked".into(),
                    })
                });
                (obs, settled)
            })
        })
    }

    /// Judges the run, writes the end line, and returns the summary or the fatal error.
    async fn finish(mut self, r: Result<()>) -> Result<RunSummary> {
        if let Err(e) = self.agent.session.flush() {
            tracing::warn!(error = %e, "chunk store flush failed");
        }
        if self.replay
            && let Some(end) = &self.opts.recorded_end
        {
            self.reward = end.reward;
        }
        let js_check = match (&self.scenario.success.js, self.replay, r.is_ok()) {
            (None, ..) => None,
            (Some(_), true, _) => self.opts.recorded_end.as_ref().and_then(|e| e.js_check),
            (Some(js), false, true) => Some(self.agent.browser.eval(js).await.map(|v| truthy(&v)).unwrap_or(false)),
            (Some(_), false, false) => Some(false),
        };
        let mut checks = Vec::new();
        if let Some(exp) = &self.scenario.success.answer {
            let a = self.answer.clone().unwrap_or_default().trim().to_lowercase();
            let e = exp.trim().to_lowercase();
            checks.push(!a.is_empty() && (a == e || a.contains(&e)));
        }
        checks.extend(js_check);
        if let Some(min) = self.scenario.success.min_reward {
            checks.push(self.reward.is_some_and(|x| x > min));
        }
        let success = (!checks.is_empty()).then(|| r.is_ok() && checks.iter().all(|c| *c));
        // Every download the browser finished (one finishing after the last step included); a
        // replay has the recorded ones.
        let downloads = match (&self.opts.recorded_end, self.replay) {
            (Some(end), true) => end.downloads.clone(),
            _ => self.agent.browser.downloads(),
        };
        self.summary.end = EndRecord {
            steps: self.summary.steps.len(),
            answer: self.answer.clone(),
            success,
            js_check,
            reward: self.reward,
            error: r.as_ref().err().map(|e| e.to_string()),
            downloads,
        };
        if let Some(t) = self.opts.trace.as_mut() {
            t.write(&Line::End(self.summary.end.clone()))?;
        }
        self.summary.session = self.agent.session.stats().since(&self.stats0);
        self.summary.model_calls = self.summary.steps.iter().filter(|s| s.model.is_some()).count()
            + usize::from(self.summary.plan.as_ref().is_some_and(|p| p.model.is_some()));
        if let Some(c) = self.opts.action_cache.as_mut() {
            c.finish()?;
            let st = c.stats().clone();
            (self.summary.cache_hits, self.summary.cache_healed) = (st.hits, st.healed);
            self.summary.cache = Some(st);
        }
        self.summary.wall_ms = ms(self.t0);
        r.map(|()| self.summary)
    }
}

fn truthy(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null => false,
        serde_json::Value::Bool(b) => *b,
        serde_json::Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        serde_json::Value::String(s) => !s.is_empty(),
        _ => true,
    }
}
