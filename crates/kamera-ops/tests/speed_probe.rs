//! Not a test: `cargo test --release -p kamera-ops --test speed_probe -- --ignored --nocapture`
//! prints relocate and relocate + rank-32 patch into a touched destination (best of 10) for
//! SmolLM2-, Gemma 3- and Qwen2.5-shaped chunks of 1024 tokens, beside a memcpy of the same bytes
//! (`PROBE_RELOCATE_REPS=N` first relocates N more times, for a profiler).

mod common;

use std::time::Instant;

use common::chunk;
use kamera_ops::*;

#[test]
#[ignore]
fn reuse_speed() {
    for (name, layout) in [
        ("smollm2", KvLayout::gqa(30, 9, 3, 64)),
        ("gemma3", KvLayout::gqa(18, 4, 1, 256)),
        ("qwen2.5", KvLayout::gqa(24, 14, 2, 64)),
    ] {
        let rope = RopeSpec::new(layout.head_dim, 1e4, PairLayout::HalfSplit);
        for dtype in [DType::F32, DType::Bf16] {
            let canonical = chunk(layout, 1024, 0, 1, dtype);
            let cond = relocate(&chunk(layout, 1024, 0, 2, DType::F32), &rope, 300).unwrap();
            let patch = form_patch(
                &cond,
                &canonical.to_dtype(DType::F32),
                &rope,
                &PatchConfig::fixed(32, dtype),
            )
            .unwrap();
            let mut dst = ChunkKv::zeros(layout, 4096, 1024, DType::F32).unwrap();
            let best = |f: &mut dyn FnMut()| {
                (0..10)
                    .map(|_| {
                        let t = Instant::now();
                        f();
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            if let Ok(n) = std::env::var("PROBE_RELOCATE_REPS") {
                // For a profiler: relocation alone, many times.
                for _ in 0..n.parse::<usize>().unwrap_or(100) {
                    reuse_into(&canonical, None, &rope, &mut dst, 0).unwrap();
                }
            }
            let r = best(&mut || reuse_into(&canonical, None, &rope, &mut dst, 0).unwrap());
            let p = best(&mut || reuse_into(&canonical, Some(&patch), &rope, &mut dst, 0).unwrap());
            let bytes = canonical.kv_bytes() + dst.kv_bytes();
            let src = vec![1f32; bytes / 8];
            let mut d = vec![0f32; bytes / 8];
            let c = best(&mut || d.copy_from_slice(std::hint::black_box(&src)));
            println!(
                "{name} {dtype:?}: relocate {r:.2} ms, + patch {p:.2} ms, memcpy of the bytes {c:.2} ms ({:.0}% / {:.0}%)",
                100.0 * c / r,
                100.0 * c / p
            );
        }
    }
}
