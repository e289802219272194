//! Relocation and fused relocate+patch throughput at T = 1024 tokens, 30 layers, F = 192 / 512,
//! against a plain copy of the same KV measured in the same run.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kamera_ops::*;
use std::hint::black_box;
use std::time::Duration;

const T: usize = 1024;
const LAYERS: usize = 30;

fn chunk(layout: KvLayout, dtype: DType, seed: u32) -> ChunkKv {
    let val =
        |i: usize| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
    let layers = (0..LAYERS)
        .map(|l| LayerKv {
            k: Mat::from_f32(
                T,
                layout.k_features(),
                (0..T * layout.k_features()).map(|i| val(i + l)).collect(),
            )
            .unwrap()
            .to_dtype(dtype),
            v: Mat::from_f32(
                T,
                layout.v_features(),
                (0..T * layout.v_features()).map(|i| val(i + 7 * l)).collect(),
            )
            .unwrap()
            .to_dtype(dtype),
        })
        .collect();
    ChunkKv::new(layout, 0, layers).unwrap()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    // F = kv_heads * head_dim: 192 = SmolLM2-135M (3 x 64), 512 = 4 x 128.
    for (f, layout) in [
        (192, KvLayout::gqa(LAYERS, 9, 3, 64)),
        (512, KvLayout::gqa(LAYERS, 16, 4, 128)),
    ] {
        let rope = RopeSpec::new(layout.head_dim, 1e5, PairLayout::HalfSplit);
        for dtype in [DType::F32, DType::Bf16] {
            let canonical = chunk(layout, dtype, 1);
            // Read + write of every K and V byte.
            g.throughput(Throughput::Bytes(2 * canonical.kv_bytes() as u64));
            let id = format!("F{f}/{dtype:?}");
            g.bench_function(BenchmarkId::new("copy", &id), |b| {
                b.iter(|| black_box(canonical.clone()))
            });
            g.bench_function(BenchmarkId::new("relocate", &id), |b| {
                b.iter(|| relocate(black_box(&canonical), &rope, 4096).unwrap())
            });
            for rank in [16, 32] {
                let cond = relocate(&chunk(layout, DType::F32, 2), &rope, 300).unwrap();
                let patch = form_patch(&cond, &canonical, &rope, &PatchConfig::fixed(rank, dtype)).unwrap();
                g.bench_function(BenchmarkId::new(format!("reuse_r{rank}"), &id), |b| {
                    b.iter(|| reuse(black_box(&canonical), Some(&patch), &rope, 4096).unwrap())
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
