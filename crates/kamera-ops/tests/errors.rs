//! Bad input is a typed error naming the op and the shapes, never a panic.

mod common;
use common::*;
use kamera_ops::*;

fn rope() -> RopeSpec {
    RopeSpec::new(16, 1e4, PairLayout::HalfSplit)
}

#[test]
fn shape_mismatches_are_errors() {
    let layout = KvLayout::gqa(2, 4, 2, 16);
    assert!(matches!(
        Mat::from_f32(2, 3, vec![0.0; 5]),
        Err(Error::Shape { op: "Mat::new", .. })
    ));
    let bad_layer = LayerKv {
        k: Mat::zeros(2, 31, DType::F32),
        v: Mat::zeros(2, 32, DType::F32),
    };
    let e = ChunkKv::new(layout, 0, vec![bad_layer.clone(), bad_layer]).unwrap_err();
    assert!(e.to_string().contains("k features"), "{e}");
    let a = chunk(layout, 4, 0, 1, DType::F32);
    let b = chunk(layout, 5, 0, 2, DType::F32);
    let e = form_patch(&b, &a, &rope(), &PatchConfig::fixed(2, DType::F32)).unwrap_err();
    assert!(matches!(e, Error::Shape { op: "deficit", .. }), "{e}");
    let other = chunk(KvLayout::gqa(2, 4, 4, 16), 4, 0, 3, DType::F32);
    assert!(matches!(deficit(&other, &a, &rope()), Err(Error::Shape { .. })));
    let wrong_dim = RopeSpec::new(8, 1e4, PairLayout::HalfSplit);
    assert!(matches!(
        relocate(&a, &wrong_dim, 3),
        Err(Error::Shape { op: "relocate", .. })
    ));
    let three_bases = rope().with_layer_bases(vec![1e4, 1e5, 1e6]);
    assert!(relocate(&a, &three_bases, 3).is_err());
    let mut small = ChunkKv::zeros(layout, 0, 5, DType::F32).unwrap();
    assert!(matches!(
        reuse_into(&a, None, &rope(), &mut small, 2),
        Err(Error::Shape { op: "reuse_into", .. })
    ));
    // Head-first destinations: groups that split no head evenly, too few rows, a short buffer.
    let heads = |groups, cap, row0| Heads { groups, cap, row0 };
    let mut dst = vec![0f32; 2 * 8 * 16];
    for (h, len) in [
        (heads(3, 8, 0), 256),
        (heads(2, 8, 5), 256),
        (heads(2, 8, 0), 255),
        (heads(0, 8, 0), 256),
    ] {
        let e = reuse_heads(&a, None, &rope(), 0, false, 3, &mut dst[..len], h).unwrap_err();
        assert!(matches!(e, Error::Shape { op: "reuse_heads", .. }), "{e}");
    }
    assert!(reuse_heads(&a, None, &rope(), 0, false, 3, &mut dst, heads(2, 8, 4)).is_ok());
    let patch = form_patch(&a, &a, &rope(), &PatchConfig::fixed(1, DType::F32)).unwrap();
    assert!(reuse(&b, Some(&patch), &rope(), 0).is_err());
    assert!(assemble(&[], &rope(), 0, DType::F32).is_err());
    assert!(matches!(
        relocate(&chunk(layout, 1, 1, 1, DType::F32), &rope(), i64::MIN),
        Err(Error::Shape { .. })
    ));
    let per_layer = PatchConfig {
        rank: RankPolicy::PerLayer(vec![1]),
        dtype: DType::F32,
        ..PatchConfig::fixed(0, DType::F32)
    };
    assert!(form_patch(&a, &a, &rope(), &per_layer).is_err());
    let neg = PatchConfig {
        rank: RankPolicy::Budget { fraction: f64::NAN },
        dtype: DType::F32,
        ..PatchConfig::fixed(0, DType::F32)
    };
    assert!(form_patch(&a, &a, &rope(), &neg).is_err());
}

#[test]
fn non_finite_input_is_an_error() {
    let layout = KvLayout::gqa(1, 2, 1, 16);
    let mut k = vec![0.5f32; 3 * 16];
    k[17] = f32::NAN;
    let layer = LayerKv {
        k: Mat::from_f32(3, 16, k).unwrap(),
        v: Mat::zeros(3, 16, DType::F32),
    };
    let bad = ChunkKv::new(layout, 0, vec![layer]).unwrap();
    let good = chunk(layout, 3, 0, 9, DType::F32);
    assert!(matches!(
        relocate(&bad, &rope(), 5),
        Err(Error::NonFinite {
            op: "relocate",
            index: 17,
            ..
        })
    ));
    assert!(matches!(relocate(&bad, &rope(), 0), Err(Error::NonFinite { .. })));
    assert!(matches!(reuse(&bad, None, &rope(), 5), Err(Error::NonFinite { .. })));
    assert!(matches!(
        form_patch(&bad, &good, &rope(), &PatchConfig::fixed(1, DType::F32)),
        Err(Error::NonFinite { op: "deficit", .. })
    ));
    let inf = ChunkKv::new(
        layout,
        0,
        vec![LayerKv {
            k: Mat::zeros(3, 16, DType::F32),
            v: Mat::from_f32(3, 16, vec![f32::INFINITY; 48]).unwrap(),
        }],
    )
    .unwrap();
    assert!(matches!(
        form_patch(&good, &inf, &rope(), &PatchConfig::fixed(1, DType::F32)),
        Err(Error::NonFinite { .. })
    ));
}

