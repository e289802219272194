//! `kamera bench agent`: the model policy's success over MiniWoB++ tasks x seeds x models x
//! decodings, plus the order-status flow, on real Chromium, beside trivial baselines on the same
//! tasks and seeds (bench_agent_baseline.rs); a markdown table on stdout, every episode in JSON
//! (`--json`), progress on stderr.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use clap::Args;
use kamera_agent::{
    ActionCache, Budget, Decoding, Env, ModelPolicy, Parts, PolicyKind, RunOptions, RunSummary, Scenario, SiteSpec,
    Success, run_episode,
};
use kamera_browser::{Browser, ChromiumBrowser, ChromiumConfig, Content, Origins, Server};
use kamera_harness::miniwob::{self, MiniWobSpec};
use kamera_harness::session_for;
use kamera_model::Model;
use serde::{Deserialize, Serialize};

use crate::bench_agent_report::{Report, markdown};

/// The MiniWoB++ tasks of the default run: every one can be done with the action set from the
/// page text (no canvas or pixel reading).
pub const TASKS: [&str; 24] = [
    "click-test",
    "click-test-2",
    "click-button",
    "click-button-sequence",
    "click-link",
    "click-option",
    "click-checkboxes",
    "click-dialog",
    "click-dialog-2",
    "click-tab",
    "click-collapsible",
    "click-widget",
    "choose-list",
    "enter-text",
    "enter-text-2",
    "enter-password",
    "focus-text",
    "focus-text-2",
    "login-user",
    "navigate-tree",
    "use-autocomplete",
    "simple-arithmetic",
    "grid-coordinate",
    "identify-shape",
];

/// The local site's flow: find an order's shipping status and answer it.
pub const ORDER_STATUS: &str = "order-status";

#[derive(Args, Clone)]
pub struct AgentArgs {
    /// Tasks: MiniWoB++ task names and/or `order-status` (default: the 24 listed in the README
    /// and order-status).
    #[arg(long, value_delimiter = ',')]
    pub tasks: Vec<String>,
    /// Seeds per task (1..=N): the MiniWoB++ episode seed, or the local site's seed.
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// Most actions per MiniWoB++ episode.
    #[arg(long, default_value_t = 6)]
    pub max_steps: usize,
    /// Most actions per order-status episode: twice the 5 the script takes (orders, order,
    /// shipment, status, done), as the model may go round the site's menu first.
    #[arg(long, default_value_t = 10)]
    pub flow_steps: usize,
    /// Models: built-in names, names added with `kamera models add` or .gguf paths.
    #[arg(long, value_delimiter = ',', default_values_t = ["smollm2-135m".to_string(), "qwen2.5-0.5b".to_string(), "gemma3-270m".to_string()])]
    pub models: Vec<String>,
    /// How the model policy decodes its action: constrained, ranked, restricted, free.
    #[arg(long, value_delimiter = ',', default_values_t = ["constrained".to_string(), "ranked".to_string()])]
    pub decodings: Vec<String>,
    /// MiniWoB++ episode time limit (its reward decays linearly over it).
    #[arg(long, default_value_t = 120_000)]
    pub episode_ms: u64,
    /// Trivial policies scored on the same tasks and seeds beside the models: `first-element`
    /// (clicks element [1] every step) and `random-valid` (a seeded random valid action of the
    /// page); `none` for neither. They run over a session of the first of --models.
    #[arg(long, value_delimiter = ',', default_values_t = ["first-element".to_string(), "random-valid".to_string()])]
    pub baselines: Vec<String>,
    /// Run the baselines alone (no model policy).
    #[arg(long)]
    pub baselines_only: bool,
    /// Also write every episode and the table's rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// An action cache directory every model episode shares (`kamera run --action-cache`): a
    /// step seen before replays its recorded action with no model call, healed where the page
    /// changed.
    #[arg(long)]
    pub action_cache: Option<PathBuf>,
    /// Passes over the model episodes with the same `--action-cache` (rows labelled `pass N`):
    /// the second pass shows what the cache saves (model calls, wall time) at what success.
    #[arg(long, default_value_t = 1)]
    pub passes: usize,
    /// Whether the model policy writes a plan before the first page: `on`, `off`, or both
    /// (`on,off`: each model and decoding once with and once without, rows labelled `no plan`).
    #[arg(long, value_delimiter = ',', default_values_t = ["on".to_string()])]
    pub plan: Vec<String>,
}

