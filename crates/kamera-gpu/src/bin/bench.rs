//! `kamera-gpu-bench`: bandwidth of the fused relocate + patch kernel against the device's copy
//! bandwidth, T = 1024..16384 tokens, 28 layers, F = 512, rank 16 and 32 (run by scripts/gpu-check.sh).

use kamera_gpu::CudaBackend;
use kamera_ops::DType;

fn main() {
    let backend = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("kamera-gpu-bench: {e}");
            std::process::exit(2);
        }
    };
    println!("device: {}", backend.device_name());
    println!("| tokens | dtype | rank | fused ms | fused GB/s | copy GB/s | fused/copy | of 4.8 TB/s |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for tokens in [1024, 4096, 16384] {
        for dtype in [DType::Bf16, DType::F32] {
            for rank in [16, 32] {
                match backend.bench_reuse(tokens, 28, 512, rank, dtype, 20) {
                    Ok(f) => println!(
                        "| {tokens} | {dtype:?} | {rank} | {:.3} | {:.0} | {:.0} | {:.0}% | {:.0}% |",
                        f.fused_ms,
                        f.fused_gbs,
                        f.copy_gbs,
                        100.0 * f.fused_gbs / f.copy_gbs,
                        100.0 * f.fused_gbs / 4800.0
                    ),
                    Err(e) => println!("| {tokens} | {dtype:?} | {rank} | error: {e} |"),
                }
            }
        }
    }
}
