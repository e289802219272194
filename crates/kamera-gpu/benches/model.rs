//! The device model bench (`cargo bench -p kamera-gpu --features cuda --bench model -- [SHAPE] [--chunk-tokens N] [--chunks N] [--question N] [--ranks A,B]
//! [--reps N] [--prefill A,B,..] [--json PATH]`): prefill throughput and revisit time to first
//! token (resident chunks relocated + patched into the device context, then the question) against
//! a full re-prefill, on a seeded random-weight model of a real model's shape (SHAPE:
//! qwen2.5-0.5b, the default, or smollm2-135m). Timings do not depend on weight values; with a
//! checkpoint at hand, `kamera bench reuse --device cuda` measures the same on real weights.

use kamera_gpu::{DeviceModel, HostWeights, ModelBenchConfig, ModelSpec};

fn list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("expected numbers separated by commas, got {v:?}"))
        })
        .collect()
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut shape = "qwen2.5-0.5b".to_string();
    let mut cfg = ModelBenchConfig {
        chunk_tokens: 1024,
        chunks: 4,
        question_tokens: 32,
        rank: 0,
        reps: 5,
        prefill_sizes: vec![512, 2048, 8192],
    };
    let mut ranks = vec![0, 32];
    let mut json = None;
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--chunk-tokens" => cfg.chunk_tokens = list(&val(&a)?)?[0],
            "--chunks" => cfg.chunks = list(&val(&a)?)?[0],
            "--question" => cfg.question_tokens = list(&val(&a)?)?[0],
            "--reps" => cfg.reps = list(&val(&a)?)?[0],
            "--ranks" => ranks = list(&val(&a)?)?,
            "--prefill" => cfg.prefill_sizes = list(&val(&a)?)?,
            "--json" => json = Some(val(&a)?),
            s if !s.starts_with('-') => shape = s.to_string(),
            s => return Err(format!("unknown option {s}")),
        }
    }
    let spec = ModelSpec::named(&shape).ok_or(format!("unknown shape {shape:?} (qwen2.5-0.5b or smollm2-135m)"))?;
    let weights = HostWeights::random(&spec, 1);
    let model = DeviceModel::new(0, spec, &weights).map_err(|e| e.to_string())?;
    drop(weights);
    println!("model: {shape} shape, seeded random weights (bf16 on the device)");
    let mut all = Vec::new();
    for (i, rank) in ranks.into_iter().enumerate() {
        let mut c = cfg.clone();
        c.rank = rank;
        if i > 0 {
            c.prefill_sizes.clear();
        }
        let f = model.bench_reuse(&c).map_err(|e| e.to_string())?;
        print!("{}", f.markdown());
        all.push(f);
    }
    if let Some(p) = json {
        let text = serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?;
        std::fs::write(&p, text).map_err(|e| format!("writing {p}: {e}"))?;
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench model: {e}");
        std::process::exit(1);
    }
}
