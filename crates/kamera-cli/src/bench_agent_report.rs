//! `kamera bench agent`'s results: rows per model x decoding (totals) and per task, the JSON
//! report and its markdown table.

use serde::{Deserialize, Serialize};

use crate::bench_agent::{AgentArgs, Episode, Group};

/// Success over a group of episodes. A MiniWoB++ episode still running after the last step has
/// no reward and counts 0 in the mean.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub model: String,
    pub decoding: String,
    /// None for a model x decoding total.
    pub task: Option<String>,
    pub episodes: usize,
    pub success: usize,
    pub rate: f64,
    pub mean_reward: f64,
    /// Episodes the page ended (a reward was read; order-status: always).
    pub ended: usize,
    pub mean_steps: f64,
    pub mean_wall_s: f64,
}

impl Row {
    pub(crate) fn of(model: &str, decoding: &str, task: Option<&str>, eps: &[&Episode]) -> Row {
        let n = eps.len();
        let mean = |f: &dyn Fn(&Episode) -> f64| {
            if n == 0 {
                0.0
            } else {
                eps.iter().map(|e| f(e)).sum::<f64>() / n as f64
            }
        };
        let success = eps.iter().filter(|e| e.success).count();
        Row {
            model: model.into(),
            decoding: decoding.into(),
            task: task.map(str::to_string),
            episodes: n,
            success,
            rate: if n == 0 { 0.0 } else { success as f64 / n as f64 },
            mean_reward: mean(&|e| e.reward.unwrap_or(0.0)),
            ended: eps.iter().filter(|e| e.reward.is_some()).count(),
            mean_steps: mean(&|e| e.steps as f64),
            mean_wall_s: mean(&|e| e.wall_ms / 1e3),
        }
    }
}

/// What ran, where, and how it went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub command: String,
    /// UTC, `YYYY-MM-DD HH:MM`.
    pub date: String,
    pub cores: usize,
    /// One-minute load average when the run started and ended.
    pub load_start: Option<f64>,
    pub load_end: Option<f64>,
    pub wall_s: f64,
    pub tasks: Vec<String>,
    pub seeds: u64,
    pub max_steps: usize,
    pub flow_steps: usize,
    pub models: Vec<String>,
    pub decodings: Vec<String>,
    /// `--plan`: whether the model policy planned (`on`, `off` or both).
    #[serde(default)]
    pub plan: Vec<String>,
    /// The trivial policies scored beside the models (rows of model `baseline`), and the model
    /// whose session they ran over.
    #[serde(default)]
    pub baselines: Vec<String>,
    #[serde(default)]
    pub baseline_session_model: Option<String>,
    pub episode_ms: u64,
    /// Per model x decoding (and per baseline), in run order.
    pub totals: Vec<Row>,
    /// Per model x decoding x task.
    pub rows: Vec<Row>,
    /// The action cache the model episodes shared, and what each pass over it did.
    #[serde(default)]
    pub action_cache: Option<String>,
    /// Passes over the model episodes (`--passes`).
    #[serde(default = "one")]
    pub passes: usize,
    #[serde(default)]
    pub cache_passes: Vec<crate::bench_agent_cache::CachePass>,
    pub episodes: Vec<Episode>,
}

impl Report {
    pub fn new(
        a: &AgentArgs,
        groups: &[Group],
        tasks: &[String],
        episodes: Vec<Episode>,
        load_start: Option<f64>,
        load_end: Option<f64>,
        wall_s: f64,
    ) -> Report {
        let mut totals = Vec::new();
        let mut rows = Vec::new();
        for g in groups {
            let (m, d) = (&g.model, &g.decoding);
            let of = |t: Option<&str>| -> Vec<&Episode> {
                episodes
                    .iter()
                    .filter(|e| &e.model == m && &e.decoding == d && t.is_none_or(|t| e.task == t))
                    .collect()
            };
            totals.push(Row::of(m, d, None, &of(None)));
            for t in tasks {
                rows.push(Row::of(m, d, Some(t), &of(Some(t))));
            }
        }
        let baselines: Vec<String> = groups
            .iter()
            .filter(|g| matches!(g.actor, crate::bench_agent::Actor::Baseline(_)))
            .map(|g| g.decoding.clone())
            .collect();
        Report {
            command: crate::bench::command_line(),
            date: utc_now(),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_start,
            load_end,
            wall_s,
            tasks: tasks.to_vec(),
            seeds: a.seeds,
            max_steps: a.max_steps,
            flow_steps: a.flow_steps,
            models: if a.baselines_only { Vec::new() } else { a.models.clone() },
            decodings: if a.baselines_only {
                Vec::new()
            } else {
                a.decodings.clone()
            },
            plan: if a.baselines_only { Vec::new() } else { a.plan.clone() },
            baseline_session_model: (!baselines.is_empty()).then(|| a.models[0].clone()),
            baselines,
            episode_ms: a.episode_ms,
            totals,
            rows,
            action_cache: a.action_cache.as_ref().map(|p| p.display().to_string()),
            passes: a.passes,
            cache_passes: if a.action_cache.is_some() {
                crate::bench_agent_cache::passes(&episodes)
            } else {
                Vec::new()
            },
            episodes,
        }
    }
}