/// `--plan`'s values as booleans.
fn plans(a: &AgentArgs) -> Result<Vec<bool>> {
    a.plan
        .iter()
        .map(|p| match p.as_str() {
            "on" => Ok(true),
            "off" => Ok(false),
            other => bail!("--plan: {other:?} is neither on nor off"),
        })
        .collect()
}

/// Who acts in a group of episodes: the model policy with a decoding, or a baseline.
#[derive(Debug, Clone, PartialEq)]
pub enum Actor {
    Model {
        name: String,
        decoding: Decoding,
        plan: bool,
    },
    Baseline(String),
}

/// A row group of the report: its (model, decoding) labels and who acts.
#[derive(Debug, Clone)]
pub struct Group {
    pub model: String,
    pub decoding: String,
    pub actor: Actor,
    /// The pass over the grid (1 unless `--passes`).
    pub pass: usize,
}

/// The groups `a` asks for, in run order: every model x decoding (unless --baselines-only),
/// then each baseline (labelled model `baseline`, decoding its name). With `--passes`, each
/// model's decodings are run once per pass (decoding labelled `<decoding> pass <n>`).
pub fn groups(a: &AgentArgs) -> Result<Vec<Group>> {
    if a.passes == 0 {
        bail!("--passes must be at least 1");
    }
    if a.passes > 1 && a.action_cache.is_none() {
        bail!(
            "--passes {} repeats the model episodes over one action cache: give --action-cache DIR",
            a.passes
        );
    }
    let mut g = Vec::new();
    if !a.baselines_only {
        let plans = plans(a)?;
        for m in &a.models {
            for pass in 1..=a.passes {
                for d in &a.decodings {
                    for &plan in &plans {
                        let mut label = d.clone();
                        if !plan {
                            label.push_str(", no plan");
                        }
                        if a.passes > 1 {
                            label.push_str(&format!(" pass {pass}"));
                        }
                        g.push(Group {
                            model: m.clone(),
                            decoding: label,
                            actor: Actor::Model {
                                name: m.clone(),
                                decoding: decoding(d)?,
                                plan,
                            },
                            pass,
                        });
                    }
                }
            }
        }
    }
    for b in crate::bench_agent_baseline::parse(&a.baselines)? {
        g.push(Group {
            model: crate::bench_agent_baseline::LABEL.into(),
            decoding: b.clone(),
            actor: Actor::Baseline(b),
            pass: 1,
        });
    }
    Ok(g)
}

/// One episode's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Episode {
    pub model: String,
    pub decoding: String,
    pub task: String,
    pub seed: u64,
    pub goal: String,
    /// MiniWoB++: the reward is above 0; order-status: the answer holds the expected status.
    pub success: bool,
    /// MiniWoB++'s reward when the episode ended (None: still running after the last step);
    /// order-status: 1 for the right answer, 0 otherwise.
    pub reward: Option<f64>,
    pub steps: usize,
    pub wall_ms: f64,
    pub actions: Vec<String>,
    pub answer: Option<String>,
    /// What ended the episode early (a fatal error), if anything.
    pub error: Option<String>,
    /// The pass over the grid (`--passes`).
    #[serde(default = "first_pass")]
    pub pass: usize,
    /// Steps decided by the model, and steps replayed from the action cache.
    #[serde(default)]
    pub model_calls: usize,
    #[serde(default)]
    pub cache_hits: usize,
}

fn first_pass() -> usize {
    1
}

