//! `kamera bench reuse`: the cost of reusing a chunk (relocate + patch) against re-prefilling
//! it, and the time to first token of a revisit (N chunks reused in a new order + question
//! prefill) against a full re-prefill of the same context, measured in one run.

use std::time::Instant;

use kamera_model::{Context, Model};
use kamera_ops::{DType, PatchConfig, Placement, form_patch, reuse, reuse_into};
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
    /// Repetitions of the cheap measurements (the best reported).
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
            reps: 15,
            dtype: default_dtype(),
        }
    }
}

/// Measured times (ms) and their ratios.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub model: String,
    pub config: BenchConfig,
    /// Prefill of one chunk alone (the best over the chunks).
    pub chunk_prefill_ms: f64,
    /// Relocation of one chunk to a new position, no patch (best).
    pub relocate_ms: f64,
    /// Fused relocate + rank-R patch of one chunk (best).
    pub reuse_ms: f64,
    /// Chunk prefill / relocate + patch, the median over one pair per chunk measured back to
    /// back (a prefill, then the best of the repetitions).
    pub reuse_speedup: f64,
    /// The same for relocation alone.
    pub relocate_speedup: f64,
    /// Conditioned prefill of all chunks (forms every chunk's patch).
    pub conditioned_prefill_ms: f64,
    /// SVD + truncation per chunk.
    pub patch_svd_ms: f64,
    pub patch_bytes_ratio: f64,
    /// Revisit: assemble N relocated + patched chunks in a new order (ms, best).
    pub revisit_assemble_ms: f64,
    /// Revisit: the question's prefill appended to the placed context in place (ms, best).
    pub revisit_question_ms: f64,
    /// revisit_assemble_ms + revisit_question_ms.
    pub revisit_ttft_ms: f64,
    /// Full re-prefill of system prefix + N chunks + question in the new order (best of 3).
    pub full_ttft_ms: f64,
    /// Full re-prefill / revisit, the median over three pairs measured back to back (a full
    /// re-prefill, then the best of its revisits).
    pub ttft_speedup: f64,
    /// (conditioned prefill share per chunk + SVD) / (chunk prefill − reuse).
    pub break_even_reuses: f64,
    /// Machine limits measured in the same run, for the reuse path as a fraction of them.
    #[serde(default)]
    pub limits: Option<Limits>,
}

/// Throughput of the reuse path against a memory copy of the same bytes, measured in one run
/// (bytes counted read + written; the patch as 2·n·rank·features flops per channel and layer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// One chunk's KV bytes in f32 and bf16.
    pub chunk_bytes_f32: usize,
    pub chunk_bytes_bf16: usize,
    /// memcpy of a buffer of the chunk's f32 size, GB/s (read + written).
    pub memcpy_gbs: f64,
    /// Relocation of the f32 and the bf16 chunk into an existing buffer, ms and GB/s.
    pub relocate_f32_ms: f64,
    pub relocate_f32_gbs: f64,
    pub relocate_bf16_ms: f64,
    pub relocate_bf16_gbs: f64,
    /// Relocate + patch of the bf16 chunk (bf16 factors) into an existing buffer, ms.
    pub reuse_bf16_ms: f64,
    /// Relocate + patch of the f32 chunk into an existing buffer (a context's rows), ms.
    #[serde(default)]
    pub reuse_f32_ms: f64,
    /// The patch's GFLOP/s: its flops over (relocate + patch − relocate), f32 chunk.
    pub patch_gflops: f64,
    /// The revisit's placement of every chunk into the context, GB/s of KV written (and read).
    pub assemble_gbs: f64,
}

/// The fastest of the repetitions: on a shared machine the noise only ever adds time (swings of
/// up to 2x within minutes), so each figure, and both sides of every ratio, is its best.
fn best(xs: Vec<f64>) -> f64 {
    xs.into_iter().reduce(f64::min).unwrap_or(0.0)
}

