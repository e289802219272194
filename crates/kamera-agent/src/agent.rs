//! The agent loop: observe -> chunk -> window plan -> policy (model) -> action, with a trace line
//! per step. [`run_episode`] is the embedding API: the caller brings the browser, policy, model
//! and chunk cache.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use kamera_browser::{Action, Browser, Observation};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cache::{ChunkCache, Op, Window, chunk_id};
use crate::error::{Error, Result};
use crate::llm::{Llm, Part};
use crate::miniwob;
use crate::policy::{Mind, Policy};
use crate::scenario::Scenario;
use crate::trace::{
    EndRecord, Header, Line, ObsRecord, StepRecord, StepTimings, TRACE_VERSION, TraceWriter, sha256_hex,
};

/// Where a run happens: the served origin and the start URL.
#[derive(Debug, Clone)]
pub struct Env {
    /// Origin of the served site (resolves scripted `navigate = "/path"`).
    pub origin: String,
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
    /// At the answering step, also time a full re-prefill of the context (the baseline that
    /// relocation replaces) and record it as `baseline_prefill_ms`.
    pub baseline: bool,
}

/// Counts of what the window did over a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheStats {
    pub hits: usize,
    pub relocates: usize,
    pub recalls: usize,
    pub misses: usize,
    pub evicts: usize,
    /// Page tokens placed without prefill (hits, relocations, recalls).
    pub tokens_reused: usize,
    /// Page tokens prefilled.
    pub tokens_prefilled: usize,
    /// Conditioning patches formed (on recall) and placements that applied one.
    pub patches_formed: usize,
    pub patched_placements: usize,
}

/// The outcome of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunSummary {
    pub scenario: String,
    pub steps: Vec<StepRecord>,
    pub end: EndRecord,
    pub expected: Option<String>,
    pub cache: CacheStats,
    pub refused: usize,
    pub wall_ms: f64,
}