fn decoding(s: &str) -> Result<Decoding> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .with_context(|| format!("--decodings: {s:?} is not one of constrained, ranked, restricted, free"))
}

/// The local servers an episode may need: MiniWoB++'s pages and one local site per seed.
pub struct Servers {
    miniwob: Option<Server>,
    sites: BTreeMap<u64, Server>,
}

impl Servers {
    pub async fn start(tasks: &[String], seeds: &[u64]) -> Result<Servers> {
        let miniwob = if tasks.iter().any(|t| t != ORDER_STATUS) {
            let home = kamera_model::default_home();
            let dir = tokio::task::spawn_blocking(move || miniwob::ensure(&home)).await??;
            for t in tasks.iter().filter(|t| *t != ORDER_STATUS) {
                if !dir.join(miniwob::task_path(t).trim_start_matches('/')).exists() {
                    bail!(
                        "--tasks: {t:?} is neither a MiniWoB++ task (no {}) nor {ORDER_STATUS}",
                        miniwob::task_path(t)
                    );
                }
            }
            Some(Server::start(Content::Dir(dir)).await?)
        } else {
            None
        };
        let mut sites = BTreeMap::new();
        if tasks.iter().any(|t| t == ORDER_STATUS) {
            for &s in seeds {
                sites.insert(s, Server::start(Content::Memory(kamera_site::generate(s))).await?);
            }
        }
        Ok(Servers { miniwob, sites })
    }

    fn origins(&self) -> Result<Origins> {
        let all: Vec<String> = self
            .miniwob
            .iter()
            .chain(self.sites.values())
            .map(|s| s.origin())
            .collect();
        Ok(Origins::new(&all)?)
    }

    pub async fn browser(&self) -> Result<ChromiumBrowser> {
        Ok(ChromiumBrowser::launch(ChromiumConfig::new(self.origins()?)).await?)
    }
}

/// The scenario of one episode (its goal filled in by [`Servers::prepare`]).
fn scenario(task: &str, seed: u64, decoding: Decoding, max_steps: usize, episode_ms: u64) -> Scenario {
    let order = task == ORDER_STATUS;
    Scenario {
        name: format!("{task}-{seed}"),
        goal: String::new(),
        start: if order { "/".into() } else { miniwob::task_path(task) },
        allowed_origins: Vec::new(),
        policy: PolicyKind::Model,
        decoding,
        site: order.then_some(SiteSpec { seed, perturb: None }),
        episode: (!order).then(|| {
            MiniWobSpec {
                task: task.to_string(),
                seed,
                episode_ms: Some(episode_ms),
            }
            .episode()
        }),
        observe: Default::default(),
        budget: Budget {
            steps: max_steps,
            ..Budget::default()
        },
        uploads: None,
        steps: Vec::new(),
        success: Success {
            answer: None,
            js: None,
            min_reward: (!order).then_some(0.0),
        },
    }
}

impl Servers {
    /// Opens the episode's start page and fills in its goal: MiniWoB++'s utterance after the
    /// seeded episode started, or the order whose status is asked for. Returns the environment
    /// to run in (the page is already open).
    async fn prepare(&self, browser: &mut dyn Browser, sc: &mut Scenario) -> Result<Env> {
        if let Some(e) = &sc.episode {
            let server = self.miniwob.as_ref().context("MiniWoB++ server not started")?;
            browser.navigate(&server.url(&sc.start)).await?;
            browser.eval(&e.start_js).await?;
            let u = browser.eval("core.getUtterance()").await?;
            sc.goal = u.as_str().unwrap_or_default().to_string();
            if sc.goal.is_empty() {
                bail!("{}: the page shows no task utterance", sc.start);
            }
            return Ok(Env {
                origin: server.origin(),
                start_url: String::new(),
            });
        }
        let seed = sc.site.as_ref().map_or(0, |s| s.seed);
        let server = self.sites.get(&seed).context("no local site for this seed")?;
        let orders = kamera_site::data(seed).orders;
        let o = &orders[seed as usize % orders.len()];
        sc.goal = format!(
            "Find the shipping status of order {}, then answer with the status.",
            o.id
        );
        sc.success.answer = Some(o.status.clone());
        browser.navigate(&server.url("/")).await?;
        Ok(Env {
            origin: server.origin(),
            start_url: String::new(),
        })
    }
}

