//! `kamera bench reuse`: relocate + patch of a chunk against its re-prefill, and the revisit's
//! time to first token against a full re-prefill, measured in one run on the CPU (with
//! `--device cuda`, kamera-gpu's device model too, bf16 weights and KV on the GPU).
//!
//! Method: every speed is a ratio over pairs measured in alternation (which side goes first
//! alternates), reported as the median with its interquartile range; memcpy and relocation are
//! timed at the same thread count (one thread, and every thread of the pool), beside a
//! STREAM-style copy on every thread as the bandwidth ceiling; the revisit is the runtime's own
//! path (a `Session`: window plan, kamera-sched's executor, session encoder, live context) with
//! patches formed for the context they are used in, and its next-token KL to the full re-prefill
//! is printed beside its speed. The JSON records the CPU, cores, load, precision and commit.

#[path = "bench_reuse_ops.rs"]
mod ops;
#[path = "bench_reuse_revisit.rs"]
mod revisit;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::Args;
use kamera_agent::Llm;
use kamera_model::Model;
use kamera_ops::DType;
use serde::Serialize;

use crate::bench_session_report::Machine;

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
    /// Repetitions of the copy and relocation measurements (median and spread reported).
    #[arg(long, default_value_t = 15)]
    reps: usize,
    /// Pairs of (prefill, reuse) and of (full re-prefill, revisit), alternating which goes first
    /// (at least 5).
    #[arg(long, default_value_t = 7)]
    pairs: usize,
    /// Storage type of the canonical KV and patches of the chunk figures (f32, bf16 or f16), and
    /// of the revisit's patch factors (the session keeps its KV in f32).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Where to write the JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where to run: cpu (kamera-model on candle), cuda (the device model; needs a build with
    /// `--features cuda` and an NVIDIA GPU), or both (the CUDA table, then the CPU one).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda", "both"])]
    device: String,
    /// Vision-language models: the synthetic screenshot's size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1280x720")]
    image_size: String,
    /// Vision-language models: the screenshot's pixel budget (28x28 pixels per image token).
    #[arg(long, default_value_t = 28 * 28 * 256)]
    pixels: usize,
    /// Arithmetic of prefills of 8+ tokens on quantized weights (`f32` or `bf16`, the chunk's,
    /// the question's and the full re-prefill alike); default the fastest this CPU runs.
    #[arg(long)]
    prefill_precision: Option<kamera_model::PrefillPrecision>,
}

pub fn run(a: ReuseArgs) -> Result<()> {
    #[cfg(not(feature = "cuda"))]
    if a.device != "cpu" {
        anyhow::bail!(
            "--device {}: this kamera was built without CUDA (cargo build --release -p kamera-cli --features cuda)",
            a.device
        );
    }
    let machine = Machine::now();
    let model = crate::models::load_with(&a.model, a.prefill_precision)?;
    eprintln!("{}: prefill precision {}", a.model, model.prefill_precision());
    let mut json = serde_json::Map::new();
    if model.vision().is_some() {
        let size = parse_size("--image-size", &a.image_size)?;
        let r = crate::bench_image::run(
            &model,
            size,
            a.pixels,
            a.chunk_tokens,
            a.question_tokens,
            a.rank,
            a.reps,
        )?;
        println!(
            "## {}: a screenshot as an image chunk (CPU, {} prefill)\n",
            a.model,
            model.prefill_precision()
        );
        print!("{}", r.markdown());
        println!("\n## {}: text chunks\n", a.model);
        json.insert("image".into(), serde_json::to_value(&r)?);
    }
    #[cfg(feature = "cuda")]
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
            return write_json(a.json.as_ref(), machine.finish(), json);
        }
        println!("\n## {} on the CPU ({})\n", a.model, a.dtype);
    }
    let r = cpu(Arc::new(model), &a)?;
    print!("{}", r.markdown());
    let machine = machine.finish();
    println!("{}", machine_line(&machine, r.threads));
    json.insert("cpu".into(), serde_json::to_value(&r)?);
    write_json(a.json.as_ref(), machine, json)
}

