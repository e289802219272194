//! `kamera`: the command-line front of the Kamera runtime. One module per subcommand group;
//! add a group by adding a module and a variant of [`Command`].

mod bench;
mod bench_agent;
mod bench_agent_baseline;
mod bench_agent_cache;
mod bench_agent_report;
mod bench_image;
mod bench_llamacpp;
mod bench_reuse;
mod bench_session;
mod bench_session_report;
mod bench_stats;
mod bench_store;
mod bench_vision;
mod browser_args;
mod calibrate;
mod doctor;
mod eval;
mod generate;
mod logits;
mod mcp;
mod models;
mod progress;
mod queue;
// kamera-store's test server (a redis-server on a free loopback port in a temp dir, killed on
// drop): one launcher for the store tests, the workspace tests, `kamera bench store` and its test.
#[path = "../../kamera-store/tests/common/redis_server.rs"]
mod redis_server;
mod run;
mod run_parallel;
mod store;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kamera", version, about = "Position-invariant KV cache runtime")]
struct Cli {
    /// More logging on stderr (-v info, -vv debug, -vvv trace); RUST_LOG wins when set.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch and list models.
    Models(models::ModelsArgs),
    /// Print a prompt's token ids and the top-K next-token logits.
    Logits(logits::LogitsArgs),
    /// Generate text from a prompt.
    Generate(generate::GenerateArgs),
    /// Reuse experiments: every method side by side on a task suite.
    Eval(eval::EvalArgs),
    /// Throughput benchmarks.
    Bench(bench::BenchArgs),
    /// Measure this machine's costs for the scheduler's cost model (kept under $KAMERA_HOME).
    Calibrate(calibrate::CalibrateArgs),
    /// Run a scenario end to end on real Chromium (scripted or model policy).
    Run(run::RunArgs),
    /// Run a scenario and keep its trace (NDJSON + resources/ + DevTools Recorder JSON).
    Record(run::RecordArgs),
    /// Re-run the agent on a recorded trace, no browser; check the actions match.
    Replay(run::ReplayArgs),
    /// Inspect, verify and garbage-collect the canonical KV store.
    Store(store::StoreArgs),
    /// Serve the agent (one browser, one Session) to MCP clients over stdio, or streamable HTTP
    /// on loopback with --http: navigate, observe, act, extract, run_scenario, replay.
    Mcp(mcp::McpArgs),
    /// Check what this machine has (Chromium, models, store, redis-server, NVRTC) and print the
    /// command that installs what is missing; exits 1 when something required is missing.
    Doctor(doctor::DoctorArgs),
    /// A work queue of episodes on Redis Streams: push scenarios, see where the queue stands.
    Queue(queue::QueueArgs),
    /// Run episodes from a Redis queue (`kamera queue push`) until stopped; several workers,
    /// on any hosts, share the queue and the Redis chunk store.
    Worker(queue::WorkerArgs),
}

fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// glibc's malloc serves blocks over its mmap threshold (128 KiB, raised only as such blocks are
/// freed) from fresh mappings and trims freed heap tops at twice it, so a chunk's KV, a patch or
/// a prefill's activations are page-faulted in anew on every use. Served from the heap, and kept
/// when freed up to 64 MiB at the top, they are reused instead. One arena: the model runs on
/// rayon's workers, whose own arenas are 64 MiB heaps that glibc unmaps as soon as they are
/// wholly free, which would fault a chunk's KV in anew after every prefill.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; called before any thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> Result<()> {
    keep_freed_memory();
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    match cli.command {
        Command::Models(a) => models::run(a),
        Command::Run(a) => run::run(a),
        Command::Record(a) => run::record(a),
        Command::Replay(a) => run::replay(a),
        Command::Logits(a) => logits::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Store(a) => store::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Mcp(a) => mcp::run(a),
        Command::Queue(a) => queue::run(a),
        Command::Worker(a) => queue::worker(a),
    }
}