/// Runs one episode of `sc` with `policy` on `browser`, over a fresh session (in memory);
/// `sc.goal` is filled in from the page first.
pub async fn episode(
    servers: &Servers,
    browser: &mut dyn Browser,
    model: &Arc<Model>,
    sc: &mut Scenario,
    policy: &mut dyn kamera_agent::Policy,
    cache: Option<&std::path::Path>,
) -> Result<RunSummary> {
    let env = servers.prepare(browser, sc).await?;
    let mut session = session_for(sc, model.clone())?;
    let parts = Parts {
        browser,
        policy,
        session: &mut session,
    };
    let opts = RunOptions {
        action_cache: cache.map(ActionCache::open).transpose()?,
        ..RunOptions::default()
    };
    Ok(run_episode(parts, sc, &env, opts).await?)
}

fn outcome(
    (model, dec, pass): (&str, &str, usize),
    task: &str,
    seed: u64,
    goal: String,
    r: Result<RunSummary>,
    wall_ms: f64,
) -> Episode {
    match r {
        Ok(s) => {
            let success = s.end.success == Some(true);
            let reward = if task == ORDER_STATUS {
                Some(if success { 1.0 } else { 0.0 })
            } else {
                s.end.reward
            };
            Episode {
                model: model.into(),
                decoding: dec.into(),
                task: task.into(),
                seed,
                goal,
                success,
                reward,
                steps: s.steps.len(),
                wall_ms,
                actions: s.actions().iter().map(|a| a.label()).collect(),
                answer: s.end.answer.clone(),
                error: s.end.error.clone(),
                pass,
                model_calls: s.model_calls,
                cache_hits: s.cache_hits,
            }
        }
        Err(e) => Episode {
            model: model.into(),
            decoding: dec.into(),
            task: task.into(),
            seed,
            goal,
            success: false,
            reward: if task == ORDER_STATUS { Some(0.0) } else { None },
            steps: 0,
            wall_ms,
            actions: Vec::new(),
            answer: None,
            error: Some(format!("{e:#}")),
            pass,
            model_calls: 0,
            cache_hits: 0,
        },
    }
}

/// `/proc/loadavg`'s one-minute figure (None off Linux).
pub fn load_avg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn fmt_secs(s: f64) -> String {
    if s >= 3600.0 {
        format!("{}h{:02}m", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64)
    } else if s >= 60.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!("{s:.0}s")
    }
}