impl RunSummary {
    /// Actions in order (what a replay compares).
    pub fn actions(&self) -> Vec<Action> {
        self.steps.iter().filter_map(|s| s.action.clone()).collect()
    }
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The page text a chunk holds: title, path (origin stripped so chunks repeat across servers), text.
pub fn chunk_text(obs: &Observation, origin: &str) -> String {
    let path = obs.url.strip_prefix(origin).unwrap_or(&obs.url);
    format!("Page \"{}\" ({path}):\n{}\n\n", obs.title, obs.text)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs `scenario` once: `browser` drives the page, `policy` picks actions, `llm` answers over
/// chunks from `cache`. Ends on a `done` action, the step budget, a fatal browser error or
/// cancellation; browser errors end the run cleanly with the error in the trace and the summary.
pub async fn run_episode(
    browser: &mut dyn Browser,
    policy: &mut dyn Policy,
    llm: &Llm,
    cache: &mut dyn ChunkCache,
    scenario: &Scenario,
    env: &Env,
    mut opts: RunOptions,
) -> Result<RunSummary> {
    let t_run = Instant::now();
    let replay = browser.is_replay();
    let fingerprint = llm.model().fingerprint().to_string();
    if let Some(t) = opts.trace.as_mut() {
        t.write(&Line::Header(Header {
            version: TRACE_VERSION,
            scenario: scenario.to_toml(),
            origin: env.origin.clone(),
            model: fingerprint.clone(),
            started_unix_ms: now_ms(),
        }))?;
    }
    let mut summary = RunSummary {
        scenario: scenario.name.clone(),
        expected: scenario.success.answer.clone(),
        ..Default::default()
    };

    // The fixed prefix chunk (system turn + goal), cached like any page.
    let prefix_text = llm.prefix_text(&scenario.goal);
    let prefix_id = chunk_id(&fingerprint, &prefix_text, "");
    let prefix_tokens = llm.tokens(&prefix_text, true)?;
    let prefix = match cache.get(&prefix_id) {
        Some(c) => c,
        None => {
            let t = Instant::now();
            let c = Arc::new(blocking(|| llm.canonical(&prefix_tokens))?);
            cache.put(&prefix_id, c.clone(), t.elapsed().as_micros() as u64);
            c
        }
    };
    let mut window = Window::new(scenario.budget.window_tokens, prefix.n_tokens());
    // Conditioning patches by (chunk, its antecedents in the window).
    let mut patches: HashMap<(String, String), Arc<kamera_ops::Patch>> = HashMap::new();
    let mut chunk_tokens: HashMap<String, Vec<u32>> = HashMap::new();
    let antecedents = |ids: &[String]| blake3::hash(ids.join(",").as_bytes()).to_hex().to_string();

    let mut fatal: Option<String> = None;
    if !replay {
        if let Err(e) = browser.navigate(&env.start_url).await {
            fatal = Some(e.to_string());
        } else if let Some(mw) = &scenario.miniwob
            && let Err(e) = browser.eval(&miniwob::start_js(mw.seed, mw.episode_ms)).await
        {
            fatal = Some(e.to_string());
        }
    }

    let mut answer = None;
    let mut reward = None;
    let mut step = 0;
    while fatal.is_none() && step < scenario.budget.steps {
        if opts.cancel.is_cancelled() {
            fatal = Some(Error::Cancelled.to_string());
            break;
        }
        let t_step = Instant::now();
        let mut timings = StepTimings::default();
        let t = Instant::now();
        let obs = match browser.observe().await {
            Ok(o) => o,
            Err(e) => {
                fatal = Some(e.to_string());
                break;
            }
        };
        timings.observe_ms = ms(t);
        let shot = match opts.trace.as_ref() {
            Some(tw) => tw.resource(&obs.screenshot_png, "png")?,
            None => sha256_hex(&obs.screenshot_png),
        };
        let text = chunk_text(&obs, &env.origin);
        let id = chunk_id(&fingerprint, &text, &shot);
        let tokens = llm.tokens(&text, false)?;
        let cached = cache.get(&id).is_some();
        if !cached {
            let t = Instant::now();
            let kv = blocking(|| llm.canonical(&tokens))?;
            cache.put(&id, Arc::new(kv), t.elapsed().as_micros() as u64);
            timings.encode_ms = ms(t);
        }
        chunk_tokens.insert(id.clone(), tokens.clone());
        let plan = window.observe(&id, tokens.len(), cached);
        for p in &plan {
            let s = &mut summary.cache;
            match p.op {
                Op::Hit => s.hits += 1,
                Op::Relocate => s.relocates += 1,
                Op::Recall => s.recalls += 1,
                Op::Miss => s.misses += 1,
                Op::Evict => s.evicts += 1,
            }
            match p.op {
                Op::Hit | Op::Relocate | Op::Recall => s.tokens_reused += p.tokens,
                Op::Miss => s.tokens_prefilled += p.tokens,
                Op::Evict => {}
            }
        }
        let mut plan = plan;
        let ids = window.chunks();
        let mut chunks = vec![Part {
            kv: prefix.clone(),
            patch: None,
        }];
        for (i, cid) in ids.iter().enumerate() {
            let kv = cache.get(cid).ok_or_else(|| Error::Step {
                step,
                detail: format!("chunk {cid} left the cache while in the window"),
            })?;
            let key = (cid.clone(), antecedents(&ids[..i]));
            let recalled = plan.iter().any(|p| p.chunk == *cid && p.op == Op::Recall);
            if recalled && scenario.budget.patch_rank > 0 && !patches.contains_key(&key) && *cid == id {
                // Recall: a patch conditioned on the chunk's fixed earlier context, formed once
                // (or found in the store from an earlier run).
                let mut ante = vec![prefix_id.clone()];
                ante.extend(ids[..i].iter().cloned());
                if let Some(p) = cache.get_patch(cid, &ante) {
                    patches.insert(key.clone(), p);
                } else {
                    let t = Instant::now();
                    let mut parts = chunks.clone();
                    parts.push(Part {
                        kv: kv.clone(),
                        patch: None,
                    });
                    let p = Arc::new(blocking(|| {
                        llm.form_patch(&parts, &tokens, scenario.budget.patch_rank)
                    })?);
                    cache.put_patch(cid, &ante, p.clone(), t.elapsed().as_micros() as u64);
                    patches.insert(key.clone(), p);
                    timings.patch_ms += ms(t);
                    summary.cache.patches_formed += 1;
                }
            }
            let patch = patches.get(&key).cloned();
            if patch.is_some() {
                summary.cache.patched_placements += 1;
                if let Some(p) = plan.iter_mut().find(|p| p.chunk == *cid && p.op != Op::Evict) {
                    p.patch = true;
                }
            }
            chunks.push(Part { kv, patch });
        }
        let mut mind = Mind {
            llm,
            chunks,
            goal: &scenario.goal,
            max_new_tokens: scenario.budget.max_new_tokens,
        };
        let decision = blocking(|| policy.next(step, &obs, &mut mind));
        let mut record = StepRecord {
            step,
            observation: ObsRecord {
                url: obs.url.clone(),
                title: obs.title.clone(),
                text: obs.text.clone(),
                elements: obs.elements.clone(),
                screenshot: shot,
            },
            chunk: id,
            chunk_tokens: tokens.len(),
            plan,
            model: None,
            action: None,
            result: "ok".into(),
            reward: None,
            timings,
        };
        match decision {
            Err(e) => {
                record.result = e.to_string();
                fatal = Some(e.to_string());
            }
            Ok(d) => {
                if let Some(m) = &d.model {
                    record.timings.reuse_ms = m.timings.reuse_ms;
                    record.timings.prefill_ms = m.timings.prefill_ms;
                    record.timings.decode_ms = m.timings.decode_ms;
                }
                record.model = d.model;
                record.action = Some(d.action.clone());
                if let Action::Done { answer: a } = &d.action {
                    answer = Some(a.clone());
                    if opts.baseline {
                        let mut all = prefix_tokens.clone();
                        for cid in &ids {
                            all.extend(chunk_tokens.get(cid).cloned().unwrap_or_default());
                        }
                        let t = Instant::now();
                        blocking(|| llm.canonical(&all))?;
                        record.timings.baseline_prefill_ms = Some(ms(t));
                    }
                } else {
                    let t = Instant::now();
                    let r = browser.act(&d.action).await;
                    record.timings.act_ms = ms(t);
                    match r {
                        Ok(()) => {}
                        Err(e @ kamera_browser::Error::Refused { .. }) => {
                            summary.refused += 1;
                            record.result = e.to_string();
                            tracing::warn!(step, error = %e, "navigation refused");
                        }
                        Err(e @ kamera_browser::Error::NoElement { .. }) => record.result = e.to_string(),
                        Err(e) => {
                            record.result = e.to_string();
                            fatal = Some(e.to_string());
                        }
                    }
                    if scenario.miniwob.is_some() && !replay && fatal.is_none() {
                        match browser.eval(miniwob::REWARD_JS).await {
                            Ok(v) => {
                                if v[0].as_bool() == Some(true) {
                                    reward = v[1].as_f64();
                                    record.reward = reward;
                                }
                            }
                            Err(e) => fatal = Some(e.to_string()),
                        }
                    }
                }
            }
        }
        record.timings.total_ms = ms(t_step);
        if let Some(t) = opts.trace.as_mut() {
            t.write(&Line::Step(Box::new(record.clone())))?;
        }
        if let Some(f) = opts.on_step.as_mut() {
            f(&record);
        }
        summary.steps.push(record);
        step += 1;
        if answer.is_some() || reward.is_some() {
            break;
        }
    }
    cache.flush();
    if replay && let Some(r) = &opts.recorded_end {
        reward = r.reward;
    }

    // Judge.
    let mut js_check = None;
    if let Some(js) = &scenario.success.js {
        js_check = if replay {
            opts.recorded_end.as_ref().and_then(|r| r.js_check)
        } else {
            Some(browser.eval(js).await.map(|v| truthy(&v)).unwrap_or(false))
        };
    }
    let mut checks = Vec::new();
    if let Some(exp) = &scenario.success.answer {
        let a = answer.clone().unwrap_or_default().trim().to_lowercase();
        let e = exp.trim().to_lowercase();
        checks.push(!a.is_empty() && (a == e || a.contains(&e)));
    }
    if let Some(j) = js_check {
        checks.push(j);
    }
    if let Some(min) = scenario.success.min_reward {
        checks.push(reward.is_some_and(|r| r > min));
    }
    let success = if checks.is_empty() {
        None
    } else {
        Some(fatal.is_none() && checks.iter().all(|c| *c))
    };
    summary.end = EndRecord {
        steps: summary.steps.len(),
        answer,
        success,
        js_check,
        reward,
        error: fatal,
    };
    if let Some(t) = opts.trace.as_mut() {
        t.write(&Line::End(summary.end.clone()))?;
    }
    summary.wall_ms = ms(t_run);
    Ok(summary)
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
