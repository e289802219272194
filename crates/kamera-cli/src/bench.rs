//! `kamera bench model`: prefill tokens/s at given lengths and decode tokens/s, as a table or JSON;
//! the other `kamera bench` subcommands by module.

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
    Model {
        /// Model name or path to a .gguf file.
        #[arg(long)]
        model: String,
        /// Prefill lengths in tokens.
        #[arg(long, value_delimiter = ',', default_values_t = vec![512usize, 2048])]
        prefill: Vec<usize>,
        /// Tokens to decode after each prompt length of --decode-after.
        #[arg(long, default_value_t = 64)]
        decode: usize,
        /// Prompt lengths before decoding (rows `decode` for 128, `decode_N` otherwise).
        #[arg(long, value_delimiter = ',', default_values_t = vec![128usize])]
        decode_after: Vec<usize>,
        /// Timed repetitions of each prefill (the best is kept).
        #[arg(long, default_value_t = 2)]
        reps: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Reuse (relocate + patch) against re-prefill, and revisit time to first token.
    Reuse(crate::bench_reuse::ReuseArgs),
    /// A long browsing session: the Kamera session vs a prefix cache vs full re-prefill.
    Session(crate::bench_session::SessionArgs),
    /// Put/get of a real chunk record on Redis, sled and a plain file vs re-prefilling it.
    Store(crate::bench_store::StoreBenchArgs),
    /// The model policy's success over MiniWoB++ tasks and the order-status flow, per model and
    /// decoding, on real Chromium.
    Agent(crate::bench_agent::AgentArgs),
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
    let (name, prefill, decode, decode_after, reps, json) = match a.command {
        BenchCommand::Reuse(r) => return crate::bench_reuse::run(r),
        BenchCommand::Session(s) => return crate::bench_session::run(s),
        BenchCommand::Store(s) => return crate::bench_store::run(s),
        BenchCommand::Agent(s) => return crate::bench_agent::run(s),
        BenchCommand::Model {
            model,
            prefill,
            decode,
            decode_after,
            reps,
            json,
        } => (model, prefill, decode, decode_after, reps, json),
    };
    let model = crate::models::load(&name)?;
    let mut rows = Vec::new();
    for &n in &prefill {
        let ids = tokens(&model, n)?;
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            model.prefill(&ids, 0, &model.empty_context())?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        rows.push((format!("prefill_{n}"), n as f64 / best));
    }
    for &after in decode_after.iter().filter(|_| decode > 0) {
        let prompt = tokens(&model, after.max(1))?;
        let mut ctx = model.empty_context();
        let out = model.extend(&prompt, &mut ctx)?;
        let mut next = kamera_model::argmax(&out.logits);
        let t = Instant::now();
        for _ in 0..decode {
            let out = model.extend(&[next], &mut ctx)?;
            next = kamera_model::argmax(&out.logits);
        }
        let row = if after == 128 {
            "decode".to_string()
        } else {
            format!("decode_{after}")
        };
        rows.push((row, decode as f64 / t.elapsed().as_secs_f64()));
    }
    if json {
        let obj: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(k, v)| (format!("{k}_tok_s"), serde_json::json!(v)))
            .collect();
        println!(
            "{}",
            serde_json::json!({ "model": name, "engine": "kamera", "results": obj })
        );
    } else {
        for (k, v) in rows {
            println!("{name:<14} {k:<14} {v:>10.1} tok/s");
        }
    }
    Ok(())
}
