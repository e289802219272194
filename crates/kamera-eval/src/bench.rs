//! `kamera bench reuse`: the cost of reusing a chunk (relocate + patch) against re-prefilling
//! it, and the time to first token of a revisit (N chunks reused in a new order + question
//! prefill) against a full re-prefill of the same context, measured in one run.

use std::time::Instant;

use kamera_model::{Context, Model};
use kamera_ops::{DType, PatchConfig, Placement, assemble, form_patch, reuse};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ModelCtx, OpsCtx, Result};
use crate::generate::filler_text;

/// Benchmark shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    pub chunk_tokens: usize,
    pub chunks: usize,
    pub question_tokens: usize,
    /// Patch rank.
    pub rank: usize,
    /// Repetitions of the cheap measurements (median reported).
    pub reps: usize,
    /// Storage type of the canonical KV and the patch factors ("f32", "bf16" or "f16"); the
    /// assembled context is f32 (what the runner takes).
    #[serde(default = "default_dtype")]
    pub dtype: String,
}

fn default_dtype() -> String {
    "f32".into()
}

fn parse_dtype(s: &str) -> Result<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::Bf16),
        "f16" => Ok(DType::F16),
        _ => Err(Error::Invalid {
            op: "bench_reuse",
            detail: format!("dtype {s:?}: expected f32, bf16 or f16"),
        }),
    }
}

impl Default for BenchConfig {
    fn default() -> BenchConfig {
        BenchConfig {
            chunk_tokens: 1024,
            chunks: 4,
            question_tokens: 32,
            rank: 32,
            reps: 5,
            dtype: default_dtype(),
        }
    }
}

/// Measured times (ms) and their ratios.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub model: String,
    pub config: BenchConfig,
    /// Prefill of one chunk alone (mean over the chunks).
    pub chunk_prefill_ms: f64,
    /// Relocation of one chunk to a new position, no patch (median).
    pub relocate_ms: f64,
    /// Fused relocate + rank-R patch of one chunk (median).
    pub reuse_ms: f64,
    /// chunk_prefill_ms / reuse_ms.
    pub reuse_speedup: f64,
    /// chunk_prefill_ms / relocate_ms.
    pub relocate_speedup: f64,
    /// Conditioned prefill of all chunks (forms every chunk's patch).
    pub conditioned_prefill_ms: f64,
    /// SVD + truncation per chunk.
    pub patch_svd_ms: f64,
    pub patch_bytes_ratio: f64,
    /// Revisit: assemble N relocated + patched chunks in a new order (ms, median).
    pub revisit_assemble_ms: f64,
    /// Revisit: copy into the runner's context + question prefill (ms, median).
    pub revisit_question_ms: f64,
    /// revisit_assemble_ms + revisit_question_ms.
    pub revisit_ttft_ms: f64,
    /// Full re-prefill of system prefix + N chunks + question in the new order.
    pub full_ttft_ms: f64,
    /// full_ttft_ms / revisit_ttft_ms.
    pub ttft_speedup: f64,
    /// (conditioned prefill share per chunk + SVD) / (chunk prefill − reuse).
    pub break_even_reuses: f64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Exactly `n` tokens of page-like text, varied by `seed`.
fn tokens(model: &Model, seed: u64, n: usize) -> Result<Vec<u32>> {
    let mut sentences = n / 12 + 4;
    loop {
        let ids = model
            .tokenizer()
            .encode_raw(&filler_text(seed, sentences))
            .model("bench tokenize")?;
        if ids.len() >= n {
            return Ok(ids[..n].to_vec());
        }
        sentences *= 2;
    }
}