/// Runs the whole grid; progress lines on stderr.
// Long: runs the grid (models x decodings x tasks x seeds) with its progress and baselines.
pub async fn bench(a: &AgentArgs) -> Result<Report> {
    let tasks: Vec<String> = if a.tasks.is_empty() {
        TASKS
            .iter()
            .map(|t| t.to_string())
            .chain([ORDER_STATUS.to_string()])
            .collect()
    } else {
        a.tasks.clone()
    };
    if a.seeds == 0 || a.max_steps == 0 || a.flow_steps == 0 || a.models.is_empty() || a.decodings.is_empty() {
        bail!("--seeds, --max-steps, --flow-steps, --models and --decodings must not be empty or 0");
    }
    let groups = groups(a)?;
    if groups.is_empty() {
        bail!("nothing to run: --baselines-only with --baselines none");
    }
    let seeds: Vec<u64> = (1..=a.seeds).collect();
    let servers = Servers::start(&tasks, &seeds).await?;
    let total = groups.len() * tasks.len() * seeds.len();
    let load_start = load_avg();
    let t0 = Instant::now();
    let pb = crate::progress::bar(total, "episodes");
    let mut episodes = Vec::with_capacity(total);
    let mut loaded: Option<(String, Arc<Model>)> = None;
    for g in &groups {
        // The baselines read nothing, but the runtime still observes every page: over a
        // session of the first model.
        let (mname, dec) = match &g.actor {
            Actor::Model { name, decoding, .. } => (name.clone(), *decoding),
            Actor::Baseline(_) => (a.models[0].clone(), Decoding::Constrained),
        };
        if loaded.as_ref().is_none_or(|(n, _)| *n != mname) {
            let m = mname.clone();
            let model = Arc::new(tokio::task::spawn_blocking(move || crate::models::load(&m)).await??);
            loaded = Some((mname.clone(), model));
        }
        let model = loaded.as_ref().map(|(_, m)| m.clone()).expect("loaded");
        let (name, dname) = (&g.model, &g.decoding);
        let mut browser = servers.browser().await?;
        for task in &tasks {
            for &seed in &seeds {
                let steps = if task == ORDER_STATUS {
                    a.flow_steps
                } else {
                    a.max_steps
                };
                let mut sc = scenario(task, seed, dec, steps, a.episode_ms);
                let mut policy: Box<dyn kamera_agent::Policy> = match &g.actor {
                    Actor::Model { decoding, plan, .. } => {
                        let mut p = ModelPolicy::new(*decoding);
                        p.plan = *plan;
                        Box::new(p)
                    }
                    Actor::Baseline(b) => crate::bench_agent_baseline::policy(b, task, seed),
                };
                let cache = match g.actor {
                    Actor::Model { .. } => a.action_cache.as_deref(),
                    Actor::Baseline(_) => None,
                };
                let t = Instant::now();
                let r = episode(&servers, &mut browser, &model, &mut sc, policy.as_mut(), cache).await;
                let fatal = r.is_err();
                let wall = t.elapsed().as_secs_f64() * 1e3;
                let labels = (name.as_str(), dname.as_str(), g.pass);
                episodes.push(outcome(labels, task, seed, sc.goal.clone(), r, wall));
                if fatal {
                    // The browser may be gone: start a fresh one for the next episode.
                    let _ = browser.close().await;
                    browser = servers.browser().await?;
                }
                if let Some(p) = &a.json {
                    // Kept up to date after every episode: a run cut short keeps what it did.
                    let partial = Report::new(
                        a,
                        &groups,
                        &tasks,
                        episodes.clone(),
                        load_start,
                        load_avg(),
                        t0.elapsed().as_secs_f64(),
                    );
                    write_json(p, &partial)?;
                }
                let done = episodes.len();
                let e = episodes.last().expect("pushed");
                let per = t0.elapsed().as_secs_f64() / done as f64;
                let line = format!(
                    "[{done}/{total}] {name} {dname} {task} seed {seed}: {} reward {} in {} steps, {:.1} s; ETA {}",
                    if e.success { "pass" } else { "fail" },
                    e.reward.map_or("-".into(), |r| format!("{r:.2}")),
                    e.steps,
                    e.wall_ms / 1e3,
                    fmt_secs(per * (total - done) as f64)
                );
                // A line per episode (kept in logs); on a terminal with a bar under them.
                if crate::progress::drawn() {
                    pb.println(line);
                    pb.inc(1);
                } else {
                    eprintln!("{line}");
                }
            }
        }
        let _ = browser.close().await;
    }
    pb.finish_and_clear();
    Ok(Report::new(
        a,
        &groups,
        &tasks,
        episodes,
        load_start,
        load_avg(),
        t0.elapsed().as_secs_f64(),
    ))
}

pub fn run(a: AgentArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = rt.block_on(bench(&a))?;
    print!("{}", markdown(&report));
    if let Some(p) = &a.json {
        write_json(p, &report)?;
    }
    Ok(())
}