/// The CPU figures of the text chunks.
#[derive(Debug, Clone, Serialize)]
pub struct ReuseReport {
    pub model: String,
    /// rayon's pool: the relocation's, candle's, and the same-thread memcpy's at full count.
    pub threads: usize,
    /// Arithmetic of the prefills (the chunk's, the question's, the full re-prefill's).
    pub prefill_precision: String,
    /// Storage type of the chunk figures' canonical KV and patch factors.
    pub dtype: String,
    pub chunk_tokens: usize,
    pub chunks: usize,
    pub question_tokens: usize,
    pub rank: usize,
    pub reps: usize,
    pub pairs: usize,
    pub chunk: ops::ChunkFigures,
    pub limits: ops::Limits,
    pub revisit: revisit::Revisit,
}

fn parse_dtype(s: &str) -> Result<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::Bf16),
        "f16" => Ok(DType::F16),
        _ => anyhow::bail!("--dtype {s:?}: expected f32, bf16 or f16"),
    }
}

fn cpu(model: Arc<Model>, a: &ReuseArgs) -> Result<ReuseReport> {
    anyhow::ensure!(
        a.chunk_tokens > 0 && a.chunks > 0 && a.question_tokens > 0,
        "--chunk-tokens, --chunks and --question-tokens must be positive"
    );
    anyhow::ensure!(a.pairs >= 5, "--pairs {}: at least 5", a.pairs);
    let dtype = parse_dtype(&a.dtype)?;
    let llm = Llm::new(model.clone());
    let goal = "Answer questions about the pages.";
    let prefix = llm.tokens(&llm.prefix_text(goal), true)?;
    let pages: Vec<(String, Vec<u32>)> = (0..a.chunks)
        .map(|i| revisit::page_text(&llm, 1000 + i as u64, a.chunk_tokens))
        .collect::<Result<_>>()?;
    let chunks: Vec<Vec<u32>> = pages.iter().map(|p| p.1[..a.chunk_tokens].to_vec()).collect();
    let (_, question) = revisit::page_text(&llm, 999, a.question_tokens)?;
    let question = &question[..a.question_tokens];
    eprintln!("chunk figures: {} pairs of (prefill, relocate + patch)...", a.pairs);
    let (chunk, canon, patch) = ops::chunk_figures(&model, &prefix, &chunks, a.rank, dtype, a.pairs)?;
    eprintln!("limits: memcpy, relocation and STREAM copy...");
    let to = (prefix.len() + a.chunk_tokens * (a.chunks - 1)) as i64 + 7;
    let limits = ops::limits(&canon, &patch, model.rope(), to, a.reps)?;
    eprintln!("revisit: {} pairs of (full re-prefill, session revisit)...", a.pairs);
    let revisit = revisit::revisit(
        &model,
        &revisit::RevisitConfig {
            goal,
            pages: &pages,
            question,
            rank: a.rank,
            patch_dtype: dtype,
            pairs: a.pairs,
        },
    )?;
    Ok(ReuseReport {
        model: a.model.clone(),
        threads: rayon::current_num_threads(),
        prefill_precision: model.prefill_precision().to_string(),
        dtype: a.dtype.clone(),
        chunk_tokens: a.chunk_tokens,
        chunks: a.chunks,
        question_tokens: a.question_tokens,
        rank: a.rank,
        reps: a.reps,
        pairs: a.pairs,
        chunk,
        limits,
        revisit,
    })
}