/// Each step of the fused pass that ends a block (the rotation, the patch's product, the plain
/// copy) finds a non-finite value and names its index, on the vector kernels' shapes (heads of
/// 32, half 16) and through `reuse_heads` too.
#[test]
fn every_last_step_finds_non_finite_values() {
    let layout = KvLayout::gqa(1, 4, 2, 32);
    let rope = RopeSpec::new(32, 1e4, PairLayout::HalfSplit);
    let good = chunk(layout, 70, 0, 3, DType::F32);
    let cond = relocate(&chunk(layout, 70, 0, 4, DType::F32), &rope, 0).unwrap();
    let patch = form_patch(&cond, &good, &rope, &PatchConfig::fixed(4, DType::F32)).unwrap();
    let spoilt = |k_at: Option<usize>, v_at: Option<usize>, value: f32| {
        let (mut k, mut v) = (good.layers()[0].k.to_f32_vec(), good.layers()[0].v.to_f32_vec());
        if let Some(i) = k_at {
            k[i] = value;
        }
        if let Some(i) = v_at {
            v[i] = value;
        }
        let layer = LayerKv {
            k: Mat::from_f32(70, 64, k).unwrap(),
            v: Mat::from_f32(70, 64, v).unwrap(),
        };
        ChunkKv::new(layout, 0, vec![layer]).unwrap()
    };
    let index = |r: Result<ChunkKv>| match r {
        Err(Error::NonFinite { index, .. }) => Some(index),
        _ => None,
    };
    for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        // K rotated (with and without a patch), V patched, V copied.
        let k_bad = spoilt(Some(4000), None, value);
        assert_eq!(index(reuse(&k_bad, None, &rope, 9)), Some(4000), "{value}");
        assert_eq!(index(reuse(&k_bad, Some(&patch), &rope, 9)), Some(4000), "{value}");
        let v_bad = spoilt(None, Some(130), value);
        assert_eq!(index(reuse(&v_bad, Some(&patch), &rope, 9)), Some(130), "{value}");
        assert_eq!(index(reuse(&v_bad, None, &rope, 9)), Some(130), "{value}");
        let mut dst = vec![0f32; 2 * 80 * 32];
        let heads = Heads {
            groups: 2,
            cap: 80,
            row0: 3,
        };
        let e = reuse_heads(&k_bad, Some(&patch), &rope, 0, false, 9, &mut dst, heads).unwrap_err();
        assert!(matches!(e, Error::NonFinite { index: 4000, .. }), "{value}: {e}");
    }
    assert!(reuse(&good, Some(&patch), &rope, 9).is_ok());
}

#[test]
fn unsupported_specs_are_errors() {
    let yarn = rope().with_scaling(RopeScaling::Other { kind: "yarn".into() });
    let e = yarn.validate().unwrap_err();
    assert!(e.to_string().contains("yarn"), "{e}");
    assert!(yarn.inv_freqs(0).is_err());
    assert!(
        rope()
            .with_scaling(RopeScaling::Linear { factor: 0.0 })
            .validate()
            .is_err()
    );
    assert!(rope().with_rotary_dims(7).validate().is_err());
    assert!(rope().with_rotary_dims(32).validate().is_err());
    assert!(rope().with_mrope([2, 2, 2]).validate().is_err());
    assert!(RopeSpec::new(16, 1.0, PairLayout::Interleaved).validate().is_err());
    assert!(KvLayout::gqa(2, 6, 4, 16).validate().is_err());
    assert!(KvLayout::mha(0, 2, 16).validate().is_err());
    let mut x = vec![0.0f32; 10];
    assert!(rope().apply(0, &mut x, 1, &[0]).is_err());
}

#[test]
fn linear_scaling_divides_positions() {
    let scaled = rope().with_scaling(RopeScaling::Linear { factor: 4.0 });
    let (c1, s1) = scaled.cos_sin(0, &[400]).unwrap();
    let (c2, s2) = rope().cos_sin(0, &[100]).unwrap();
    assert!(max_abs_diff(&c1, &c2) < 1e-6 && max_abs_diff(&s1, &s2) < 1e-6);
}
