//! `kamera calibrate --model M`: measures this machine's prefill, relocate, patch, SVD and store
//! costs for one model and keeps them as the scheduler's cost model under
//! `$KAMERA_HOME/calibration/` (the file format and its reader are kamera-agent's
//! `Calibration`); the runtime (`kamera run`, `Agent::builder`, `kamera bench session`) loads it.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use kamera_gpu::{Backend, CpuBackend};
use kamera_sched::CostModel;
use kamera_store::{ChunkId, ChunkStore, Key, ModelFp, Record, SledStore, StoreConfig};

#[derive(Args)]
pub struct CalibrateArgs {
    /// Model name or path to a .gguf file.
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
    /// Tokens of the probe chunk.
    #[arg(long, default_value_t = 256)]
    tokens: usize,
    /// Context tokens before the probe (for the attention term).
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Timed repetitions of each measurement (the fastest is kept).
    #[arg(long, default_value_t = 2)]
    reps: usize,
}

fn best<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<(f64, T)> {
    let mut out = None;
    let mut t_best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let v = f()?;
        t_best = t_best.min(t.elapsed().as_secs_f64());
        out = Some(v);
    }
    Ok((t_best, out.expect("at least one repetition")))
}

// Long: one measurement after another (prefill, patch forming, relocation, store), each timed
// in place, then the file and its summary; split, each part would take the probe and its KV.
pub fn run(a: CalibrateArgs) -> Result<()> {
    let model = crate::models::load(&a.model)?;
    let n = a.tokens.max(16);
    let ids = crate::bench::tokens(&model, n + a.context)?;
    let (probe, before) = (&ids[a.context..], &ids[..a.context]);
    let empty = model.empty_context();
    // Prefill alone and after `context` tokens: the per-token and attention terms.
    let (t_alone, canon) = best(a.reps, || Ok(model.prefill(probe, 0, &empty)?))?;
    let mut ctx = model.empty_context();
    model.extend(before, &mut ctx)?;
    let (t_after, cond) = best(a.reps, || Ok(model.prefill(probe, a.context as i64, &ctx)?))?;
    let nf = n as f64;
    let attn = ((t_after - t_alone) * 1e6 / (nf * a.context as f64)).max(0.0);
    let per_token = (t_alone * 1e6 / nf - attn * nf / 2.0).max(0.0);
    // Forming the patch the runtime forms for this model (its measured point, with its
    // quantisation and refit), from a conditioned prefill already done: the SVDs and the coding.
    let home = kamera_model::default_home();
    let runtime_cost = kamera_agent::cost_model(
        &model,
        &kamera_agent::CalibrationSource::Defaults,
        &kamera_agent::BasisSource::Installed,
        &home,
    )?;
    let cfg = runtime_cost.patch_config();
    let label = runtime_cost
        .patch_point()
        .map_or_else(|| format!("{:?}", cfg.rank), |p| p.label.clone());
    let (t_svd, patch) = best(a.reps, || {
        Ok(kamera_ops::form_patch(&cond.chunk, &canon.chunk, model.rope(), &cfg)?)
    })?;
    // The cost model adds a transform-coded point's own coding cost to `svd_us_per_token`.
    let coding_us = runtime_cost.patch_point().map_or(0.0, |p| p.form_us_per_token);
    // Relocation and relocation + patch through the backend.
    let backend = CpuBackend;
    let bytes = canon.chunk.kv_bytes() as f64;
    let (t_reloc, _) = best(a.reps, || Ok(backend.reuse(&canon.chunk, None, model.rope(), 1000)?))?;
    let (t_patch, _) = best(a.reps, || {
        Ok(backend.reuse(&canon.chunk, Some(&patch), model.rope(), 1000)?)
    })?;
    // The disk store: write + flush, then a cold read (a fresh handle).
    let dir = tempfile::tempdir()?;
    let fp = ModelFp::of(model.fingerprint());
    let key = Key::canonical(fp, ChunkId::of(b"calibration probe", "probe", fp));
    let open = || -> Result<SledStore> {
        let mut c = StoreConfig::at(dir.path());
        c.dtype = None;
        Ok(SledStore::open(c)?)
    };
    let (t_write, _) = {
        let store = open()?;
        best(a.reps, || {
            store.put(&key, Record::kv(fp, 0, canon.chunk.clone()))?;
            Ok(store.flush()?)
        })?
    };
    let (t_read, _) = best(a.reps, || {
        let store = open()?;
        store.get(&key)?.context("the probe record was not read back")
    })?;
    let per = |t: f64| t * 1e6 / nf;
    let cost = CostModel {
        prefill_us_per_token: per_token,
        attn_us_per_token_ctx: attn,
        place_us_per_token: per(t_patch),
        read_us_per_token: per(t_read),
        svd_us_per_token: (per(t_svd) - coding_us).max(0.0),
        ..CostModel::default()
    };
    let gb_s = |t: f64| bytes / t / 1e9;
    let cal = kamera_agent::Calibration {
        model: a.model.clone(),
        fingerprint: model.fingerprint().to_string(),
        measured_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        probe_tokens: n,
        prefill_tok_s: nf / t_alone,
        relocate_gb_s: gb_s(t_reloc),
        patch_gb_s: gb_s(t_patch),
        store_read_gb_s: gb_s(t_read),
        store_write_gb_s: gb_s(t_write),
        cost,
    };
    let p = kamera_agent::Calibration::path(&home, &model);
    cal.write(&p)?;
    println!("model       {} ({} tokens probed, {} cores)", cal.model, n, cal.cores);
    println!(
        "prefill     {:.0} tok/s alone; {:.1} µs/token + {:.3} µs/token/context token",
        cal.prefill_tok_s, per_token, attn
    );
    println!(
        "relocate    {:.2} GB/s; + {label} patch {:.2} GB/s ({:.1} µs/token)",
        cal.relocate_gb_s,
        cal.patch_gb_s,
        per(t_patch)
    );
    println!(
        "svd         {:.0} µs/token (forming a {label} patch of {n} tokens in {:.0} ms)",
        per(t_svd),
        t_svd * 1e3
    );
    println!(
        "store       read {:.2} GB/s, write + flush {:.2} GB/s",
        cal.store_read_gb_s, cal.store_write_gb_s
    );
    println!("saved       {}", p.display());
    Ok(())
}