impl ReuseReport {
    /// The table: medians with [interquartile range] over the pairs or repetitions.
    pub fn markdown(&self) -> String {
        let c = &self.chunk;
        let l = &self.limits;
        let r = &self.revisit;
        let mut s = format!(
            "| quantity | value |\n|---|---:|\n\
             | model, prefill precision, KV and factors | {}, {}, {} |\n\
             | chunk tokens x chunks, question tokens, rank | {} x {}, {}, {} |\n\
             | chunk prefill ms ({} pairs) | {} |\n\
             | relocate ms (into a new buffer, as the executor places) | {} |\n\
             | relocate + patch ms | {} |\n\
             | **reuse speedup** (prefill / relocate + patch, per pair) | **{}x** |\n\
             | relocate-only speedup (the same) | {}x |\n\
             | patch bytes / chunk KV bytes | {:.3} |\n\
             | conditioned prefill ms (all chunks), SVD per chunk ms, break-even reuses | {:.1}, {:.1}, {:.2} |\n",
            self.model,
            self.prefill_precision,
            self.dtype,
            self.chunk_tokens,
            self.chunks,
            self.question_tokens,
            self.rank,
            self.pairs,
            c.prefill_ms.md(1),
            c.relocate_ms.md(2),
            c.reuse_ms.md(2),
            c.reuse_speedup.md(1),
            c.relocate_speedup.md(1),
            c.patch_bytes_ratio,
            c.conditioned_prefill_ms,
            c.patch_svd_ms,
            c.break_even_reuses,
        );
        for t in &l.same_threads {
            s += &format!(
                "| {n} thread{pl}: memcpy of the chunk's f32 bytes, ms and GB/s | {}, {:.1} |\n\
                 | {n} thread{pl}: relocate f32 ms, GB/s, of memcpy | {}, {:.1}, {:.0}% |\n\
                 | {n} thread{pl}: relocate bf16 ms, GB/s, of memcpy | {}, {:.1}, {:.0}% |\n\
                 | {n} thread{pl}: relocate + patch into a context's rows, f32 / bf16 ms; patch GFLOP/s | {} / {}; {:.1} |\n",
                t.memcpy_ms.md(2),
                t.memcpy_gbs,
                t.relocate_f32_ms.md(2),
                t.relocate_f32_gbs,
                100.0 * t.relocate_f32_of_memcpy,
                t.relocate_bf16_ms.md(2),
                t.relocate_bf16_gbs,
                100.0 * t.relocate_bf16_of_memcpy,
                t.reuse_f32_ms.md(2),
                t.reuse_bf16_ms.md(2),
                t.patch_gflops,
                n = t.threads,
                pl = if t.threads == 1 { "" } else { "s" },
            );
        }
        let ceiling = l.stream.best_gbs.max(1e-9);
        let full = l.same_threads.last();
        s += &format!(
            "| STREAM copy, {} threads, 2 x {} MB: GB/s best, median | {:.1}, {:.1} |\n\
             | relocate f32 on every thread, of STREAM best | {:.0}% |\n\
             | revisit (Session: plan, executor recall + place, live context): place ms | {} |\n\
             | revisit: question prefill ms | {} |\n\
             | revisit TTFT ms | {} |\n\
             | full re-prefill ms ({} prefix + {} chunk + {} question tokens) | {} |\n\
             | **TTFT speedup** (full / revisit, per pair) | **{}x** |\n\
             | **revisit KL to the full re-prefill** (next token), same argmax | **{:.2e}**, {} |\n\
             | revisit placement GB/s (KV read + written), of STREAM best | {:.1}, {:.0}% |\n",
            l.stream.threads,
            l.stream.bytes >> 20,
            l.stream.best_gbs,
            l.stream.median_gbs,
            full.map_or(0.0, |t| 100.0 * t.relocate_f32_gbs / ceiling),
            r.place_ms.md(1),
            r.question_ms.md(1),
            r.ttft_ms.md(1),
            r.prefix_tokens,
            r.chunk_tokens.iter().sum::<usize>(),
            r.question_tokens,
            r.full_ms.md(0),
            r.speedup.md(1),
            r.kl,
            if r.top1_agree { "yes" } else { "no" },
            r.place_gbs,
            100.0 * r.place_gbs / ceiling,
        );
        if r.blind_by_default {
            s += "\nThe revisit times the patched recall; with this model's measured blind KL within the cost model's budget, the runtime's default would place these chunks blind (no patch read or applied).\n";
        }
        s
    }
}

fn machine_line(m: &Machine, threads: usize) -> String {
    format!(
        "\n{} UTC; {} ({} cores, {threads} threads); load {} at the start, {} at the end; commit {}.",
        m.date, m.cpu, m.cores, m.loadavg_start, m.loadavg_end, m.commit
    )
}

fn write_json(
    path: Option<&PathBuf>,
    machine: Machine,
    mut v: serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    if let Some(p) = path {
        v.insert("machine".into(), serde_json::to_value(&machine)?);
        std::fs::write(p, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// A `WIDTHxHEIGHT` flag (`--image-size`, `--viewport`).
pub(crate) fn parse_size(flag: &str, s: &str) -> Result<[usize; 2]> {
    s.split_once('x')
        .and_then(|(w, h)| Some([w.parse().ok()?, h.parse().ok()?]))
        .filter(|[w, h]: &[usize; 2]| *w > 0 && *h > 0)
        .with_context(|| format!("{flag} {s:?}: expected WIDTHxHEIGHT, e.g. 1280x720"))
}
