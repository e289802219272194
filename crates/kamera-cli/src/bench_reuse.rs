//! `kamera bench reuse`: relocate + patch of a chunk against its re-prefill, and revisit time
//! to first token against a full re-prefill, measured in one run (kamera-eval).

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Args;
use kamera_eval::{BenchConfig, bench_reuse};

#[derive(Args)]
pub struct ReuseArgs {
    /// Model name or path to a .gguf file.
    #[arg(long)]
    model: String,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 1024)]
    chunk_tokens: usize,
    /// Chunks reused by the revisit.
    #[arg(long, default_value_t = 4)]
    chunks: usize,
    /// Question tokens prefilled after the revisit.
    #[arg(long, default_value_t = 32)]
    question_tokens: usize,
    /// Patch rank.
    #[arg(long, default_value_t = 32)]
    rank: usize,
    /// Repetitions of the cheap measurements (median kept).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Storage type of the canonical KV and patches: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Where to write the JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: ReuseArgs) -> Result<()> {
    let model = crate::models::load(&a.model)?;
    let cfg = BenchConfig {
        chunk_tokens: a.chunk_tokens,
        chunks: a.chunks,
        question_tokens: a.question_tokens,
        rank: a.rank,
        reps: a.reps,
        dtype: a.dtype.clone(),
    };
    let r = bench_reuse(&model, &a.model, &cfg)?;
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?).with_context(|| format!("writing {}", p.display()))?;
    }
    print!("{}", r.markdown());
    Ok(())
}
