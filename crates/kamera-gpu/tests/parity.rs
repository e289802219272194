//! Every GPU kernel against the CPU reference (kamera-ops), for every dtype pair and layout, with
//! one tolerance table. The GPU tests are `#[ignore]`d (a CPU run never counts them as passed);
//! scripts/gpu-check.sh runs them on a device with `--include-ignored`, where a missing device fails.

use kamera_gpu::{Backend, CpuBackend, CudaBackend, Error, tolerance};
use kamera_ops::*;

fn val(seed: u64, i: usize) -> f32 {
    let x = (i as u64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn chunk(layout: KvLayout, n: usize, seed: u64, dtype: DType) -> ChunkKv {
    let layers = (0..layout.n_layers)
        .map(|l| LayerKv {
            k: Mat::from_f32(
                n,
                layout.k_features(),
                (0..n * layout.k_features()).map(|i| val(seed + l as u64, i)).collect(),
            )
            .unwrap()
            .to_dtype(dtype),
            v: Mat::from_f32(
                n,
                layout.v_features(),
                (0..n * layout.v_features())
                    .map(|i| val(seed + 99 + l as u64, i))
                    .collect(),
            )
            .unwrap()
            .to_dtype(dtype),
        })
        .collect();
    ChunkKv::new(layout, 0, layers).unwrap()
}

fn flavours() -> Vec<(&'static str, KvLayout, RopeSpec)> {
    vec![
        (
            "interleaved-gqa",
            KvLayout::gqa(2, 9, 3, 64),
            RopeSpec::new(64, 1e5, PairLayout::Interleaved),
        ),
        (
            "half-split-mqa",
            KvLayout::gqa(2, 4, 1, 256),
            RopeSpec::new(256, 1e6, PairLayout::HalfSplit),
        ),
        (
            "partial",
            KvLayout::mha(2, 2, 64),
            RopeSpec::new(64, 1e4, PairLayout::HalfSplit).with_rotary_dims(32),
        ),
        (
            "mrope",
            KvLayout::gqa(2, 4, 2, 32),
            RopeSpec::new(32, 1e6, PairLayout::HalfSplit).with_mrope([4, 6, 6]),
        ),
        (
            "odd-head-dim",
            KvLayout::gqa(2, 4, 2, 6),
            RopeSpec::new(6, 1e4, PairLayout::HalfSplit),
        ),
        (
            "mla",
            KvLayout::mla(2, 8, 128, 64),
            RopeSpec::new(64, 1e4, PairLayout::Interleaved),
        ),
        // 640 columns: the pipelined tensor-core kernel takes them in column chunks of two heads,
        // the last one narrower than the others.
        (
            "multi-chunk",
            KvLayout::mha(2, 5, 128),
            RopeSpec::new(128, 1e6, PairLayout::HalfSplit),
        ),
        // 36 columns (not a multiple of 8): rows not 16-byte aligned, so 16-bit factors stay on
        // the one-stage tensor-core kernel, rotating (both pair layouts) and not.
        (
            "head-dim-12-half-split",
            KvLayout::gqa(2, 6, 3, 12),
            RopeSpec::new(12, 1e4, PairLayout::HalfSplit),
        ),
        (
            "head-dim-12-interleaved",
            KvLayout::gqa(2, 6, 3, 12),
            RopeSpec::new(12, 1e4, PairLayout::Interleaved),
        ),
    ]
}

/// Both kernel families: four-column units (the default where shapes allow) and two-column ones.
/// The tests that call it are ignored on a plain run; run with `--ignored` they need a device,
/// and its absence is a failure, not a pass.
fn cuda() -> [CudaBackend; 2] {
    let open = || {
        CudaBackend::new(0).unwrap_or_else(|e| {
            panic!("no CUDA device for a GPU parity test (build with --features cuda, run on a GPU): {e}")
        })
    };
    [open(), open().with_wide_units(false)]
}

fn within(op: &str, got: &ChunkKv, want: &ChunkKv) {
    let (abs, rel) = tolerance(want.dtype());
    for (l, (g, w)) in got.layers().iter().zip(want.layers()).enumerate() {
        for (ch, a, b) in [("k", &g.k, &w.k), ("v", &g.v, &w.v)] {
            for (i, (x, y)) in a.to_f32_vec().iter().zip(b.to_f32_vec()).enumerate() {
                assert!(
                    (x - y).abs() <= abs + rel * y.abs(),
                    "{op}: layer {l} {ch}[{i}]: gpu {x} vs cpu {y}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; scripts/gpu-check.sh runs it with --include-ignored"]
fn fused_reuse_matches_cpu_reference() {
    let gpus = cuda();
    for (kernel, gpu) in ["4-col", "2-col"].into_iter().zip(&gpus) {
        let dtypes = [DType::F32, DType::F16, DType::Bf16];
        for (name, layout, rope) in flavours() {
            let canonical = chunk(layout, 37, 1, DType::F32);
            let cond = relocate(&chunk(layout, 37, 2, DType::F32), &rope, 500).unwrap();
            // Rank 16 and 32 (one and two MMA k-steps), and rank 5 (not a multiple of the
            // kernels' 4- and 16-wide steps), with f32 factors (FMA kernels) and 16-bit ones
            // (tensor cores where the device has them).
            let mut patches = vec![None];
            for factors in dtypes {
                for r in [16, 32, 5] {
                    let cfg = PatchConfig::fixed(r, factors);
                    patches.push(Some(form_patch(&cond, &canonical, &rope, &cfg).unwrap()));
                }
            }
            for src in dtypes {
                for dst in dtypes {
                    for p in patches.iter().map(Option::as_ref) {
                        let c = canonical.to_dtype(src);
                        let mut want = ChunkKv::zeros(layout, 1000 - 3, 37 + 5, dst).unwrap();
                        let mut got = want.clone();
                        CpuBackend.reuse_into(&c, p, &rope, &mut want, 3).unwrap();
                        gpu.reuse_into(&c, p, &rope, &mut got, 3).unwrap();
                        let rank = p.map_or(0, |p| p.ranks()[0].0);
                        let f = p.map(|p| p.layers()[0].k.p.dtype());
                        let what = format!("{kernel} {name} {src:?}->{dst:?} rank {rank} factors {f:?}");
                        within(&what, &got, &want);
                    }
                }
            }
        }
    }
}

/// Many row tiles, a different rank in every layer and channel, bf16 factors, shifts both ways.
#[test]
#[ignore = "needs a CUDA GPU; scripts/gpu-check.sh runs it with --include-ignored"]
fn per_layer_ranks_and_long_chunks_match_cpu_reference() {
    let gpus = cuda();
    for (kernel, gpu) in ["4-col", "2-col"].into_iter().zip(&gpus) {
        let layout = KvLayout::gqa(4, 9, 3, 64);
        let rope = RopeSpec::new(64, 1e5, PairLayout::Interleaved);
        let canonical = chunk(layout, 301, 7, DType::Bf16);
        let cond = relocate(&chunk(layout, 301, 8, DType::F32), &rope, 9000).unwrap();
        let cfg = PatchConfig {
            rank: RankPolicy::PerLayer(vec![0, 3, 17, 40]),
            dtype: DType::Bf16,
            ..PatchConfig::fixed(0, DType::Bf16)
        };
        let patch = form_patch(&cond, &canonical.to_dtype(DType::F32), &rope, &cfg).unwrap();
        for to in [9000, 12, -7] {
            let want = CpuBackend.reuse(&canonical, Some(&patch), &rope, to).unwrap();
            let got = gpu.reuse(&canonical, Some(&patch), &rope, to).unwrap();
            within(&format!("{kernel} per-layer ranks to {to}"), &got, &want);
        }
    }
}

/// A patch of random factors stored in `dtype`, rank `ranks[l]` in layer `l` (K and V).
fn random_patch(layout: KvLayout, n: usize, ranks: &[usize], dtype: DType, seed: u64) -> Patch {
    let factor = |rows: usize, cols: usize, scale: f32, s: u64| {
        Mat::from_f32(rows, cols, (0..rows * cols).map(|i| scale * val(s, i)).collect())
            .unwrap()
            .to_dtype(dtype)
    };
    let low_rank = |r: usize, cols: usize, s: u64| LowRank {
        p: factor(n, r, 1.0, s),
        wt: factor(r, cols, 0.05, s + 1),
        spectrum: Vec::new(),
    };
    let layers = ranks
        .iter()
        .enumerate()
        .map(|(l, &r)| {
            let s = seed + 10 * l as u64;
            LayerPatch {
                k: low_rank(r, layout.k_features(), s),
                v: low_rank(r, layout.v_features(), s + 5),
            }
        })
        .collect();
    Patch::new(layout, n, layers).unwrap()
}

/// Chunks long enough that the pipelined tensor-core kernel's blocks take 8 row tiles (its ring
/// of 4 slots wraps around) and end on a partial tile, 512 columns in two column chunks, ranks of
/// one and three MMA k-steps (one of them not a multiple of 16), both 16-bit factor types.
#[test]
#[ignore = "needs a CUDA GPU; scripts/gpu-check.sh runs it with --include-ignored"]
fn long_chunks_through_the_tensor_core_pipeline_match_cpu_reference() {
    let gpus = cuda();
    let n = 4100;
    for (name, layout, rope) in [
        (
            "half-split",
            KvLayout::mha(2, 4, 128),
            RopeSpec::new(128, 1e6, PairLayout::HalfSplit),
        ),
        (
            "interleaved",
            KvLayout::gqa(2, 8, 4, 128),
            RopeSpec::new(128, 1e4, PairLayout::Interleaved),
        ),
    ] {
        for (src, factors, ranks) in [
            (DType::Bf16, DType::Bf16, [32, 40]),
            (DType::F16, DType::F16, [16, 48]),
            (DType::Bf16, DType::F16, [0, 33]),
        ] {
            let canonical = chunk(layout, n, 21, src);
            let patch = random_patch(layout, n, &ranks, factors, 22);
            for (dst, to) in [(src, 9000), (DType::F32, -17)] {
                let mut want = ChunkKv::zeros(layout, to - 2, n + 2, dst).unwrap();
                let mut got = want.clone();
                CpuBackend
                    .reuse_into(&canonical, Some(&patch), &rope, &mut want, 2)
                    .unwrap();
                gpus[0]
                    .reuse_into(&canonical, Some(&patch), &rope, &mut got, 2)
                    .unwrap();
                within(
                    &format!("4-col long {name} {src:?}->{dst:?} ranks {ranks:?} factors {factors:?}"),
                    &got,
                    &want,
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; scripts/gpu-check.sh runs it with --include-ignored"]
fn gather_matches_cpu_reference() {
    let gpus = cuda();
    for (kernel, gpu) in ["4-col", "2-col"].into_iter().zip(&gpus) {
        for (name, layout, rope) in flavours() {
            let (a, b, c) = (
                chunk(layout, 11, 3, DType::Bf16),
                chunk(layout, 29, 4, DType::F32),
                chunk(layout, 16, 5, DType::F16),
            );
            let cond = relocate(&chunk(layout, 29, 6, DType::F32), &rope, 300).unwrap();
            let patch = form_patch(&cond, &b, &rope, &PatchConfig::fixed(8, DType::F16)).unwrap();
            let parts = [
                Placement { chunk: &a, patch: None },
                Placement {
                    chunk: &b,
                    patch: Some(&patch),
                },
                Placement { chunk: &c, patch: None },
            ];
            for dtype in [DType::Bf16, DType::F32] {
                let want = CpuBackend.assemble(&parts, &rope, 77, dtype).unwrap();
                let got = gpu.assemble(&parts, &rope, 77, dtype).unwrap();
                within(&format!("{kernel} gather {name} into {dtype:?}"), &got, &want);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; scripts/gpu-check.sh runs it with --include-ignored"]
fn gpu_rejects_what_the_reference_rejects() {
    let gpus = cuda();
    for gpu in &gpus {
        let (_, layout, rope) = flavours().swap_remove(0);
        let mut small = ChunkKv::zeros(layout, 0, 4, DType::F32).unwrap();
        assert!(
            gpu.reuse_into(&chunk(layout, 8, 1, DType::F32), None, &rope, &mut small, 0)
                .is_err()
        );
        let mut nan = chunk(layout, 2, 1, DType::F32);
        if let Buf::F32(v) = nan.layers_mut()[0].k.data_mut() {
            v[3] = f32::NAN;
        }
        assert!(matches!(
            gpu.reuse(&nan, None, &rope, 5),
            Err(Error::Ops(kamera_ops::Error::NonFinite { .. }))
        ));
    }
}

/// The CPU backend is kamera-ops itself, and the CUDA backend without a GPU is an error, not a panic.
#[test]
fn cpu_backend_is_the_reference_and_cuda_fails_cleanly() {
    let (_, layout, rope) = flavours().swap_remove(1);
    let c = chunk(layout, 5, 9, DType::Bf16);
    assert_eq!(
        CpuBackend.reuse(&c, None, &rope, 42).unwrap(),
        reuse(&c, None, &rope, 42).unwrap()
    );
    assert!(CpuBackend.assemble(&[], &rope, 0, DType::F32).is_err());
    match CudaBackend::new(0) {
        Ok(gpu) => eprintln!("GPU present: {}", gpu.device_name()),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("cuda") || msg.contains("CUDA") || msg.contains("NVRTC"),
                "{msg}"
            );
        }
    }
}