/// The middle value (the upper one of an even count).
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
    // Ratios in pairs measured back to back (each chunk prefilled again, then relocated and
    // reused `per` times): the machine's slow spells last seconds, so both sides of a pair see
    // the same machine; the speedups are the median over the pairs.
    let per = reps.div_ceil(cfg.chunks);
    let (mut reloc, mut reused, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
    for (i, c) in chunks.iter().enumerate() {
        let t = Instant::now();
        std::hint::black_box(model.prefill(c, start, &sys_ctx).model("bench canonical")?);
        let prefill = ms(t);
        prefill_ms.push(prefill);
        let (mut r, mut p) = (Vec::new(), Vec::new());
        for _ in 0..per {
            let t = Instant::now();
            std::hint::black_box(reuse(&canon[i], None, rope, to).ops("bench relocate")?);
            r.push(ms(t));
            let t = Instant::now();
            std::hint::black_box(reuse(&canon[i], Some(&patches[i]), rope, to).ops("bench reuse")?);
            p.push(ms(t));
        }
        let (r, p) = (best(r), best(p));
        pairs.push((prefill / r.max(1e-9), prefill / p.max(1e-9)));
        reloc.push(r);
        reused.push(p);
    }
    let chunk_prefill_ms = best(prefill_ms);
    let relocate_speedup = median(pairs.iter().map(|p| p.0).collect());
    let reuse_speedup = median(pairs.iter().map(|p| p.1).collect());
    let (relocate_ms, reuse_ms) = (best(reloc), best(reused));
    let limits = limits(&canon[0], &patches[0], rope, to, reps, relocate_ms, reuse_ms)?;
    // Revisit in the reverse order.
    let order: Vec<usize> = (0..cfg.chunks).rev().collect();
    let mut asm = Vec::new();
    let mut qms = Vec::new();
    let parts: Vec<Placement<'_>> = order
        .iter()
        .map(|&i| Placement {
            chunk: &canon[i],
            patch: Some(&patches[i]),
        })
        .collect();
    let mut full: Vec<u32> = sys.clone();
    for &i in &order {
        full.extend(&chunks[i]);
    }
    full.extend(&question);
    // The chunks are placed straight into the runner's context and the question is appended in
    // place (Model::extend): no intermediate buffer, no copy of the context. The context's buffers
    // are allocated and touched once first, as a running session's are.
    let mut ctx = sys_ctx.clone();
    ctx.place(&parts, rope).model("bench revisit place")?;
    model.extend(&question, &mut ctx).model("bench question")?;
    // Three pairs of (full re-prefill, then revisits), as for the chunks.
    let mut full_ms = Vec::new();
    let mut ttft_pairs = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        std::hint::black_box(model.prefill(&full, 0, &model.empty_context()).model("bench full")?);
        let full_pass = ms(t);
        full_ms.push(full_pass);
        let mut fastest = f64::INFINITY;
        for _ in 0..reps.div_ceil(3) {
            ctx.truncate(sys_ctx.len());
            let t = Instant::now();
            ctx.place(&parts, rope).model("bench revisit place")?;
            let placed = ms(t);
            let t = Instant::now();
            std::hint::black_box(model.extend(&question, &mut ctx).model("bench question")?);
            let asked = ms(t);
            asm.push(placed);
            qms.push(asked);
            fastest = fastest.min(placed + asked);
        }
        ttft_pairs.push(full_pass / fastest.max(1e-9));
    }
    let (revisit_assemble_ms, revisit_question_ms) = (best(asm), best(qms));
    let revisit_ttft_ms = revisit_assemble_ms + revisit_question_ms;
    let full_ttft_ms = best(full_ms);
    let form = conditioned_prefill_ms / cfg.chunks as f64 + patch_svd_ms;
    Ok(BenchReport {
        model: name.to_string(),
        config: cfg.clone(),
        chunk_prefill_ms,
        relocate_ms,
        reuse_ms,
        reuse_speedup,
        relocate_speedup,
        conditioned_prefill_ms,
        patch_svd_ms,
        patch_bytes_ratio,
        revisit_assemble_ms,
        revisit_question_ms,
        revisit_ttft_ms,
        full_ttft_ms,
        ttft_speedup: median(ttft_pairs),
        break_even_reuses: form / (chunk_prefill_ms - reuse_ms).max(1e-9),
        limits: Some(Limits {
            assemble_gbs: 2.0 * (canon[0].to_dtype(DType::F32).kv_bytes() * cfg.chunks) as f64
                / (revisit_assemble_ms.max(1e-9) * 1e6),
            ..limits
        }),
    })
}

