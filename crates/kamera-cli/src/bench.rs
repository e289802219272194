//! `kamera bench model`: prefill tokens/s at given lengths, decode tokens/s and resident memory,
//! as a table or JSON; `--against llama.cpp` alternates with llama.cpp on the same GGUF; the other
//! `kamera bench` subcommands by module.

use std::time::Instant;

use anyhow::Result;
use clap::{Args, Subcommand};
use kamera_model::Model;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Prefill and decode throughput of one model.
    Model(ModelArgs),
    /// Reuse (relocate + patch) against re-prefill, and revisit time to first token.
    Reuse(crate::bench_reuse::ReuseArgs),
    /// A screenshot through a vision-language model's tower and image prefill, optionally
    /// against HF transformers on the same checkpoint.
    Vision(crate::bench_vision::VisionArgs),
    /// A long browsing session: the Kamera session vs a prefix cache vs full re-prefill.
    Session(crate::bench_session::SessionArgs),
    /// Put/get of a real chunk record on Redis, sled and a plain file vs re-prefilling it.
    Store(crate::bench_store::StoreBenchArgs),
    /// The model policy's success over MiniWoB++ tasks and the order-status flow, per model and
    /// decoding, on real Chromium.
    Agent(crate::bench_agent::AgentArgs),
}

#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Model name or path to a .gguf file.
    #[arg(long)]
    pub model: String,
    /// Prefill lengths in tokens.
    #[arg(long, value_delimiter = ',', default_values_t = vec![512usize, 2048])]
    pub prefill: Vec<usize>,
    /// Tokens to decode after each prompt length of --decode-after.
    #[arg(long, default_value_t = 64)]
    pub decode: usize,
    /// Prompt lengths before decoding (rows `decode` for 128, `decode_N` otherwise).
    #[arg(long, value_delimiter = ',', default_values_t = vec![128usize])]
    pub decode_after: Vec<usize>,
    /// Timed repetitions of each prefill (the best is kept).
    #[arg(long, default_value_t = 2)]
    pub reps: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also run this engine on the same GGUF, alternating with ours, and print ratios
    /// (`llama.cpp`: builds llama-cpp-python once with scripts/llamacpp-venv.sh).
    #[arg(long)]
    pub against: Option<String>,
    /// With --against llama.cpp: run both engines on the model's GGUF requantized by llama.cpp's
    /// own quantize (`q4_0` or `q8_0`: types llama.cpp has its fast x86 kernels for), made once
    /// and cached beside the model as `<name>.<type>.gguf`.
    #[arg(long, value_parser = ["q4_0", "q8_0"])]
    pub requant: Option<String>,
    /// Rounds of (ours, theirs) with --against; each figure is the median over rounds, with
    /// its range and the median of the rounds' paired ratios.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Arithmetic of prefills of 8+ tokens on quantized weights: `f32` (the reference) or
    /// `bf16` (AVX512_BF16 CPUs); default the fastest this CPU runs. With bf16 the bench also
    /// prints KL(f32 ‖ bf16) of the next-token distribution after the first prefill length.
    #[arg(long)]
    pub prefill_precision: Option<kamera_model::PrefillPrecision>,
    /// Arithmetic of decode steps on quantized weights: `f32` (the reference) or `int8` (the
    /// input row rounded to int8, AVX512-VNNI or AVX2 CPUs; opt-in: the runtime decodes in f32, since
    /// the Session reuses decoded tokens' rows in the next prompt); default f32.
    /// With int8 the bench also prints KL(f32 ‖ int8) over the decoded tokens.
    #[arg(long)]
    pub decode_precision: Option<kamera_model::DecodePrecision>,
}

impl ModelArgs {
    pub fn precision(&self) -> kamera_model::PrefillPrecision {
        self.prefill_precision
            .unwrap_or_else(kamera_model::PrefillPrecision::fastest)
    }
}

/// Sets `m`'s prefill precision and, when it is not f32, measures KL(f32 ‖ it) of the
/// next-token distribution after `n` filler tokens.
pub fn set_precision(model: &mut Model, m: &ModelArgs, n: usize) -> Result<Option<f64>> {
    let p = m.precision();
    model.set_prefill_precision(kamera_model::PrefillPrecision::F32)?;
    if p == kamera_model::PrefillPrecision::F32 {
        return Ok(None);
    }
    let ids = tokens(model, n)?;
    let reference = model.prefill(&ids, 0, &model.empty_context())?.logits;
    model.set_prefill_precision(p)?;
    let fast = model.prefill(&ids, 0, &model.empty_context())?.logits;
    Ok(Some(kamera_eval::kl(&reference, &fast)))
}

