//! The bandwidth bench (`cargo bench -p kamera-gpu --features cuda --bench bandwidth`): bandwidth of the fused relocate + patch kernels against the device's copy
//! bandwidth in the same run: T = 1024..16384 tokens, 28 layers, F = 512 (head dim 128, half-split
//! pairs), rank 0 (relocate only), 16 and 32, patch factors in bf16 (tensor cores: on bf16 rows
//! the cp.async-pipelined kernel, WideTcp, and the one-stage one, WideTc) and f32 (FMA), and the
//! two-column kernels for reference (run by scripts/gpu-check.sh).
//! `cargo bench ... --bench bandwidth -- one TOKENS DTYPE RANK FACTORS [pairs|tc]` runs one configuration (for
//! profilers; `tc`: the one-stage tensor-core kernel where the pipelined one would run).

use kamera_gpu::{BenchFigures, CudaBackend};
use kamera_ops::DType;

/// The H200's nominal HBM3e bandwidth, for the last column.
const PEAK_GBS: f64 = 4800.0;

fn main() {
    let open = |wide: bool| match CudaBackend::new(0) {
        Ok(b) => b.with_wide_units(wide),
        Err(e) => {
            eprintln!("bench bandwidth: {e}");
            std::process::exit(2);
        }
    };
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if args.first().map(String::as_str) == Some("one") {
        return one(&args[1..], open);
    }
    let (wide, pairs) = (open(true), open(false));
    println!("device: {}", wide.device_name());
    match wide.kernel_report() {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => println!("kernel report: {e}"),
    }
    println!(
        "| tokens | dtype | rank | factors | kernel | fused ms | K ms | V ms | copy ms | fused GB/s | copy GB/s | fused/copy | of 4.8 TB/s |"
    );
    println!("|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for tokens in [1024, 4096, 16384] {
        for dtype in [DType::Bf16, DType::F32] {
            for rank in [0, 16, 32] {
                // (backend, factors, one-stage tensor-core kernel): 16-bit factors on 16-bit rows
                // run both tensor-core kernels.
                let runs: &[(&CudaBackend, DType, bool)] = if rank == 0 {
                    &[(&wide, DType::F32, false), (&pairs, DType::F32, false)]
                } else if dtype == DType::F32 {
                    &[
                        (&wide, DType::Bf16, false),
                        (&wide, DType::F32, false),
                        (&pairs, DType::F32, false),
                    ]
                } else {
                    &[
                        (&wide, DType::Bf16, false),
                        (&wide, DType::Bf16, true),
                        (&wide, DType::F32, false),
                        (&pairs, DType::F32, false),
                    ]
                };
                for &(backend, factors, one_stage) in runs {
                    match bench(backend, one_stage, tokens, dtype, rank, factors, 20) {
                        Ok(f) => println!(
                            "| {tokens} | {dtype:?} | {rank} | {factors:?} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {:.0}% | {:.0}% |",
                            f.kernel.split_whitespace().next().unwrap_or(""),
                            f.fused_ms,
                            f.k_ms,
                            f.v_ms,
                            f.copy_ms,
                            f.fused_gbs,
                            f.copy_gbs,
                            100.0 * f.fused_gbs / f.copy_gbs,
                            100.0 * f.fused_gbs / PEAK_GBS
                        ),
                        Err(e) => println!("| {tokens} | {dtype:?} | {rank} | {factors:?} | error: {e} |"),
                    }
                }
            }
        }
    }
}

/// One configuration at 28 layers, F = 512; `one_stage` forces the one-stage tensor-core kernel
/// where the plan pipelines (only CUDA builds have both; the stub's bench is an error anyway).
fn bench(
    backend: &CudaBackend,
    one_stage: bool,
    tokens: usize,
    dtype: DType,
    rank: usize,
    factors: DType,
    iters: usize,
) -> kamera_gpu::Result<BenchFigures> {
    #[cfg(feature = "cuda")]
    return backend.bench_reuse_as(one_stage, tokens, 28, 512, rank, dtype, factors, iters);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = one_stage;
        backend.bench_reuse(tokens, 28, 512, rank, dtype, factors, iters)
    }
}

fn dtype(s: &str) -> Option<DType> {
    match s {
        "f32" => Some(DType::F32),
        "f16" => Some(DType::F16),
        "bf16" => Some(DType::Bf16),
        _ => None,
    }
}

/// One configuration: `TOKENS DTYPE RANK FACTORS [pairs|tc]`.
fn one(args: &[String], open: impl Fn(bool) -> CudaBackend) {
    let usage = "usage: bandwidth one TOKENS f32|f16|bf16 RANK f32|f16|bf16 [pairs|tc]";
    let parsed = (|| {
        let tokens: usize = args.first()?.parse().ok()?;
        let kv = dtype(args.get(1)?)?;
        let rank: usize = args.get(2)?.parse().ok()?;
        let factors = dtype(args.get(3)?)?;
        let (wide, one_stage) = match args.get(4).map(String::as_str) {
            None => (true, false),
            Some("pairs") => (false, false),
            Some("tc") => (true, true),
            Some(_) => return None,
        };
        Some((tokens, kv, rank, factors, wide, one_stage))
    })();
    let Some((tokens, kv, rank, factors, wide, one_stage)) = parsed else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    match bench(&open(wide), one_stage, tokens, kv, rank, factors, 5) {
        Ok(f) => println!("{f:?}"),
        Err(e) => {
            eprintln!("bench bandwidth: {e}");
            std::process::exit(1);
        }
    }
}
