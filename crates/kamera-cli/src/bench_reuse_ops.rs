//! `kamera bench reuse`, one chunk: its prefill against relocate (+ patch) of its canonical KV,
//! in alternating pairs; and the machine's limits measured in the same run: a memory copy of the
//! chunk's bytes at the same thread count as the relocation (one thread, and every thread of the
//! pool), and a STREAM-style copy of a large buffer on every thread (the bandwidth ceiling).

use std::time::Instant;

use anyhow::{Context as _, Result};
use kamera_model::{Context, Model};
use kamera_ops::{ChunkKv, DType, Patch, PatchConfig, RopeSpec, form_patch, reuse, reuse_into};
use rayon::prelude::*;
use serde::Serialize;

use crate::bench_stats::{Spread, paired};

/// One chunk reused against re-prefilled, median and spread over alternating pairs.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkFigures {
    /// The chunk prefilled after the pinned prefix (what a re-prefill of it costs).
    pub prefill_ms: Spread,
    /// Its canonical KV relocated to a new position, no patch (into a new buffer, as the
    /// executor's `Place` does).
    pub relocate_ms: Spread,
    /// Relocated + rank-R patch, one pass (the same).
    pub reuse_ms: Spread,
    /// Prefill / relocate + patch, per pair.
    pub reuse_speedup: Spread,
    /// Prefill / relocate, per pair.
    pub relocate_speedup: Spread,
    /// Conditioned prefill of all chunks (forms every chunk's patch), once.
    pub conditioned_prefill_ms: f64,
    /// SVD + truncation per chunk.
    pub patch_svd_ms: f64,
    pub patch_bytes_ratio: f64,
    /// (conditioned prefill share per chunk + SVD) / (chunk prefill − reuse), medians.
    pub break_even_reuses: f64,
}

/// Copy and relocation at one thread count, measured in alternation.
#[derive(Debug, Clone, Serialize)]
pub struct AtThreads {
    pub threads: usize,
    /// A copy of the chunk's f32 bytes into a touched buffer, split over `threads`.
    pub memcpy_ms: Spread,
    /// GB/s read + written, from the median.
    pub memcpy_gbs: f64,
    /// Relocation of the f32 / bf16 chunk into a touched buffer (a context's rows).
    pub relocate_f32_ms: Spread,
    pub relocate_f32_gbs: f64,
    pub relocate_bf16_ms: Spread,
    pub relocate_bf16_gbs: f64,
    /// Relocation's GB/s as a share of the copy's at the same thread count.
    pub relocate_f32_of_memcpy: f64,
    pub relocate_bf16_of_memcpy: f64,
    /// Relocate + patch (factors in the chunk's dtype) into a touched buffer.
    pub reuse_f32_ms: Spread,
    pub reuse_bf16_ms: Spread,
    /// The patch's GFLOP/s: its flops over (relocate + patch − relocate) medians, f32 chunk.
    pub patch_gflops: f64,
}