/// The machine's memcpy bandwidth and the reuse path's throughput against it, in one run.
fn limits(
    canon: &kamera_ops::ChunkKv,
    patch: &kamera_ops::Patch,
    rope: &kamera_ops::RopeSpec,
    to: i64,
    reps: usize,
    relocate_ms: f64,
    reuse_ms: f64,
) -> Result<Limits> {
    let f32c = canon.to_dtype(DType::F32);
    let b16 = canon.to_dtype(DType::Bf16);
    let b16_patch = patch_in(patch, DType::Bf16)?;
    let (bytes, bytes16) = (f32c.kv_bytes(), b16.kv_bytes());
    let src = vec![1.0f32; bytes / 4];
    let mut dst = vec![0.0f32; bytes / 4];
    // Destinations allocated and touched once, like the memcpy's and like a context's buffers:
    // what is timed is the pass over the data, not the page faults of a fresh allocation.
    let mut out32 = kamera_ops::ChunkKv::zeros(*canon.layout(), to, canon.n_tokens(), DType::F32).ops("bench")?;
    let mut out16 = kamera_ops::ChunkKv::zeros(*canon.layout(), to, canon.n_tokens(), DType::Bf16).ops("bench")?;
    reuse_into(&f32c, None, rope, &mut out32, 0).ops("bench relocate f32")?;
    reuse_into(&b16, None, rope, &mut out16, 0).ops("bench relocate bf16")?;
    dst.copy_from_slice(&src);
    let mut copy = Vec::new();
    let (mut r32, mut r16, mut p16, mut p32) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let f32_patch = patch_in(patch, DType::F32)?;
    for _ in 0..reps {
        let t = Instant::now();
        reuse_into(&f32c, Some(&f32_patch), rope, &mut out32, 0).ops("bench reuse f32")?;
        p32.push(ms(t));
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        copy.push(ms(t));
        let t = Instant::now();
        reuse_into(&f32c, None, rope, &mut out32, 0).ops("bench relocate f32")?;
        r32.push(ms(t));
        let t = Instant::now();
        reuse_into(&b16, None, rope, &mut out16, 0).ops("bench relocate bf16")?;
        r16.push(ms(t));
        let t = Instant::now();
        reuse_into(&b16, Some(&b16_patch), rope, &mut out16, 0).ops("bench reuse bf16")?;
        p16.push(ms(t));
    }
    let gbs = |b: usize, t: f64| 2.0 * b as f64 / (t.max(1e-9) * 1e6);
    let (r32, r16) = (best(r32), best(r16));
    let flops: f64 = patch
        .layers()
        .iter()
        .flat_map(|l| [&l.k, &l.v])
        .map(|lr| 2.0 * (lr.p.rows() * lr.rank() * lr.wt.cols()) as f64)
        .sum();
    // The f32 relocation measured alongside the patched one (same chunk dtype as `reuse_ms`).
    let patch_ms = (reuse_ms - relocate_ms).max(1e-6);
    Ok(Limits {
        chunk_bytes_f32: bytes,
        chunk_bytes_bf16: bytes16,
        memcpy_gbs: gbs(bytes, best(copy)),
        relocate_f32_ms: r32,
        relocate_f32_gbs: gbs(bytes, r32),
        relocate_bf16_ms: r16,
        relocate_bf16_gbs: gbs(bytes16, r16),
        reuse_bf16_ms: best(p16),
        reuse_f32_ms: best(p32),
        patch_gflops: flops / (patch_ms * 1e6),
        assemble_gbs: 0.0,
    })
}

/// `patch` with its factors stored in `dtype`.
fn patch_in(patch: &kamera_ops::Patch, dtype: DType) -> Result<kamera_ops::Patch> {
    let layers = patch
        .layers()
        .iter()
        .map(|l| {
            let cast = |lr: &kamera_ops::LowRank| kamera_ops::LowRank {
                p: lr.p.to_dtype(dtype),
                wt: lr.wt.to_dtype(dtype),
                spectrum: lr.spectrum.clone(),
            };
            kamera_ops::LayerPatch {
                k: cast(&l.k),
                v: cast(&l.v),
            }
        })
        .collect();
    kamera_ops::Patch::new(*patch.layout(), patch.n_tokens(), layers).ops("bench bf16 patch")
}

impl BenchReport {
    /// A small Markdown table.
    pub fn markdown(&self) -> String {
        let c = &self.config;
        format!(
            "| quantity | value |\n|---|---:|\n| model | {} |\n| chunk tokens x chunks, question tokens, rank | {} x {}, {}, {} |\n| chunk prefill ms (best) | {:.1} |\n| relocate ms (best) | {:.2} |\n| relocate + patch ms (best) | {:.2} |\n| reuse speedup (prefill / relocate+patch, median of back-to-back pairs) | {:.1}x |\n| relocate-only speedup (the same) | {:.1}x |\n| patch bytes / chunk KV bytes | {:.3} |\n| conditioned prefill ms (all chunks) | {:.1} |\n| SVD per chunk ms | {:.1} |\n| revisit assemble ms | {:.2} |\n| revisit question prefill ms | {:.1} |\n| revisit TTFT ms | {:.1} |\n| full re-prefill TTFT ms | {:.1} |\n| TTFT speedup (median of back-to-back pairs) | {:.1}x |\n| break-even reuses | {:.2} |\n{}",
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
            self.break_even_reuses,
            self.limits.as_ref().map_or(String::new(), Limits::markdown)
        )
    }
}

impl Limits {
    /// Rows for the report's table: the machine's limits and the reuse path against them.
    pub fn markdown(&self) -> String {
        let of = |g: f64| 100.0 * g / self.memcpy_gbs.max(1e-9);
        format!(
            "| memcpy GB/s (chunk-sized buffer, read + written) | {:.1} |\n\
             | relocate f32: ms, GB/s, of memcpy | {:.2}, {:.1}, {:.0}% |\n\
             | relocate bf16: ms, GB/s, of memcpy | {:.2}, {:.1}, {:.0}% |\n\
             | relocate + patch into a context's rows, f32 / bf16 ms | {:.2} / {:.2} |\n\
             | patch GFLOP/s (f32 chunk) | {:.1} |\n\
             | revisit placement GB/s, of memcpy | {:.1}, {:.0}% |\n",
            self.memcpy_gbs,
            self.relocate_f32_ms,
            self.relocate_f32_gbs,
            of(self.relocate_f32_gbs),
            self.relocate_bf16_ms,
            self.relocate_bf16_gbs,
            of(self.relocate_bf16_gbs),
            self.reuse_f32_ms,
            self.reuse_bf16_ms,
            self.patch_gflops,
            self.assemble_gbs,
            of(self.assemble_gbs)
        )
    }
}
