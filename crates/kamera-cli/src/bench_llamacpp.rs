//! `kamera bench model --against llama.cpp`: ours and llama.cpp (llama-cpp-python built from
//! source, scripts/llamacpp-venv.sh) on the same GGUF, prompts and threads, alternating in one
//! run (llama.cpp with flash attention and its extra CPU buffer types, real greedy decoding);
//! prints each figure's median over rounds with its range, the median of the rounds' paired
//! ratios ours / theirs, both engines' resident memory, our precisions with their KL, both
//! engines' KL to HF transformers' logits on the golden prompts (built-in models), and the
//! machine (CPU, load, commit). `--requant q4_0|q8_0` runs both on the GGUF requantized by
//! llama.cpp's own quantize.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use kamera_model::{Golden, GoldenScore};

use crate::bench::{ModelArgs, measure, memory};

/// The repository's scripts/ (where this binary was built from), or `$KAMERA_SCRIPTS`.
pub(crate) fn scripts_dir() -> PathBuf {
    std::env::var_os("KAMERA_SCRIPTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts")))
}

/// The venv's interpreter (scripts/llamacpp-venv.sh builds llama-cpp-python once, ~10 minutes).
pub(crate) fn llamacpp_python(scripts: &std::path::Path) -> Result<PathBuf> {
    venv_python(scripts, "llamacpp-venv.sh")
}