fn write_json(p: &std::path::Path, r: &Report) -> Result<()> {
    let tmp = p.with_extension("json.partial");
    std::fs::write(&tmp, serde_json::to_string_pretty(r)? + "\n")
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, p).with_context(|| format!("writing {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kamera_agent::{ScriptStep, ScriptedPolicy};

    /// The bench's episode and outcome on real Chromium with scripted paths: the known-good
    /// click on click-test is a success with MiniWoB++'s time-decayed reward (near 1), and the
    /// utterance became the goal; submitting enter-text empty is a failure with reward -1.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scripted_paths_read_their_reward() -> Result<()> {
        let tasks = vec!["click-test".to_string(), "enter-text".to_string()];
        let servers = Servers::start(&tasks, &[1]).await?;
        let mut browser = servers.browser().await?;
        let model = Arc::new(crate::models::load("smollm2-135m")?);
        let mut run = async |task: &str, click: &str| -> Result<Episode> {
            let mut sc = scenario(task, 1, Decoding::Constrained, 2, 60_000);
            let mut policy = ScriptedPolicy::new(vec![ScriptStep::Click { target: click.into() }], "");
            let r = episode(&servers, &mut browser, &model, &mut sc, &mut policy, None).await;
            Ok(outcome(
                ("smollm2-135m", "scripted", 1),
                task,
                1,
                sc.goal.clone(),
                r,
                0.0,
            ))
        };
        let good = run("click-test", "#subbtn").await?;
        assert_eq!(good.goal, "Click the button.");
        assert!(good.success, "{good:?}");
        let reward = good.reward.expect("the episode ended");
        assert!(reward > 0.9 && reward <= 1.0, "{good:?}");
        assert_eq!((good.steps, good.actions.len()), (1, 1), "{good:?}");

        let bad = run("enter-text", "#subbtn").await?;
        assert!(bad.goal.starts_with("Enter \""), "{bad:?}");
        assert!(!bad.success, "{bad:?}");
        assert_eq!(bad.reward, Some(-1.0), "{bad:?}");
        browser.close().await?;

        let row = crate::bench_agent_report::Row::of("m", "d", None, &[&good, &bad]);
        assert_eq!((row.episodes, row.success, row.ended), (2, 1, 2));
        assert!((row.rate - 0.5).abs() < 1e-12 && (row.mean_reward - (reward - 1.0) / 2.0).abs() < 1e-12);
        Ok(())
    }

    /// Greedy `constrained` decoding on login-user with Qwen2.5-0.5B, two of the seeds that had
    /// typed the username into both fields (bench/agent/README.md, "The goal names values": 5/5
    /// seeds, 1/5 before): the goal names the username and the password, and each field is
    /// offered its own value.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn constrained_decoding_types_each_named_value_into_its_field() -> Result<()> {
        let seeds = [2, 3];
        let servers = Servers::start(&["login-user".to_string()], &seeds).await?;
        let mut browser = servers.browser().await?;
        let model = Arc::new(crate::models::load("qwen2.5-0.5b")?);
        for seed in seeds {
            let mut sc = scenario("login-user", seed, Decoding::Constrained, 3, 120_000);
            let mut policy = ModelPolicy::new(Decoding::Constrained);
            let r = episode(&servers, &mut browser, &model, &mut sc, &mut policy, None).await;
            let e = outcome(
                ("qwen2.5-0.5b", "constrained", 1),
                "login-user",
                seed,
                sc.goal.clone(),
                r,
                0.0,
            );
            let typed: Vec<&str> = e
                .actions
                .iter()
                .filter(|a| a.starts_with("type"))
                .filter_map(|a| a.split('"').nth(1))
                .collect();
            assert_eq!(typed.len(), 2, "{e:?}");
            assert_ne!(typed[0], typed[1], "the same text in both fields: {e:?}");
            assert!(e.success, "{e:?}");
        }
        browser.close().await?;
        Ok(())
    }
}
