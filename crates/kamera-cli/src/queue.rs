//! `kamera queue push|status` and `kamera worker`: episodes run by a fleet of worker processes
//! from a work queue on Redis Streams (kamera-harness's `queue`: a consumer group, results
//! written and acknowledged in one transaction, a dead worker's episode taken over after
//! `--claim-after-ms`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kamera_harness::queue::{EpisodeResult, Queue};

use crate::browser_args::BrowserArgs;
use crate::run::{ModelArg, StoreArgs, ensure_chromium, load_model, runtime, runtime_config};

#[derive(Args)]
pub struct QueueArgs {
    /// The Redis server holding the queue: redis://[user:pass@]host:port/db.
    #[arg(long = "queue", alias = "store", global = true, value_name = "URL")]
    url: Option<String>,
    /// The queue's name (several queues can share one server).
    #[arg(long, default_value = "default", global = true)]
    name: String,
    #[command(subcommand)]
    command: QueueCommand,
}

#[derive(Subcommand)]
enum QueueCommand {
    /// Add scenario files as episodes (each file once per listing; repeat a file to run it again).
    Push {
        #[arg(required = true, num_args = 1.., value_name = "SCENARIO")]
        scenarios: Vec<String>,
    },
    /// Episodes pushed, waiting, running (held by a worker, alive or dead), done and failed.
    Status {
        /// Print the counts and every result as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn url(u: &Option<String>) -> Result<&str> {
    u.as_deref()
        .context("give the queue's Redis server: --queue redis://host:port/db")
}

pub fn run(a: QueueArgs) -> Result<()> {
    let mut q = Queue::open(url(&a.url)?, &a.name)?;
    match a.command {
        QueueCommand::Push { scenarios } => {
            for s in &scenarios {
                let path = kamera_agent::resolve(s);
                let id = q.push(&path)?;
                println!("{id}  {}", path.display());
            }
        }
        QueueCommand::Status { json } => {
            let s = q.status()?;
            if json {
                let results = q.results_all()?;
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({ "status": s, "results": results }))?
                );
            } else {
                println!(
                    "queue     {}: {} pushed; {} waiting, {} running, {} done, {} failed",
                    a.name, s.pushed, s.waiting, s.running, s.done, s.failed
                );
                for (w, n) in &s.workers {
                    println!("worker    {w}: {n} held");
                }
            }
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct WorkerArgs {
    /// The Redis server holding the queue: redis://[user:pass@]host:port/db. Also the chunk
    /// store the workers share, unless --store or --no-store says otherwise.
    #[arg(long = "queue", value_name = "URL")]
    url: String,
    /// The queue's name.
    #[arg(long, default_value = "default")]
    name: String,
    /// This worker's name in the consumer group (default: host name and process id).
    #[arg(long)]
    worker: Option<String>,
    /// Take over an episode another worker has held this long without a heartbeat (it died).
    #[arg(long, default_value_t = 60_000)]
    claim_after_ms: u64,
    /// Give an episode up, as failed, once it has been handed out this many times.
    #[arg(long, default_value_t = 3)]
    max_deliveries: u64,
    /// Stop when no episode is waiting or held by any worker (default: wait for more).
    #[arg(long)]
    until_empty: bool,
    /// Stop after this many episodes.
    #[arg(long)]
    max_episodes: Option<usize>,
    /// Keep each episode's trace in DIR/<episode id>.
    #[arg(long, value_name = "DIR")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    browser: BrowserArgs,
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    store: StoreArgs,
}

/// `kamera worker`: takes episodes one at a time and runs each on this process's model, store
/// and a fresh isolated browser, until stopped (Ctrl-C ends after the episode in hand).
pub fn worker(mut a: WorkerArgs) -> Result<()> {
    if a.max_deliveries == 0 {
        bail!("--max-deliveries 0: an episode must be handed out at least once");
    }
    let mut q = Queue::open(&a.url, &a.name)?;
    let me = a
        .worker
        .clone()
        .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
    if !a.store.no_store && a.store.store.is_none() {
        a.store.store = Some(a.url.clone());
    }
    let home = kamera_model::default_home();
    let browser = a.browser.options(&home)?;
    if browser.profile.is_some() || browser.storage_state.is_some() {
        bail!(
            "--profile and --storage-state belong to one run at a time; a worker's episodes each get an isolated browser"
        );
    }
    ensure_chromium()?;
    let model = load_model(&a.model)?;
    let shared = runtime_config(model.clone(), &a.model, &a.store, true).shared()?;
    let rt = runtime()?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    rt.spawn(async move {
        crate::run::stop_signal().await;
        s.store(true, Ordering::Relaxed);
        eprintln!(
            "kamera worker: stopping after the episode in hand; Ctrl-C (or SIGTERM) again stops now (the episode stays pending and another worker takes it over)"
        );
        crate::run::stop_signal().await;
        std::process::exit(130);
    });
    let claim_after = Duration::from_millis(a.claim_after_ms);
    println!("worker    {me}: queue {} on {}", a.name, a.url);
    let mut ran = 0usize;
    while !stop.load(Ordering::Relaxed) && a.max_episodes.is_none_or(|m| ran < m) {
        let Some(e) = q.next(&me, claim_after, Duration::from_millis(500))? else {
            if a.until_empty && q.drained()? {
                break;
            }
            continue;
        };
        ran += 1;
        println!("start     {} {} (delivery {})", e.id, e.scenario, e.deliveries);
        let t0 = Instant::now();
        let mut result = EpisodeResult {
            id: e.id.clone(),
            scenario: e.scenario.clone(),
            worker: me.clone(),
            deliveries: e.deliveries,
            success: None,
            answer: None,
            steps: 0,
            wall_ms: 0.0,
            error: None,
        };
        if e.deliveries > a.max_deliveries {
            result.error = Some(format!(
                "given up: handed out {} times (more than --max-deliveries {}); the workers running it did not finish",
                e.deliveries, a.max_deliveries
            ));
        } else {
            let beat = Heartbeat::start(&q, &me, &e.id, claim_after / 3)?;
            let outcome = kamera_harness::parse_scenario(&e.toml, &e.path).and_then(|scenario| {
                rt.block_on(kamera_harness::run_scenario(
                    &scenario,
                    model.clone(),
                    &home,
                    kamera_harness::RunConfig {
                        trace_dir: a.trace.as_ref().map(|d| d.join(e.id.replace('-', "_"))),
                        runtime: shared.duplicate(),
                        browser: browser.clone(),
                        ..kamera_harness::RunConfig::default()
                    },
                ))
            });
            beat.stop();
            match outcome {
                Ok(s) => {
                    result.success = s.end.success;
                    result.answer = s.end.answer.clone();
                    result.steps = s.end.steps;
                    result.error = s.end.error.clone();
                }
                Err(err) => result.error = Some(err.to_string()),
            }
        }
        result.wall_ms = t0.elapsed().as_secs_f64() * 1e3;
        q.complete(&result)?;
        let verdict = match (result.failed(), &result.error) {
            (_, Some(err)) => format!("ERROR {err}"),
            (true, None) => "FAIL".into(),
            (false, None) => "done".into(),
        };
        println!(
            "end       {} {} {verdict} in {:.1} s; answer {}",
            e.id,
            e.scenario,
            result.wall_ms / 1e3,
            result.answer.as_deref().unwrap_or("-")
        );
    }
    println!("worker    {me}: {ran} episodes");
    Ok(())
}

/// Resets the idle time of the episode in hand every `every`, on a connection of its own.
struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Heartbeat {
    fn start(q: &Queue, worker: &str, id: &str, every: Duration) -> Result<Heartbeat> {
        let mut conn = q.reopen()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (s, worker, id) = (stop.clone(), worker.to_string(), id.to_string());
        let every = every.max(Duration::from_millis(100));
        let thread = std::thread::spawn(move || {
            let mut last = Instant::now();
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                if last.elapsed() >= every {
                    if let Err(e) = conn.heartbeat(&worker, &id) {
                        tracing::warn!(%id, error = %e, "heartbeat");
                    }
                    last = Instant::now();
                }
            }
        });
        Ok(Heartbeat { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "worker".into())
}
