//! `kamera bench reuse`: relocate + patch of a chunk against its re-prefill, and revisit time
//! to first token against a full re-prefill, measured in one run (kamera-eval on the CPU;
//! kamera-gpu's device model with `--device cuda`, bf16 weights and KV on the GPU).

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
    /// Repetitions of the cheap measurements (the best kept, as for the prefills: on a shared
    /// machine noise only adds time).
    #[arg(long, default_value_t = 15)]
    reps: usize,
    /// Storage type of the canonical KV and patches: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Where to write the JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where to run: cpu (kamera-eval, candle), cuda (the device model; needs a build with
    /// `--features cuda` and an NVIDIA GPU), or both (the CUDA table, then the CPU one).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda", "both"])]
    device: String,
    /// Vision-language models: the synthetic screenshot's size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1280x720")]
    image_size: String,
    /// Vision-language models: the screenshot's pixel budget (28x28 pixels per image token).
    #[arg(long, default_value_t = 28 * 28 * 256)]
    pixels: usize,
    /// Arithmetic of prefills of 32+ tokens on quantized weights (`f32` or `bf16`, the chunk's,
    /// the question's and the full re-prefill alike); default the fastest this CPU runs.
    #[arg(long)]
    prefill_precision: Option<kamera_model::PrefillPrecision>,
}

pub fn run(a: ReuseArgs) -> Result<()> {
    let model = crate::models::load_with(&a.model, a.prefill_precision)?;
    eprintln!("{}: prefill precision {}", a.model, model.prefill_precision());
    let mut json = serde_json::Map::new();
    if model.vision().is_some() {
        let size = a
            .image_size
            .split_once('x')
            .and_then(|(w, h)| Some([w.parse().ok()?, h.parse().ok()?]))
            .with_context(|| format!("--image-size {:?}: expected WIDTHxHEIGHT, e.g. 1280x720", a.image_size))?;
        let r = crate::bench_image::run(
            &model,
            size,
            a.pixels,
            a.chunk_tokens,
            a.question_tokens,
            a.rank,
            a.reps,
        )?;
        println!("## {}: a screenshot as an image chunk (CPU, f32)\n", a.model);
        print!("{}", r.markdown());
        println!("\n## {}: text chunks\n", a.model);
        json.insert("image".into(), serde_json::to_value(&r)?);
    }
    if a.device != "cpu" {
        let device = model
            .to_device(0)
            .context("--device cuda: the model could not be put on the GPU")?;
        let cfg = kamera_gpu::ModelBenchConfig {
            chunk_tokens: a.chunk_tokens,
            chunks: a.chunks,
            question_tokens: a.question_tokens,
            rank: a.rank,
            reps: a.reps,
            prefill_sizes: vec![a.chunk_tokens, a.chunks * a.chunk_tokens],
        };
        let f = device.bench_reuse(&cfg)?;
        println!("## {} on CUDA (bf16 weights and KV)\n", a.model);
        print!("{}", f.markdown());
        json.insert("cuda".into(), serde_json::to_value(&f)?);
        if a.device == "cuda" {
            return write_json(a.json.as_ref(), json);
        }
        println!("\n## {} on the CPU ({})\n", a.model, a.dtype);
    }
    let cfg = BenchConfig {
        chunk_tokens: a.chunk_tokens,
        chunks: a.chunks,
        question_tokens: a.question_tokens,
        rank: a.rank,
        reps: a.reps,
        dtype: a.dtype.clone(),
    };
    let r = bench_reuse(&model, &a.model, &cfg)?;
    print!("{}", r.markdown());
    if a.device == "cpu" {
        if let Some(p) = &a.json {
            std::fs::write(p, serde_json::to_string_pretty(&r)?).with_context(|| format!("writing {}", p.display()))?;
        }
        return Ok(());
    }
    json.insert("cpu".into(), serde_json::to_value(&r)?);
    write_json(a.json.as_ref(), json)
}

fn write_json(path: Option<&PathBuf>, v: serde_json::Map<String, serde_json::Value>) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