/// A STREAM-style copy (`a[i] = b[i]`) of a buffer far larger than the caches, on every thread.
#[derive(Debug, Clone, Serialize)]
pub struct Stream {
    pub threads: usize,
    /// Bytes of each of the two buffers.
    pub bytes: usize,
    /// GB/s read + written (STREAM counts no write-allocate traffic), best and median.
    pub best_gbs: f64,
    pub median_gbs: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    pub chunk_bytes_f32: usize,
    pub chunk_bytes_bf16: usize,
    /// One thread, then every thread of the pool (rayon's, which the relocation and candle use).
    pub same_threads: Vec<AtThreads>,
    pub stream: Stream,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn gbs(bytes: usize, ms: f64) -> f64 {
    2.0 * bytes as f64 / (ms.max(1e-9) * 1e6)
}

/// The chunk figures: canonical KV of each chunk (alone at 0), the patches from one conditioned
/// prefill of all chunks after the prefix, then `pairs` pairs of (chunk prefill, relocate +
/// relocate-and-patch) on the chunks in turn, alternating which goes first.
pub fn chunk_figures(
    model: &Model,
    prefix: &[u32],
    chunks: &[Vec<u32>],
    rank: usize,
    dtype: DType,
    pairs: usize,
) -> Result<(ChunkFigures, ChunkKv, Patch)> {
    let rope = model.rope();
    let sys_ctx = if prefix.is_empty() {
        model.empty_context()
    } else {
        Context::from_chunk(&model.prefill(prefix, 0, &model.empty_context())?.chunk)?
    };
    let start = prefix.len() as i64;
    let n = chunks[0].len();
    let canon: Vec<ChunkKv> = chunks
        .iter()
        .map(|c| Ok(model.prefill(c, 0, &model.empty_context())?.chunk))
        .collect::<Result<_>>()?;
    let mut cond_all = sys_ctx.clone();
    let t = Instant::now();
    model.extend(&chunks.concat(), &mut cond_all)?;
    let conditioned_prefill_ms = ms(t);
    let pcfg = PatchConfig::fixed(rank, dtype);
    let t = Instant::now();
    let mut patches = Vec::new();
    for (i, c) in canon.iter().enumerate() {
        let cond = cond_all.rows_chunk(prefix.len() + i * n, n)?;
        patches.push(form_patch(&cond, c, rope, &pcfg)?);
    }
    let patch_svd_ms = ms(t) / chunks.len() as f64;
    let canon: Vec<ChunkKv> = canon.iter().map(|c| c.to_dtype(dtype)).collect();
    let patch_bytes_ratio = patches[0].bytes_ratio(&canon[0]);
    let to = start + (n * (chunks.len() - 1)) as i64 + 7;
    let (mut i, mut j) = (0usize, 0usize);
    let mut reloc = Vec::new();
    let runs = paired(
        pairs,
        || {
            let c = &chunks[i % chunks.len()];
            i += 1;
            let t = Instant::now();
            std::hint::black_box(model.prefill(c, start, &sys_ctx)?);
            Ok(ms(t))
        },
        || {
            let k = j % chunks.len();
            j += 1;
            let t = Instant::now();
            std::hint::black_box(reuse(&canon[k], None, rope, to)?);
            reloc.push(ms(t));
            let t = Instant::now();
            std::hint::black_box(reuse(&canon[k], Some(&patches[k]), rope, to)?);
            Ok(ms(t))
        },
    )?;
    let prefill: Vec<f64> = runs.iter().map(|p| p.0).collect();
    let reused: Vec<f64> = runs.iter().map(|p| p.1).collect();
    let speed = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(p, r)| p / r.max(1e-9)).collect() };
    let figures = ChunkFigures {
        prefill_ms: Spread::of(&prefill),
        relocate_ms: Spread::of(&reloc),
        reuse_ms: Spread::of(&reused),
        reuse_speedup: Spread::of(&speed(&prefill, &reused)),
        relocate_speedup: Spread::of(&speed(&prefill, &reloc)),
        conditioned_prefill_ms,
        patch_svd_ms,
        patch_bytes_ratio,
        break_even_reuses: (conditioned_prefill_ms / chunks.len() as f64 + patch_svd_ms)
            / (Spread::of(&prefill).median - Spread::of(&reused).median).max(1e-9),
    };
    let c0 = canon.into_iter().next().context("bench: no chunk")?;
    let p0 = patches.into_iter().next().context("bench: no patch")?;
    Ok((figures, c0, p0))
}

