//! `kamera run --parallel N SCENARIO...`: episodes at once in one process (kamera-harness's
//! `run_parallel`: shared weights and store, a session, trace and browser per episode), with
//! each episode's result, episodes per minute and the peak memory of the process and its
//! browsers (proportional set size, so pages shared between processes count once).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use serde::Serialize;

use crate::run::{RunArgs, cancel_on_stop_signal, ensure_chromium, load_model, runtime, runtime_config};

/// One episode of the JSON report.
#[derive(Serialize)]
struct EpisodeReport {
    scenario: String,
    /// Its trace folder, when `--trace` kept one.
    #[serde(skip_serializing_if = "Option::is_none")]
    trace: Option<PathBuf>,
    started_ms: f64,
    ended_ms: f64,
    success: Option<bool>,
    answer: Option<String>,
    steps: usize,
    error: Option<String>,
}

/// What `--json` prints.
#[derive(Serialize)]
struct ParallelReport {
    concurrency: usize,
    episodes: usize,
    wall_ms: f64,
    episodes_per_minute: f64,
    /// Peak of the summed proportional set size of this process and its children (the browsers).
    peak_pss_mb: f64,
    /// This process's own peak resident set (model weights, sessions, store tiers).
    peak_rss_self_mb: f64,
    runs: Vec<EpisodeReport>,
}

pub fn run(a: RunArgs) -> Result<()> {
    let n = a.parallel.unwrap_or(1);
    if n == 0 {
        bail!("--parallel 0: give the number of episodes to run at once (1 or more)");
    }
    for (flag, set) in [
        ("--report", a.report.is_some()),
        ("--baseline", a.baseline),
        ("--action-cache", a.action_cache.is_some()),
    ] {
        if set {
            bail!("{flag} takes one run; give one scenario without --parallel");
        }
    }
    let home = kamera_model::default_home();
    let browser = a.browser.options(&home)?;
    for (flag, set) in [
        ("--profile", browser.profile.is_some()),
        ("--storage-state", browser.storage_state.is_some()),
        ("--browser-url", browser.browser_url.is_some()),
    ] {
        if set {
            bail!("{flag} belongs to one run at a time; parallel episodes each get an isolated browser");
        }
    }
    let mut jobs = Vec::new();
    for (i, name) in a.scenarios.iter().enumerate() {
        let path = kamera_agent::resolve(name);
        let scenario = kamera_harness::load_scenario(&path)?;
        let trace_dir = a
            .trace
            .as_ref()
            .map(|d| d.join(format!("{:02}-{}", i + 1, scenario.name)));
        jobs.push(kamera_harness::Job { scenario, trace_dir });
    }
    ensure_chromium()?;
    let model = load_model(&a.model)?;
    let shared = runtime_config(model, &a.model, &a.store, !a.no_reuse).shared()?;
    let rt = runtime()?;
    let cancel = cancel_on_stop_signal(&rt);
    let memory = MemorySampler::start();
    let t0 = std::time::Instant::now();
    let outcomes = rt.block_on(kamera_harness::run_parallel(jobs, n, &shared, &home, browser, cancel))?;
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let peak_pss_mb = memory.stop();
    let report = ParallelReport {
        concurrency: n,
        episodes: outcomes.len(),
        wall_ms,
        episodes_per_minute: outcomes.len() as f64 / (wall_ms / 60e3),
        peak_pss_mb,
        peak_rss_self_mb: crate::bench::proc_status_mb("VmHWM"),
        runs: outcomes
            .into_iter()
            .map(|o| {
                let trace = a
                    .trace
                    .as_ref()
                    .map(|d| d.join(format!("{:02}-{}", o.index + 1, o.scenario)));
                let (success, answer, steps, error) = match &o.result {
                    Ok(s) => (s.end.success, s.end.answer.clone(), s.end.steps, s.end.error.clone()),
                    Err(e) => (Some(false), None, 0, Some(e.to_string())),
                };
                EpisodeReport {
                    scenario: o.scenario,
                    trace,
                    started_ms: o.started_ms,
                    ended_ms: o.ended_ms,
                    success,
                    answer,
                    steps,
                    error,
                }
            })
            .collect(),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    if report.runs.iter().any(|r| r.success == Some(false)) {
        std::process::exit(2);
    }
    Ok(())
}

fn text(r: &ParallelReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    _ = writeln!(
        o,
        "{:>3}  {:<28} {:<6} {:>5} {:>8} {:>8}  answer / error",
        "#", "scenario", "result", "steps", "start s", "end s"
    );
    for (i, e) in r.runs.iter().enumerate() {
        let verdict = match (e.success, &e.error) {
            (_, Some(_)) => "ERROR",
            (Some(true), _) => "PASS",
            (Some(false), _) => "FAIL",
            (None, _) => "done",
        };
        let tail = e.error.as_deref().or(e.answer.as_deref()).unwrap_or("-");
        _ = writeln!(
            o,
            "{:>3}  {:<28} {:<6} {:>5} {:>8.1} {:>8.1}  {tail}",
            i + 1,
            e.scenario.chars().take(28).collect::<String>(),
            verdict,
            e.steps,
            e.started_ms / 1e3,
            e.ended_ms / 1e3
        );
    }
    let passed = r.runs.iter().filter(|e| e.success == Some(true)).count();
    _ = writeln!(
        o,
        "parallel  {} episodes, at most {} at once, in {:.1} s: {:.1} episodes/min; {passed} passed",
        r.episodes,
        r.concurrency,
        r.wall_ms / 1e3,
        r.episodes_per_minute
    );
    _ = writeln!(
        o,
        "memory    peak {:.0} MB (PSS of this process and its browsers); this process's peak RSS {:.0} MB",
        r.peak_pss_mb, r.peak_rss_self_mb
    );
    o
}

/// Samples the summed PSS of this process and its descendants every 100 ms, keeping the peak.
struct MemorySampler {
    stop: Arc<AtomicBool>,
    peak_kb: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl MemorySampler {
    fn start() -> MemorySampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak_kb = Arc::new(AtomicU64::new(0));
        let (s, p) = (stop.clone(), peak_kb.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(tree_pss_kb(std::process::id()), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        MemorySampler { stop, peak_kb, thread }
    }

    /// The peak in MB.
    fn stop(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.peak_kb.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

/// Summed `Pss` (kB) of `root` and every process below it (0 where /proc cannot be read).
fn tree_pss_kb(root: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    let mut parent = std::collections::HashMap::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // stat: "pid (comm) state ppid ...": the comm may hold spaces, so split after the last ')'.
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            && let Some(ppid) = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok())
        {
            parent.insert(pid, ppid);
        }
    }
    let in_tree = |mut pid: u32| {
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match parent.get(&pid) {
                Some(&p) if p != 0 => pid = p,
                _ => return false,
            }
        }
        false
    };
    parent
        .keys()
        .filter(|&&pid| in_tree(pid))
        .map(|pid| crate::bench::proc_kb(&format!("/proc/{pid}/smaps_rollup"), "Pss").unwrap_or(0.0) as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_proportional_set_size() {
        // Rough bounds: a test binary maps at least a megabyte and well under 64 GB.
        let kb = tree_pss_kb(std::process::id());
        assert!((1024..64 << 20).contains(&kb), "{kb} kB");
    }
}
