//! Time to first token of a revisit on the device (benches/model.rs, `kamera bench
//! reuse --device cuda`): resident chunks relocated and patched into the context plus the
//! question's prefill, against a full re-prefill, in one run.

use super::model::DeviceModel;
use crate::DevicePool;
use crate::error::{Error, Result};
use crate::{ModelBenchConfig, ModelFigures, median};
use kamera_ops::{DType, LayerPatch, Patch};
use std::time::Instant;

/// Deterministic token ids below `vocab` (the timings do not depend on which).
fn tokens(seed: usize, n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((seed * 1_000_003 + i * 7919 + 13) % vocab) as u32)
        .collect()
}

impl DeviceModel {
    /// Measures `cfg` on this model (see [`ModelFigures`]).
    // Long: the device bench's phases share the uploaded model and buffers.
    pub fn bench_reuse(&self, cfg: &ModelBenchConfig) -> Result<ModelFigures> {
        const OP: &str = "DeviceModel::bench_reuse";
        if cfg.chunks == 0 || cfg.chunk_tokens == 0 || cfg.question_tokens == 0 || cfg.reps == 0 {
            return Err(Error::Unsupported {
                op: OP,
                detail: "chunks, chunk tokens, question tokens and reps must all be at least 1".into(),
            });
        }
        let spec = self.spec().clone();
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            let t = Instant::now();
            f()?;
            self.synchronize()?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
        // Warm-up: kernels loaded, cuBLAS heuristics picked.
        let mut kv = self.context(0)?;
        self.prefill(&mut kv, &tokens(99, 64, spec.vocab), false)?;
        let mut prefill = Vec::new();
        for &n in &cfg.prefill_sizes {
            let toks = tokens(7, n, spec.vocab);
            let mut runs = Vec::new();
            for _ in 0..cfg.reps {
                let mut kv = self.context(0)?;
                self.reserve(&mut kv, n)?;
                runs.push(time(&mut || self.prefill(&mut kv, &toks, false).map(drop))?);
            }
            let ms = median(runs);
            prefill.push((n, ms, n as f64 / ms * 1e3));
        }
        let chunk_toks: Vec<Vec<u32>> = (0..cfg.chunks)
            .map(|c| tokens(c, cfg.chunk_tokens, spec.vocab))
            .collect();
        let question = tokens(1000, cfg.question_tokens, spec.vocab);
        let all: Vec<u32> = chunk_toks.iter().flatten().chain(&question).copied().collect();
        let mut full = Vec::new();
        for _ in 0..cfg.reps {
            let mut kv = self.context(0)?;
            full.push(time(&mut || self.prefill(&mut kv, &all, false).map(drop))?);
        }
        // Canonical chunks: each prefilled alone at position 0, read back (as the store holds
        // them), then made resident.
        let keys: Vec<[u8; 32]> = (0..cfg.chunks)
            .map(|c| {
                let mut key = [0u8; 32];
                key[..8].copy_from_slice(&(c as u64).to_le_bytes());
                key
            })
            .collect();
        let mut pool = DevicePool::new(usize::MAX);
        let layout = spec.kv_layout();
        let mut patches = Vec::new();
        for (c, toks) in chunk_toks.iter().enumerate() {
            let mut kv = self.context(0)?;
            self.prefill(&mut kv, toks, false)?;
            let canonical = self.download(&kv, 0)?;
            pool.get_or_upload(self.backend(), keys[c], || Ok(canonical))?;
            // A rank-`rank` bf16 patch on every layer's K and V (none at rank 0).
            let patch = if cfg.rank > 0 {
                let lr =
                    |cols, salt| super::bench::synthetic_low_rank(cfg.chunk_tokens, cfg.rank, cols, DType::Bf16, salt);
                let layers = (0..spec.layers)
                    .map(|l| {
                        Ok(LayerPatch {
                            k: lr(layout.k_features(), l + c)?,
                            v: lr(layout.v_features(), l + c + 1)?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Some(Patch::new(layout, cfg.chunk_tokens, layers)?)
            } else {
                None
            };
            patches.push(patch);
        }
        let (mut place, mut reuse) = (Vec::new(), Vec::new());
        for _ in 0..cfg.reps {
            let mut kv = self.context(0)?;
            self.reserve(&mut kv, cfg.chunks * cfg.chunk_tokens + cfg.question_tokens)?;
            self.synchronize()?;
            let t = Instant::now();
            for (key, patch) in keys.iter().zip(&patches) {
                let chunk = pool.get_or_upload(self.backend(), *key, || Err("not resident".into()))?;
                self.place(&mut kv, chunk, patch.as_ref())?;
            }
            self.synchronize()?;
            let placed = t.elapsed().as_secs_f64() * 1e3;
            self.prefill(&mut kv, &question, false)?;
            place.push(placed);
            reuse.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (full_ms, reuse_ms) = (median(full), median(reuse));
        Ok(ModelFigures {
            device: self.backend().device_name(),
            config: cfg.clone(),
            prefill,
            full_ms,
            place_ms: median(place),
            reuse_ms,
            speedup: full_ms / reuse_ms,
            resident_bytes: pool.stats().bytes,
        })
    }
}