/// A copy of `src` into `dst` in `pieces` equal parts over the current rayon pool (one part:
/// a plain `copy_from_slice`).
fn par_copy(dst: &mut [f32], src: &[f32], pieces: usize) {
    let n = src.len().div_ceil(pieces.max(1)).max(1);
    dst.par_chunks_mut(n)
        .zip(src.par_chunks(n))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// `patch` with its factors stored in `dtype`.
fn patch_in(patch: &Patch, dtype: DType) -> Result<Patch> {
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
    Ok(Patch::new(*patch.layout(), patch.n_tokens(), layers)?)
}

/// Copy, relocation and relocate + patch of one chunk at one thread and at every thread of the
/// pool (each in its own rayon pool of that size, the measurements alternating within it), and
/// the STREAM-style ceiling on every thread.
pub fn limits(canon: &ChunkKv, patch: &Patch, rope: &RopeSpec, to: i64, reps: usize) -> Result<Limits> {
    let f32c = canon.to_dtype(DType::F32);
    let b16 = canon.to_dtype(DType::Bf16);
    let (p32, p16) = (patch_in(patch, DType::F32)?, patch_in(patch, DType::Bf16)?);
    let (bytes, bytes16) = (f32c.kv_bytes(), b16.kv_bytes());
    let flops: f64 = patch
        .layers()
        .iter()
        .flat_map(|l| [&l.k, &l.v])
        .map(|lr| 2.0 * (lr.p.rows() * lr.rank() * lr.wt.cols()) as f64)
        .sum();
    let all = rayon::current_num_threads();
    let mut counts = vec![1];
    if all > 1 {
        counts.push(all);
    }
    let reps = reps.max(3);
    let mut same_threads = Vec::new();
    for threads in counts {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .context("bench: a rayon pool")?;
        let at = pool.install(|| -> Result<AtThreads> {
            let src = vec![1.0f32; bytes / 4];
            // Destinations allocated and touched once, like a context's buffers: what is timed
            // is the pass over the data, not the page faults of a fresh allocation.
            let mut dst = vec![0.0f32; bytes / 4];
            let mut out32 = ChunkKv::zeros(*canon.layout(), to, canon.n_tokens(), DType::F32)?;
            let mut out16 = ChunkKv::zeros(*canon.layout(), to, canon.n_tokens(), DType::Bf16)?;
            par_copy(&mut dst, &src, threads);
            reuse_into(&f32c, None, rope, &mut out32, 0)?;
            reuse_into(&b16, None, rope, &mut out16, 0)?;
            let (mut copy, mut r32, mut r16, mut q32, mut q16) = (vec![], vec![], vec![], vec![], vec![]);
            // Milliseconds of one call of `f`.
            fn timed<E>(f: impl FnOnce() -> std::result::Result<(), E>) -> std::result::Result<f64, E> {
                let t = Instant::now();
                f()?;
                Ok(ms(t))
            }
            for _ in 0..reps {
                copy.push(timed(|| {
                    par_copy(&mut dst, std::hint::black_box(&src), threads);
                    std::hint::black_box(&dst);
                    Ok::<(), kamera_ops::Error>(())
                })?);
                r32.push(timed(|| reuse_into(&f32c, None, rope, &mut out32, 0))?);
                q32.push(timed(|| reuse_into(&f32c, Some(&p32), rope, &mut out32, 0))?);
                r16.push(timed(|| reuse_into(&b16, None, rope, &mut out16, 0))?);
                q16.push(timed(|| reuse_into(&b16, Some(&p16), rope, &mut out16, 0))?);
            }
            let (copy, r32, r16) = (Spread::of(&copy), Spread::of(&r32), Spread::of(&r16));
            let (q32, q16) = (Spread::of(&q32), Spread::of(&q16));
            let memcpy_gbs = gbs(bytes, copy.median);
            let (g32, g16) = (gbs(bytes, r32.median), gbs(bytes16, r16.median));
            Ok(AtThreads {
                threads,
                memcpy_ms: copy,
                memcpy_gbs,
                relocate_f32_ms: r32,
                relocate_f32_gbs: g32,
                relocate_bf16_ms: r16,
                relocate_bf16_gbs: g16,
                relocate_f32_of_memcpy: g32 / memcpy_gbs.max(1e-9),
                relocate_bf16_of_memcpy: g16 / memcpy_gbs.max(1e-9),
                reuse_f32_ms: q32,
                reuse_bf16_ms: q16,
                patch_gflops: flops / ((q32.median - r32.median).max(1e-6) * 1e6),
            })
        })?;
        same_threads.push(at);
    }
    Ok(Limits {
        chunk_bytes_f32: bytes,
        chunk_bytes_bf16: bytes16,
        same_threads,
        stream: stream(all, (bytes * 4).max(256 << 20), reps),
    })
}

/// The STREAM copy on `threads` threads: two buffers of `bytes`, `reps` passes.
fn stream(threads: usize, bytes: usize, reps: usize) -> Stream {
    let src = vec![1.0f32; bytes / 4];
    let mut dst = vec![0.0f32; bytes / 4];
    let mut times = Vec::new();
    par_copy(&mut dst, &src, threads);
    for _ in 0..reps {
        let t = Instant::now();
        par_copy(&mut dst, std::hint::black_box(&src), threads);
        std::hint::black_box(&dst);
        times.push(ms(t));
    }
    let s = Spread::of(&times);
    Stream {
        threads,
        bytes,
        best_gbs: gbs(bytes, s.min),
        median_gbs: gbs(bytes, s.median),
    }
}