/// The interpreter of the venv that `scripts/<script>` installs once (idempotent; it prints the
/// interpreter's path last on stdout).
pub(crate) fn venv_python(scripts: &std::path::Path, script: &str) -> Result<PathBuf> {
    let out = Command::new("bash")
        .arg(scripts.join(script))
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", scripts.join(script).display()))?;
    if !out.status.success() {
        bail!(
            "scripts/{script} failed ({}): its venv could not be installed",
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
        bail!("scripts/{script} printed no interpreter path");
    }
    Ok(PathBuf::from(python))
}

/// `gguf` requantized to `ty` by llama.cpp's quantize (scripts/llamacpp_quantize.py), made once
/// beside it as `<stem>.<ty>.gguf`.
fn requantized(python: &Path, scripts: &Path, gguf: &Path, ty: &str) -> Result<PathBuf> {
    let stem = gguf.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    let out = gguf.with_file_name(format!("{stem}.{ty}.gguf"));
    if out.is_file() {
        return Ok(out);
    }
    eprintln!(
        "requantizing {} to {ty} with llama.cpp's quantize -> {}",
        gguf.display(),
        out.display()
    );
    let run = Command::new(python)
        .arg(scripts.join("llamacpp_quantize.py"))
        .args([
            "--gguf",
            &gguf.display().to_string(),
            "--out",
            &out.display().to_string(),
        ])
        .args(["--type", ty, "--threads", &threads().to_string()])
        .output()
        .context("running scripts/llamacpp_quantize.py")?;
    if !run.status.success() || !out.is_file() {
        let log = String::from_utf8_lossy(&run.stderr);
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        bail!(
            "llama.cpp's quantize could not make {} from {} ({}): {}",
            out.display(),
            gguf.display(),
            run.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    Ok(out)
}

/// Both engines' KL to HF transformers' logits on the golden prompts of built-in `model`
/// (`None` for a model without a golden file).
fn golden_scores(
    python: &Path,
    scripts: &Path,
    gguf: &Path,
    model: &str,
    ours: &kamera_model::Model,
) -> Result<Option<(String, GoldenScore, GoldenScore)>> {
    let Ok(name) = model.parse::<kamera_model::ModelName>() else {
        return Ok(None);
    };
    let path = Golden::path(name);
    if !path.is_file() {
        eprintln!(
            "no golden logits at {} (this binary's source tree): KL to HF not measured",
            path.display()
        );
        return Ok(None);
    }
    let golden = Golden::read(&path)?;
    let kamera = golden.score(ours)?;
    let v = bench_script(
        python,
        scripts,
        &[
            "--gguf".into(),
            gguf.display().to_string(),
            "--golden".into(),
            path.display().to_string(),
        ],
    )?;
    let theirs: GoldenScore = serde_json::from_value(v["golden"].clone())
        .with_context(|| format!("bench_llamacpp.py --golden printed no score: {v}"))?;
    Ok(Some((golden.source, kamera, theirs)))
}

fn run_llamacpp(python: &Path, scripts: &Path, gguf: &Path, m: &ModelArgs) -> Result<serde_json::Value> {
    let join = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let mut args: Vec<String> = vec![
        "--gguf".into(),
        gguf.display().to_string(),
        "--prefill".into(),
        join(&m.prefill),
        "--decode".into(),
        m.decode.to_string(),
        "--decode-after".into(),
        m.decode_after.first().copied().unwrap_or(128).to_string(),
        "--reps".into(),
        m.reps.to_string(),
    ];
    if std::env::var_os("KAMERA_LLAMACPP_NO_EXTRA_BUFTS").is_some() {
        args.push("--no-extra-bufts".into());
    }
    bench_script(python, scripts, &args)
}

/// `scripts/bench_llamacpp.py ARGS --threads N` in the venv: the JSON line it prints last.
fn bench_script(python: &Path, scripts: &Path, args: &[String]) -> Result<serde_json::Value> {
    let out = Command::new(python)
        .arg(scripts.join("bench_llamacpp.py"))
        .args(args)
        .args(["--threads", &threads().to_string()])
        .output()
        .context("running scripts/bench_llamacpp.py")?;
    if !out.status.success() {
        bail!(
            "bench_llamacpp.py {} failed: {}",
            args.join(" "),
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
    let shipped = crate::models::resolve(&m.model)?;
    if shipped.extension().is_none_or(|e| e != "gguf") {
        bail!(
            "--against llama.cpp needs a GGUF model; {} is not one",
            shipped.display()
        );
    }
    let scripts = scripts_dir();
    let python = llamacpp_python(&scripts)?;
    let gguf = match &m.requant {
        Some(ty) => requantized(&python, &scripts, &shipped, ty)?,
        None => shipped,
    };
    let mut model = crate::models::load(&gguf.display().to_string())?;
    let kl = crate::bench::set_precision(&mut model, &m, m.prefill.first().copied().unwrap_or(512))?;
    let decode_kl = crate::bench::set_decode_precision(&mut model, &m, m.decode_after.first().copied().unwrap_or(128))?;
    let golden = golden_scores(&python, &scripts, &gguf, &m.model, &model)?;
    let machine = crate::bench_session_report::Machine::now();
    // Every round's figure per engine, in the order of the rounds.
    let (mut ours, mut theirs): (Rounds, Rounds) = Default::default();
    let mut their_mem = serde_json::Value::Null;
    let rounds = m.rounds.max(1);
    for round in 0..rounds {
        // Which engine goes first alternates, so neither always meets the machine after the other.
        let mut t = serde_json::Value::Null;
        for side in [round % 2, 1 - round % 2] {
            if side == 0 {
                eprintln!("round {}/{rounds}: kamera", round + 1);
                for (k, v) in measure(&model, &m)? {
                    push(&mut ours, format!("{k}_tok_s"), v);
                }
            } else {
                eprintln!("round {}/{rounds}: llama.cpp", round + 1);
                t = run_llamacpp(&python, &scripts, &gguf, &m)?;
                if let Some(res) = t["results"].as_object() {
                    for (k, v) in res {
                        push(&mut theirs, k.clone(), v.as_f64().unwrap_or(f64::NAN));
                    }
                }
            }
        }
        their_mem = serde_json::json!({ "rss_mb": t["rss_mb"], "peak_rss_mb": t["peak_rss_mb"], "baseline_rss_mb": t["baseline_rss_mb"], "flash_attn": t["flash_attn"], "extra_bufts": t["extra_bufts"] });
    }
    let mem = memory(&model, &m);
    let gguf_mb = std::fs::metadata(&gguf)
        .map(|md| md.len() as f64 / (1024.0 * 1024.0))
        .unwrap_or(f64::NAN);
    let machine = machine.finish();
    // Per figure: each engine's median over rounds, and the ratio of the rounds' paired ratios.
    let figures: Vec<Figure> = ours
        .iter()
        .map(|(key, ours)| {
            let theirs = theirs
                .iter()
                .find(|(k, _)| k == key)
                .map_or(&[][..], |(_, v)| v.as_slice());
            let paired: Vec<f64> = ours.iter().zip(theirs).map(|(a, b)| a / b).collect();
            Figure {
                key: key.clone(),
                ours: crate::bench_stats::Spread::of(ours),
                theirs: crate::bench_stats::Spread::of(theirs),
                ratio: crate::bench_stats::Spread::of(&paired),
            }
        })
        .collect();
    let by = |f: fn(&Figure) -> serde_json::Value| -> serde_json::Map<String, serde_json::Value> {
        figures.iter().map(|x| (x.key.clone(), f(x))).collect()
    };
    let golden_json = golden
        .as_ref()
        .map(|(source, k, l)| serde_json::json!({ "source": source, "kamera": k, "llama.cpp": l }));
    let report = serde_json::json!({
        "model": m.model, "gguf": gguf.display().to_string(), "requant": m.requant, "gguf_mb": gguf_mb,
        "kl_to_hf": golden_json, "rounds": rounds, "threads": threads(),
        "statistic": "median over alternating rounds; spread [min, max]; ratio: median of the rounds' paired ratios",
        "prefill_precision": m.precision().to_string(), "kl_f32_vs_prefill_precision": kl,
        "decode_precision": model.decode_precision().to_string(),
        "decode_kl_f32_vs_precision": decode_kl,
        "kamera": { "results": by(|f| serde_json::json!(f.ours.median)), "spread": by(|f| serde_json::json!([f.ours.min, f.ours.max])), "memory": mem },
        "llama.cpp": { "results": by(|f| serde_json::json!(f.theirs.median)), "spread": by(|f| serde_json::json!([f.theirs.min, f.theirs.max])), "memory": their_mem },
        "ratio": by(|f| serde_json::json!(f.ratio.median)),
        "ratio_spread": by(|f| serde_json::json!([f.ratio.min, f.ratio.max])),
        "machine": machine,
    });
    if m.json {
        println!("{report}");
        return Ok(());
    }
    println!(
        "{}{} ({gguf_mb:.1} MB GGUF), medians of {rounds} alternating rounds [min-max], {} threads on both; llama.cpp flash attention {}",
        m.model,
        m.requant
            .as_deref()
            .map(|t| format!(" requantized to {t} by llama.cpp's quantize"))
            .unwrap_or_default(),
        threads(),
        if their_mem["flash_attn"].as_bool() == Some(true) {
            "on"
        } else {
            "off"
        }
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
    println!(
        "kamera {}",
        crate::bench::decode_precision_line(model.decode_precision(), decode_kl)
    );
    if let Some((source, k, l)) = &golden {
        let line = |s: &GoldenScore| {
            format!(
                "mean {:.2e}, max {:.2e}, top-1 equal {}/{}",
                s.mean_kl, s.max_kl, s.top1_equal, s.positions
            )
        };
        println!(
            "KL to HF transformers on the golden prompts ({source}): kamera {}; llama.cpp {}",
            line(k),
            line(l)
        );
    }
    println!("| figure | kamera | llama.cpp | kamera / llama.cpp |\n|---|---:|---:|---:|");
    for f in &figures {
        println!(
            "| {} | {:.1} [{:.1}-{:.1}] | {:.1} [{:.1}-{:.1}] | {:.2}x [{:.2}-{:.2}] |",
            f.key.replace("_tok_s", " tok/s"),
            f.ours.median,
            f.ours.min,
            f.ours.max,
            f.theirs.median,
            f.theirs.min,
            f.theirs.max,
            f.ratio.median,
            f.ratio.min,
            f.ratio.max
        );
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
        "{}, {} cores, load {} -> {}, commit {}",
        machine.cpu, machine.cores, machine.loadavg_start, machine.loadavg_end, machine.commit
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

/// Each figure's values, one per round, in the order first measured.
type Rounds = Vec<(String, Vec<f64>)>;

fn push(rounds: &mut Rounds, key: String, v: f64) {
    match rounds.iter_mut().find(|(k, _)| *k == key) {
        Some((_, vs)) => vs.push(v),
        None => rounds.push((key, vec![v])),
    }
}

/// One figure of both engines.
struct Figure {
    key: String,
    ours: crate::bench_stats::Spread,
    theirs: crate::bench_stats::Spread,
    ratio: crate::bench_stats::Spread,
}