fn one() -> usize {
    1
}

/// The time now in UTC as `YYYY-MM-DD HH:MM` (days to civil date: H. Hinnant's algorithm).
pub(crate) fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}", rem / 3600, (rem % 3600) / 60)
}

fn load(x: Option<f64>) -> String {
    x.map_or("-".into(), |l| format!("{l:.2}"))
}

/// The totals table, then one row per task with a `success/episodes mean-reward` cell per
/// model x decoding and the task's mean steps and wall time over all of them.
pub fn markdown(r: &Report) -> String {
    let mut s = format!(
        "`{}` ({} UTC, {} cores, load {} -> {}, {:.0} s): {} episodes = {} tasks x {} seeds x ({} models x {} decodings x {} plans x {} passes + {} baselines), at most {} steps ({} for order-status), MiniWoB++ episodes of {} s\n\n",
        r.command,
        r.date,
        r.cores,
        load(r.load_start),
        load(r.load_end),
        r.wall_s,
        r.episodes.len(),
        r.tasks.len(),
        r.seeds,
        r.models.len(),
        r.decodings.len(),
        r.plan.len().max(1),
        r.passes,
        r.baselines.len(),
        r.max_steps,
        r.flow_steps,
        r.episode_ms / 1000,
    );
    s += "| model | decoding | episodes | success | rate | mean reward | ended | mean steps | mean wall (s) |\n";
    s += "|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for t in &r.totals {
        s += &format!(
            "| {} | {} | {} | {} | {:.0}% | {:.3} | {} | {:.1} | {:.1} |\n",
            t.model,
            t.decoding,
            t.episodes,
            t.success,
            t.rate * 100.0,
            t.mean_reward,
            t.ended,
            t.mean_steps,
            t.mean_wall_s
        );
    }
    s += "\n| task |";
    for t in &r.totals {
        s += &format!(" {} {} |", t.model, t.decoding);
    }
    s += " mean steps | mean wall (s) |\n|---|";
    s += &"---:|".repeat(r.totals.len() + 2);
    s += "\n";
    for task in &r.tasks {
        s += &format!("| {task} |");
        let rows: Vec<&Row> = r.rows.iter().filter(|x| x.task.as_deref() == Some(task)).collect();
        for t in &r.totals {
            match rows.iter().find(|x| x.model == t.model && x.decoding == t.decoding) {
                Some(x) => s += &format!(" {}/{} {:.2} |", x.success, x.episodes, x.mean_reward),
                None => s += " - |",
            }
        }
        let eps: Vec<&Episode> = r.episodes.iter().filter(|e| &e.task == task).collect();
        let n = eps.len().max(1) as f64;
        s += &format!(
            " {:.1} | {:.1} |\n",
            eps.iter().map(|e| e.steps as f64).sum::<f64>() / n,
            eps.iter().map(|e| e.wall_ms / 1e3).sum::<f64>() / n
        );
    }
    s += "| **total** |";
    for t in &r.totals {
        s += &format!(" **{}/{}** {:.2} |", t.success, t.episodes, t.mean_reward);
    }
    s += " |  |\n";
    if let Some(m) = &r.baseline_session_model {
        s += &format!(
            "\nRows `baseline`: policies that read nothing, on the same tasks and seeds (over a session of {m}): `first-element` clicks element [1] every step; `random-valid` picks one of the page's valid actions uniformly (seeded by task and seed).\n"
        );
    }
    s += &crate::bench_agent_cache::markdown(&r.cache_passes, r.action_cache.as_deref());
    s
}
