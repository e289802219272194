//! The device transformer against a plain f32 CPU forward of the same (bf16-rounded, seeded
//! random) weights: logits and K/V of a prefill, a prefill split in two, and a chunk placed
//! (relocated + patched) into a device context against kamera-ops' reuse. `#[ignore]`d: a CPU run
//! never counts them; scripts/gpu-check.sh runs them on a device with `--include-ignored`.

use kamera_gpu::{DeviceModel, DevicePool, HostWeights, ModelSpec, reference_prefill};
use kamera_ops::{ChunkKv, DType, LayerPatch, LowRank, Mat, PairLayout, Patch, RopeSpec};

/// The tests are ignored on a plain run; run with `--ignored` they need a device, and its
/// absence is a failure, not a pass.
fn device(spec: &ModelSpec, w: &HostWeights) -> DeviceModel {
    DeviceModel::new(0, spec.clone(), w).unwrap_or_else(|e| {
        panic!("no CUDA device for a device-model test (build with --features cuda, run on a GPU): {e}")
    })
}

/// ‖a − b‖ / ‖b‖.
fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let d: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let n: f32 = b.iter().map(|y| y * y).sum();
    (d / n.max(1e-30)).sqrt()
}

fn specs() -> Vec<(&'static str, ModelSpec)> {
    let qwen = ModelSpec::plain(3, 128, 256, 4, 2, 32, 300, 1e-6, 1e6, PairLayout::HalfSplit, true);
    let llama = ModelSpec::plain(2, 192, 320, 6, 2, 32, 257, 1e-5, 1e5, PairLayout::Interleaved, false);
    let mut gemma = ModelSpec::plain(3, 128, 192, 2, 1, 64, 300, 1e-6, 1e6, PairLayout::HalfSplit, false);
    gemma.qk_norm = true;
    gemma.post_norms = true;
    gemma.gelu = true;
    gemma.embed_scale = (128f32).sqrt();
    gemma.attn_scale = 0.1;
    gemma.windows = vec![Some(7), Some(7), None];
    gemma.rope = RopeSpec::new(64, 1e6, PairLayout::HalfSplit).with_layer_bases(vec![1e4, 1e4, 1e6]);
    vec![("qwen2-like", qwen), ("llama-like", llama), ("gemma3-like", gemma)]
}

fn toks(n: usize, vocab: usize, seed: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 131 + seed * 17 + 5) % vocab) as u32).collect()
}

#[test]
#[ignore = "needs a CUDA GPU; scripts/gpu-check.sh runs it with --include-ignored"]
fn prefill_matches_cpu_reference() {
    for (name, spec) in specs() {
        let w = HostWeights::random(&spec, 7);
        let m = device(&spec, &w);
        let t = toks(45, spec.vocab, 1);
        let (want, kvs) = reference_prefill(&spec, &w, &t);
        let mut kv = m.context(0).unwrap();
        let got = m.prefill(&mut kv, &t, false).unwrap();
        let e = rel(&got, &want);
        eprintln!("{name}: logits rel err {e:.2e}");
        assert!(e < 2e-2, "{name}: logits rel err {e}");
        let chunk = m.download(&kv, 0).unwrap();
        for (l, (k, v)) in kvs.iter().enumerate() {
            let (gk, gv) = (chunk.layers()[l].k.to_f32_vec(), chunk.layers()[l].v.to_f32_vec());
            assert!(rel(&gk, k) < 2e-2 && rel(&gv, v) < 2e-2, "{name}: layer {l} K/V differ");
        }
        // The same tokens in two prefills (the second attends to the first's context rows).
        let mut kv2 = m.context(0).unwrap();
        m.prefill(&mut kv2, &t[..30], false).unwrap();
        let split = m.prefill(&mut kv2, &t[30..], false).unwrap();
        let e2 = rel(&split, &got);
        assert!(e2 < 5e-3, "{name}: split prefill rel err {e2}");
        // All logits: the last row is the last-token logits.
        let mut kv3 = m.context(0).unwrap();
        let all = m.prefill(&mut kv3, &t, true).unwrap();
        assert_eq!(all.len(), t.len() * spec.vocab);
        assert!(rel(&all[(t.len() - 1) * spec.vocab..], &got) < 1e-5);
    }
}