/// Sets `m`'s decode precision and, when it is not f32, measures KL(f32 ‖ it) of each decoded
/// token's next-token distribution (both decode the f32 run's tokens after `prompt` filler
/// tokens).
pub fn set_decode_precision(model: &mut Model, m: &ModelArgs, prompt: usize) -> Result<Option<DecodeKl>> {
    let p = m.decode_precision.unwrap_or(model.decode_precision());
    if p == kamera_model::DecodePrecision::F32 {
        model.set_decode_precision(p)?;
        return Ok(None);
    }
    let steps = m.decode.clamp(1, 32);
    let run = |model: &Model, feed: Option<&[u32]>| -> Result<(Vec<Vec<f32>>, Vec<u32>)> {
        let mut ctx = model.empty_context();
        let out = model.extend(&tokens(model, prompt.max(1))?, &mut ctx)?;
        let (mut logits, mut ids) = (Vec::new(), Vec::new());
        let mut next = kamera_model::argmax(&out.logits);
        for i in 0..steps {
            let id = feed.map_or(next, |f| f[i]);
            let out = model.extend(&[id], &mut ctx)?;
            next = kamera_model::argmax(&out.logits);
            ids.push(id);
            logits.push(out.logits);
        }
        Ok((logits, ids))
    };
    model.set_decode_precision(kamera_model::DecodePrecision::F32)?;
    let (reference, ids) = run(model, None)?;
    model.set_decode_precision(p)?;
    let (fast, _) = run(model, Some(&ids))?;
    let kls: Vec<f64> = reference
        .iter()
        .zip(&fast)
        .map(|(a, b)| kamera_eval::kl(a, b))
        .collect();
    let same = reference
        .iter()
        .zip(&fast)
        .filter(|(a, b)| kamera_model::argmax(a) == kamera_model::argmax(b))
        .count();
    Ok(Some(DecodeKl {
        mean: kls.iter().sum::<f64>() / kls.len() as f64,
        max: kls.iter().copied().fold(0.0, f64::max),
        same_token: same as f64 / steps as f64,
    }))
}

/// KL(f32 ‖ the decode precision) of decoded tokens' next-token distributions
/// ([`set_decode_precision`]).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct DecodeKl {
    pub mean: f64,
    pub max: f64,
    /// Share of steps with the same greedy token.
    pub same_token: f64,
}

/// `decode precision P` and, when measured, its KL to f32: the line both model benches print.
pub fn decode_precision_line(p: kamera_model::DecodePrecision, kl: Option<DecodeKl>) -> String {
    match kl {
        Some(k) => format!(
            "decode precision {p}: KL(f32 || {p}) over decoded tokens mean {:.2e}, max {:.2e} nats, same token {:.0}%",
            k.mean,
            k.max,
            100.0 * k.same_token
        ),
        None => format!("decode precision {p}"),
    }
}

/// Deterministic filler tokens: the tokenization of a long plain-English text.
pub fn tokens(model: &Model, n: usize) -> Result<Vec<u32>> {
    let text = "The quick brown fox jumps over the lazy dog while the farmer counts sheep in the valley. ";
    let mut ids = Vec::new();
    while ids.len() < n {
        ids.extend(model.tokenizer().encode_raw(text)?);
    }
    ids.truncate(n);
    Ok(ids)
}

pub fn run(a: BenchArgs) -> Result<()> {
    match a.command {
        BenchCommand::Reuse(r) => crate::bench_reuse::run(r),
        BenchCommand::Vision(v) => crate::bench_vision::run(v),
        BenchCommand::Session(s) => crate::bench_session::run(s),
        BenchCommand::Store(s) => crate::bench_store::run(s),
        BenchCommand::Agent(s) => crate::bench_agent::run(s),
        BenchCommand::Model(m) if m.against.is_some() => crate::bench_llamacpp::run(m),
        BenchCommand::Model(m) => {
            if let Some(ty) = &m.requant {
                anyhow::bail!(
                    "--requant {ty}: the requantized file is made by llama.cpp's quantize for the comparison; add --against llama.cpp"
                );
            }
            let mut model = crate::models::load(&m.model)?;
            let kl = set_precision(&mut model, &m, m.prefill.first().copied().unwrap_or(512))?;
            let decode_kl = set_decode_precision(&mut model, &m, m.decode_after.first().copied().unwrap_or(128))?;
            let before = kamera_model::decode_team_stats();
            let rows = measure(&model, &m)?;
            let team = kamera_model::decode_team_stats().since(before);
            if m.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "model": m.model, "engine": "kamera", "prefill_precision": m.precision().to_string(),
                        "kl_f32_vs_prefill_precision": kl, "results": to_json(&rows), "memory": memory(&model, &m),
                        "decode_precision": model.decode_precision().to_string(),
                        "decode_kl_f32_vs_precision": decode_kl,
                        "decode_team": team, "threads": rayon::current_num_threads(),
                    })
                );
            } else {
                println!("{:<14} prefill precision {}", m.model, m.precision());
                if let Some(kl) = kl {
                    println!(
                        "{:<14} KL(f32 || {}) of the next token after prefill: {kl:.3e} nats",
                        m.model,
                        m.precision()
                    );
                }
                println!(
                    "{:<14} {}",
                    m.model,
                    decode_precision_line(model.decode_precision(), decode_kl)
                );
                for (k, v) in rows {
                    println!("{:<14} {k:<14} {v:>10.1} tok/s", m.model);
                }
                println!(
                    "{:<14} decode steps on {} threads: {} by the team, {} alone after contention ({} contended)",
                    m.model,
                    rayon::current_num_threads(),
                    team.team_steps,
                    team.solo_steps,
                    team.contended_steps
                );
                let mem = memory(&model, &m);
                println!(
                    "{:<14} weights {:.1} MB, KV {:.1} MB, resident {:.1} MB (peak {:.1} MB)",
                    m.model,
                    mem["weights_mb"].as_f64().unwrap_or(f64::NAN),
                    mem["kv_mb"].as_f64().unwrap_or(f64::NAN),
                    mem["rss_mb"].as_f64().unwrap_or(f64::NAN),
                    mem["peak_rss_mb"].as_f64().unwrap_or(f64::NAN)
                );
            }
            Ok(())
        }
    }
}

