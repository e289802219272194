//! `kamera-gpu-bench`: bandwidth of the fused relocate + patch kernels against the device's copy
//! bandwidth in the same run, T = 1024..16384 tokens, 28 layers, F = 512 (head dim 128, half-split
//! pairs), rank 0 (relocate only), 16 and 32, four-column and two-column kernels (run by
//! scripts/gpu-check.sh).

use kamera_gpu::CudaBackend;
use kamera_ops::DType;

/// The H200's nominal HBM3e bandwidth, for the last column.
const PEAK_GBS: f64 = 4800.0;

fn main() {
    let open = |wide: bool| match CudaBackend::new(0) {
        Ok(b) => b.with_wide_units(wide),
        Err(e) => {
            eprintln!("kamera-gpu-bench: {e}");
            std::process::exit(2);
        }
    };
    let backends = [("4-col", open(true)), ("2-col", open(false))];
    println!("device: {}", backends[0].1.device_name());
    println!(
        "| tokens | dtype | rank | kernel | fused ms | K ms | V ms | copy ms | fused GB/s | copy GB/s | fused/copy | of 4.8 TB/s |"
    );
    println!("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for tokens in [1024, 4096, 16384] {
        for dtype in [DType::Bf16, DType::F32] {
            for rank in [0, 16, 32] {
                for (kernel, backend) in &backends {
                    match backend.bench_reuse(tokens, 28, 512, rank, dtype, 20) {
                        Ok(f) => println!(
                            "| {tokens} | {dtype:?} | {rank} | {kernel} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {:.0}% | {:.0}% |",
                            f.fused_ms,
                            f.k_ms,
                            f.v_ms,
                            f.copy_ms,
                            f.fused_gbs,
                            f.copy_gbs,
                            100.0 * f.fused_gbs / f.copy_gbs,
                            100.0 * f.fused_gbs / PEAK_GBS
                        ),
                        Err(e) => println!("| {tokens} | {dtype:?} | {rank} | {kernel} | error: {e} |"),
                    }
                }
            }
        }
    }
}