/// Runs the reuse benchmark.
pub fn bench_reuse(model: &Model, name: &str, cfg: &BenchConfig) -> Result<BenchReport> {
    if cfg.chunk_tokens == 0 || cfg.chunks == 0 || cfg.question_tokens == 0 {
        return Err(Error::Invalid {
            op: "bench_reuse",
            detail: format!(
                "chunk tokens, chunks and question tokens must be positive, got {}, {}, {}",
                cfg.chunk_tokens, cfg.chunks, cfg.question_tokens
            ),
        });
    }
    let dtype = parse_dtype(&cfg.dtype)?;
    let rope = model.rope();
    let reps = cfg.reps.max(1);
    let sys = crate::run::system_tokens(model, crate::run::DEFAULT_SYSTEM)?;
    let sys_ctx = if sys.is_empty() {
        model.empty_context()
    } else {
        Context::from_chunk(&model.prefill(&sys, 0, &model.empty_context()).model("bench sys")?.chunk)
            .model("bench sys")?
    };
    let start = sys.len() as i64;
    let chunks: Vec<Vec<u32>> = (0..cfg.chunks)
        .map(|i| tokens(model, 1000 + i as u64, cfg.chunk_tokens))
        .collect::<Result<_>>()?;
    let question = tokens(model, 999, cfg.question_tokens)?;
    let mut canon = Vec::new();
    let mut prefill_ms = Vec::new();
    for c in &chunks {
        let t = Instant::now();
        canon.push(model.prefill(c, start, &sys_ctx).model("bench canonical")?.chunk);
        prefill_ms.push(ms(t));
    }
    let chunk_prefill_ms = prefill_ms.iter().sum::<f64>() / prefill_ms.len() as f64;
    let all: Vec<u32> = chunks.concat();
    let t = Instant::now();
    let cond_all = model.prefill(&all, start, &sys_ctx).model("bench conditioned")?.chunk;
    let conditioned_prefill_ms = ms(t);
    let pcfg = PatchConfig::fixed(cfg.rank, dtype);
    let t = Instant::now();
    let mut patches = Vec::new();
    for (i, c) in canon.iter().enumerate() {
        let cond = crate::kv::slice(&cond_all, i * cfg.chunk_tokens, cfg.chunk_tokens)?;
        patches.push(form_patch(&cond, c, rope, &pcfg).ops("bench patch")?);
    }
    let patch_svd_ms = ms(t) / cfg.chunks as f64;
    let canon: Vec<_> = canon.iter().map(|c| c.to_dtype(dtype)).collect();
    let patch_bytes_ratio = patches[0].bytes_ratio(&canon[0]);
    let to = start + (cfg.chunk_tokens * (cfg.chunks - 1)) as i64 + 7;
    let mut reloc = Vec::new();
    let mut reused = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        std::hint::black_box(reuse(&canon[0], None, rope, to).ops("bench relocate")?);
        reloc.push(ms(t));
        let t = Instant::now();
        std::hint::black_box(reuse(&canon[0], Some(&patches[0]), rope, to).ops("bench reuse")?);
        reused.push(ms(t));
    }
    let (relocate_ms, reuse_ms) = (median(reloc), median(reused));
    // Revisit in the reverse order.
    let order: Vec<usize> = (0..cfg.chunks).rev().collect();
    let mut asm = Vec::new();
    let mut qms = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let parts: Vec<Placement<'_>> = order
            .iter()
            .map(|&i| Placement {
                chunk: &canon[i],
                patch: Some(&patches[i]),
            })
            .collect();
        let kv = assemble(&parts, rope, start, DType::F32).ops("bench revisit")?;
        asm.push(ms(t));
        let t = Instant::now();
        let mut ctx = sys_ctx.clone();
        ctx.push(&kv).model("bench revisit push")?;
        std::hint::black_box(model.prefill(&question, ctx.end(), &ctx).model("bench question")?);
        qms.push(ms(t));
    }
    let (revisit_assemble_ms, revisit_question_ms) = (median(asm), median(qms));
    let revisit_ttft_ms = revisit_assemble_ms + revisit_question_ms;
    let mut full: Vec<u32> = sys.clone();
    for &i in &order {
        full.extend(&chunks[i]);
    }
    full.extend(&question);
    let t = Instant::now();
    std::hint::black_box(model.prefill(&full, 0, &model.empty_context()).model("bench full")?);
    let full_ttft_ms = ms(t);
    let form = conditioned_prefill_ms / cfg.chunks as f64 + patch_svd_ms;
    Ok(BenchReport {
        model: name.to_string(),
        config: cfg.clone(),
        chunk_prefill_ms,
        relocate_ms,
        reuse_ms,
        reuse_speedup: chunk_prefill_ms / reuse_ms.max(1e-9),
        relocate_speedup: chunk_prefill_ms / relocate_ms.max(1e-9),
        conditioned_prefill_ms,
        patch_svd_ms,
        patch_bytes_ratio,
        revisit_assemble_ms,
        revisit_question_ms,
        revisit_ttft_ms,
        full_ttft_ms,
        ttft_speedup: full_ttft_ms / revisit_ttft_ms.max(1e-9),
        break_even_reuses: form / (chunk_prefill_ms - reuse_ms).max(1e-9),
    })
}

impl BenchReport {
    /// A small Markdown table.
    pub fn markdown(&self) -> String {
        let c = &self.config;
        format!(
            "| quantity | value |\n|---|---:|\n| model | {} |\n| chunk tokens x chunks, question tokens, rank | {} x {}, {}, {} |\n| chunk prefill ms | {:.1} |\n| relocate ms | {:.2} |\n| relocate + patch ms | {:.2} |\n| reuse speedup (prefill / relocate+patch) | {:.1}x |\n| relocate-only speedup | {:.1}x |\n| patch bytes / chunk KV bytes | {:.3} |\n| conditioned prefill ms (all chunks) | {:.1} |\n| SVD per chunk ms | {:.1} |\n| revisit assemble ms | {:.2} |\n| revisit question prefill ms | {:.1} |\n| revisit TTFT ms | {:.1} |\n| full re-prefill TTFT ms | {:.1} |\n| TTFT speedup | {:.1}x |\n| break-even reuses | {:.2} |\n",
            self.model,
            c.chunk_tokens,
            c.chunks,
            c.question_tokens,
            c.rank,
            self.chunk_prefill_ms,
            self.relocate_ms,
            self.reuse_ms,
            self.reuse_speedup,
            self.relocate_speedup,
            self.patch_bytes_ratio,
            self.conditioned_prefill_ms,
            self.patch_svd_ms,
            self.revisit_assemble_ms,
            self.revisit_question_ms,
            self.revisit_ttft_ms,
            self.full_ttft_ms,
            self.ttft_speedup,
            self.break_even_reuses
        )
    }
}