#[test]
#[ignore = "needs a CUDA GPU; scripts/gpu-check.sh runs it with --include-ignored"]
fn bad_input_is_an_error() {
    let (_, spec) = specs().remove(0);
    let w = HostWeights::random(&spec, 3);
    let m = device(&spec, &w);
    let mut kv = m.context(0).unwrap();
    assert!(m.prefill(&mut kv, &[], false).is_err());
    assert!(m.prefill(&mut kv, &[spec.vocab as u32], false).is_err());
    assert_eq!(kv.len(), 0);
    let mut bad = spec.clone();
    bad.head_dim = 48;
    assert!(DeviceModel::new(0, bad, &w).is_err());
}

/// A chunk prefilled alone at 0, made resident and placed at position 20 with a patch, equals
/// kamera-ops' reuse of the same canonical KV and patch (one bf16 rounding apart).
#[test]
#[ignore = "needs a CUDA GPU; scripts/gpu-check.sh runs it with --include-ignored"]
fn placed_chunk_matches_cpu_reuse() {
    for (name, spec) in specs() {
        let w = HostWeights::random(&spec, 11);
        let m = device(&spec, &w);
        let mut kv = m.context(0).unwrap();
        m.prefill(&mut kv, &toks(24, spec.vocab, 2), false).unwrap();
        let canonical = m.download(&kv, 0).unwrap();
        let layout = spec.kv_layout();
        let lr = |cols: usize, salt: usize| LowRank {
            p: Mat::from_f32(
                24,
                5,
                (0..120).map(|i| ((i * 37 + salt) % 19) as f32 / 19.0 - 0.5).collect(),
            )
            .unwrap()
            .to_dtype(DType::Bf16),
            wt: Mat::from_f32(
                5,
                cols,
                (0..5 * cols).map(|i| ((i * 11 + salt) % 23) as f32 / 230.0).collect(),
            )
            .unwrap()
            .to_dtype(DType::Bf16),
            spectrum: Vec::new(),
        };
        let layers = (0..spec.layers)
            .map(|l| LayerPatch {
                k: lr(layout.k_features(), l),
                v: lr(layout.v_features(), l + 3),
            })
            .collect();
        let patch = Patch::new(layout, 24, layers).unwrap();
        let mut pool = DevicePool::new(1 << 30);
        let resident = pool
            .get_or_upload(m.backend(), [1; 32], || Ok(canonical.clone()))
            .unwrap();
        let mut ctx = m.context(0).unwrap();
        m.prefill(&mut ctx, &toks(20, spec.vocab, 3), false).unwrap();
        m.place(&mut ctx, resident, Some(&patch)).unwrap();
        assert_eq!((ctx.len(), ctx.end()), (44, 44));
        let placed = m.download(&ctx, 20).unwrap();
        let want: ChunkKv = kamera_ops::reuse(&canonical, Some(&patch), &spec.rope, 20).unwrap();
        for l in 0..spec.layers {
            let (a, b) = (&placed.layers()[l], &want.layers()[l]);
            let (ek, ev) = (
                rel(&a.k.to_f32_vec(), &b.k.to_f32_vec()),
                rel(&a.v.to_f32_vec(), &b.v.to_f32_vec()),
            );
            assert!(
                ek < 1e-2 && ev < 1e-2,
                "{name}: layer {l} placed K/V rel err {ek} / {ev}"
            );
        }
        // The context keeps growing past the placed chunk.
        m.prefill(&mut ctx, &toks(3, spec.vocab, 4), false).unwrap();
        assert_eq!(ctx.end(), 47);
        assert_eq!(pool.stats().resident, 1);
    }
}
