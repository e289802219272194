//! `kamera-fuzz`: the counted fuzz runner. `kamera-fuzz --target gguf --count 100000` decodes
//! that many inputs (the seeds, then mutations) and prints what held; exit status 1 on a failure.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kamera_fuzz::{CountingAlloc, Runner, targets};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[derive(Parser)]
#[command(
    name = "kamera-fuzz",
    about = "Fuzz Kamera's decoders with seeded structured mutation"
)]
struct Args {
    /// A target (gguf, record, trace, recorder, scenario, tokenizer) or `all`.
    #[arg(long, default_value = "all")]
    target: String,
    /// Inputs per target (the seeds count among them).
    #[arg(long, default_value_t = 100_000)]
    count: u64,
    /// The mutator's RNG seed (a run is reproducible from it and the count).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write each failing input here as `<target>-<input>.bin`.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Write the reports here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let names: Vec<&str> = if a.target == "all" {
        targets::NAMES.to_vec()
    } else {
        vec![a.target.as_str()]
    };
    let mut ok = true;
    let mut rows = Vec::new();
    for name in names {
        let target = match targets::by_name(name) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        let r = Runner::new(a.seed).run(&target, a.count);
        print!("{r}");
        ok &= r.held();
        if let Some(dir) = &a.save {
            let _ = std::fs::create_dir_all(dir);
            for f in &r.failures {
                let p = dir.join(format!("{}-{}.bin", r.target, f.input));
                if let Err(e) = std::fs::write(&p, &f.bytes) {
                    eprintln!("write {}: {e}", p.display());
                }
            }
        }
        rows.push(serde_json::json!({
            "target": r.target, "seed": r.seed, "inputs": r.inputs, "accepted": r.accepted,
            "rejected": r.rejected, "distinct_errors": r.distinct_errors, "panics": r.panics,
            "over_bound": r.over_bound, "invariant": r.invariant, "bound": r.bound_text,
            "peak_alloc_bytes": r.peak_alloc.map(|p| p.0), "slowest_ms": r.slowest.as_secs_f64() * 1e3,
            "seconds": r.elapsed.as_secs_f64(),
        }));
    }
    if let Some(p) = &a.json
        && let Err(e) = std::fs::write(p, serde_json::to_string_pretty(&rows).unwrap_or_default())
    {
        eprintln!("write {}: {e}", p.display());
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