/// Prefill tokens/s per length (best of `reps`) and decode tokens/s per prompt length.
pub fn measure(model: &Model, m: &ModelArgs) -> Result<Vec<(String, f64)>> {
    let mut rows = Vec::new();
    for &n in &m.prefill {
        let ids = tokens(model, n)?;
        let mut best = f64::INFINITY;
        for _ in 0..m.reps.max(1) {
            let t = Instant::now();
            model.prefill(&ids, 0, &model.empty_context())?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        rows.push((format!("prefill_{n}"), n as f64 / best));
    }
    for &after in m.decode_after.iter().filter(|_| m.decode > 0) {
        let prompt = tokens(model, after.max(1))?;
        let mut ctx = model.empty_context();
        let out = model.extend(&prompt, &mut ctx)?;
        let mut next = kamera_model::argmax(&out.logits);
        let t = Instant::now();
        for _ in 0..m.decode {
            let out = model.extend(&[next], &mut ctx)?;
            next = kamera_model::argmax(&out.logits);
        }
        let row = if after == 128 {
            "decode".to_string()
        } else {
            format!("decode_{after}")
        };
        rows.push((row, m.decode as f64 / t.elapsed().as_secs_f64()));
    }
    Ok(rows)
}

pub fn to_json(rows: &[(String, f64)]) -> serde_json::Value {
    let obj: serde_json::Map<String, serde_json::Value> = rows
        .iter()
        .map(|(k, v)| (format!("{k}_tok_s"), serde_json::json!(v)))
        .collect();
    serde_json::Value::Object(obj)
}

/// This process's memory (`VmRSS` / `VmHWM` from /proc) beside the weights' resident bytes and
/// the f32 KV of the longest context the bench builds.
pub fn memory(model: &Model, m: &ModelArgs) -> serde_json::Value {
    let w = model.weight_bytes();
    let cfg = model.config();
    let longest = m
        .prefill
        .iter()
        .copied()
        .chain(m.decode_after.iter().map(|a| a + m.decode))
        .max()
        .unwrap_or(0);
    let kv = (cfg.n_layers * longest * cfg.kv_dim() * 2 * 4) as f64;
    let mb = |b: f64| b / (1024.0 * 1024.0);
    serde_json::json!({
        "weights_mb": mb(w.total as f64),
        "weights_quantized_mb": w.quantized.iter().map(|(k, v)| (k.clone(), serde_json::json!(mb(*v as f64)))).collect::<serde_json::Map<_, _>>(),
        "weights_dense_mb": mb(w.dense as f64),
        "kv_mb": mb(kv),
        "rss_mb": proc_status_mb("VmRSS"),
        "peak_rss_mb": proc_status_mb("VmHWM"),
    })
}

/// This process's command line as a report prints it: `kamera` and the arguments as given.
pub fn command_line() -> String {
    std::env::args()
        .enumerate()
        .map(|(i, s)| if i == 0 { "kamera".to_string() } else { s })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A `kB` line of /proc/self/status in MB (NaN where there is none).
pub fn proc_status_mb(key: &str) -> f64 {
    proc_kb("/proc/self/status", key).map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The `KEY:  N kB` line of a /proc file (`status`, `smaps_rollup`), in kB.
pub fn proc_kb(path: &str, key: &str) -> Option<f64> {
    std::fs::read_to_string(path).ok().and_then(|s| {
        s.lines().find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
        })
    })
}
