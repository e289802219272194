//! `kamera bench model --against llama.cpp`: ours and llama.cpp (llama-cpp-python built from
//! source, scripts/llamacpp-venv.sh) on the same GGUF, prompts and threads, alternating in one
//! run; prints each figure, the ratio ours / theirs, and both processes' resident memory.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::bench::{ModelArgs, measure, memory, to_json};

/// The repository's scripts/ (where this binary was built from), or `$KAMERA_SCRIPTS`.
pub(crate) fn scripts_dir() -> PathBuf {
    std::env::var_os("KAMERA_SCRIPTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts")))
}

/// The venv's interpreter (scripts/llamacpp-venv.sh builds llama-cpp-python once, ~10 minutes).
pub(crate) fn llamacpp_python(scripts: &std::path::Path) -> Result<PathBuf> {
    let out = Command::new("bash")
        .arg(scripts.join("llamacpp-venv.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", scripts.join("llamacpp-venv.sh").display()))?;
    if !out.status.success() {
        bail!(
            "scripts/llamacpp-venv.sh failed ({}): llama.cpp could not be built",
            out.status
        );
    }
    let python = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string();
    if python.is_empty() {
        bail!("scripts/llamacpp-venv.sh printed no interpreter path");
    }
    Ok(PathBuf::from(python))
}

fn run_llamacpp(
    python: &std::path::Path,
    scripts: &std::path::Path,
    gguf: &std::path::Path,
    m: &ModelArgs,
) -> Result<serde_json::Value> {
    let join = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let out = Command::new(python)
        .arg(scripts.join("bench_llamacpp.py"))
        .args(["--gguf", &gguf.display().to_string(), "--prefill", &join(&m.prefill)])
        .args([
            "--decode",
            &m.decode.to_string(),
            "--decode-after",
            &m.decode_after.first().copied().unwrap_or(128).to_string(),
        ])
        .args(["--reps", &m.reps.to_string(), "--threads", &threads().to_string()])
        .args(std::env::var_os("KAMERA_LLAMACPP_NO_EXTRA_BUFTS").map(|_| "--no-extra-bufts"))
        .output()
        .context("running scripts/bench_llamacpp.py")?;
    if !out.status.success() {
        bail!(
            "bench_llamacpp.py failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.lines().last().unwrap_or(""))
        .with_context(|| format!("bench_llamacpp.py printed {line:?}"))
}

pub fn run(m: ModelArgs) -> Result<()> {
    if m.against.as_deref() != Some("llama.cpp") {
        bail!(
            "--against {:?}: the engine compared against can only be llama.cpp",
            m.against.as_deref().unwrap_or("")
        );
    }
    let gguf = crate::models::resolve(&m.model)?;
    if gguf.extension().is_none_or(|e| e != "gguf") {
        bail!("--against llama.cpp needs a GGUF model; {} is not one", gguf.display());
    }
    let scripts = scripts_dir();
    let python = llamacpp_python(&scripts)?;
    let mut model = crate::models::load(&m.model)?;
    let kl = crate::bench::set_precision(&mut model, &m, m.prefill.first().copied().unwrap_or(512))?;
    let (mut ours, mut theirs): (Vec<(String, f64)>, serde_json::Map<String, serde_json::Value>) =
        (Vec::new(), Default::default());
    let mut their_mem = serde_json::Value::Null;
    for round in 0..m.rounds.max(1) {
        eprintln!("round {}/{}: kamera", round + 1, m.rounds.max(1));
        for (k, v) in measure(&model, &m)? {
            match ours.iter_mut().find(|(key, _)| *key == k) {
                Some((_, best)) => *best = best.max(v),
                None => ours.push((k, v)),
            }
        }
        eprintln!("round {}/{}: llama.cpp", round + 1, m.rounds.max(1));
        let t = run_llamacpp(&python, &scripts, &gguf, &m)?;
        if let Some(res) = t["results"].as_object() {
            for (k, v) in res {
                let v = v.as_f64().unwrap_or(f64::NAN);
                let best = theirs.get(k).and_then(|b| b.as_f64()).map_or(v, |b| b.max(v));
                theirs.insert(k.clone(), serde_json::json!(best));
            }
        }
        their_mem = serde_json::json!({ "rss_mb": t["rss_mb"], "peak_rss_mb": t["peak_rss_mb"], "baseline_rss_mb": t["baseline_rss_mb"] });
    }
    let mem = memory(&model, &m);
    let gguf_mb = std::fs::metadata(&gguf)
        .map(|md| md.len() as f64 / (1024.0 * 1024.0))
        .unwrap_or(f64::NAN);
    let ratios: serde_json::Map<String, serde_json::Value> = ours
        .iter()
        .map(|(k, v)| {
            let key = format!("{k}_tok_s");
            let r = theirs.get(&key).and_then(|t| t.as_f64()).map_or(f64::NAN, |t| v / t);
            (key, serde_json::json!(r))
        })
        .collect();
    let report = serde_json::json!({
        "model": m.model, "gguf_mb": gguf_mb, "rounds": m.rounds.max(1), "threads": threads(),
        "prefill_precision": m.precision().to_string(), "kl_f32_vs_prefill_precision": kl,
        "kamera": { "results": to_json(&ours), "memory": mem },
        "llama.cpp": { "results": theirs, "memory": their_mem },
        "ratio": ratios,
    });
    if m.json {
        println!("{report}");
        return Ok(());
    }
    println!(
        "{} ({gguf_mb:.1} MB GGUF), best of {} alternating rounds, {} threads",
        m.model,
        m.rounds.max(1),
        threads()
    );
    match kl {
        Some(kl) => println!(
            "kamera prefill precision {}: KL(f32 || {}) of the next token after {} tokens {kl:.3e} nats",
            m.precision(),
            m.precision(),
            m.prefill.first().copied().unwrap_or(512)
        ),
        None => println!("kamera prefill precision {}", m.precision()),
    }
    println!("| figure | kamera | llama.cpp | kamera / llama.cpp |\n|---|---:|---:|---:|");
    for (k, v) in &ours {
        let key = format!("{k}_tok_s");
        let t = theirs.get(&key).and_then(|t| t.as_f64()).unwrap_or(f64::NAN);
        println!("| {k} tok/s | {v:.1} | {t:.1} | {:.2}x |", v / t);
    }
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    println!(
        "| resident MB (end of run) | {:.1} | {:.1} | |",
        f(&mem["rss_mb"]),
        f(&their_mem["rss_mb"])
    );
    println!(
        "| peak resident MB | {:.1} | {:.1} | |",
        f(&mem["peak_rss_mb"]),
        f(&their_mem["peak_rss_mb"])
    );
    println!(
        "kamera: weights {:.1} MB as held, KV {:.1} MB at the longest context; resident {:.2}x the GGUF + KV (target <= 2x)",
        f(&mem["weights_mb"]),
        f(&mem["kv_mb"]),
        f(&mem["rss_mb"]) / (gguf_mb + f(&mem["kv_mb"]))
    );
    Ok(())
}

/// Threads both engines use: the CPUs this process may run on (rayon's pool is that size).
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
