//! Algebra of relocation as property tests: composition, inverse, shift invariance of scores,
//! relocation equals prefill at the new position, MHA ≡ GQA with one group, MLA latent untouched.

mod common;
use common::*;
use kamera_ops::{DType, KvLayout, PairLayout, RopeSpec, relocate};
use proptest::prelude::*;

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cfg())]

    /// R(a)·R(b) = R(a + b) for every flavour.
    #[test]
    fn rotations_compose(a in -50_000i64..50_000, b in -50_000i64..50_000, seed in any::<u64>(), f in 0usize..6) {
        let (_, layout, rope) = flavours(2).swap_remove(f);
        let c = chunk(layout, 5, 0, seed, DType::F32);
        let two_steps = relocate(&relocate(&c, &rope, a).unwrap(), &rope, a + b).unwrap();
        let one_step = relocate(&c, &rope, a + b).unwrap();
        prop_assert!(chunk_diff(&two_steps, &one_step) < 2e-5, "diff {}", chunk_diff(&two_steps, &one_step));
    }

    /// A chunk's tokens taken in two runs and placed side by side are the chunk: its rows, at
    /// its positions, in every dtype (a run prefilled in one call, handed out chunk by chunk).
    #[test]
    fn rows_split_a_chunk_exactly(n in 1usize..12, cut in 0usize..12, seed in any::<u64>(), f in 0usize..6, d in 0usize..3) {
        let cut = cut % (n + 1);
        let (_, layout, rope) = flavours(2).swap_remove(f);
        let dtype = [DType::F32, DType::F16, DType::Bf16][d];
        let c = chunk(layout, n, 9, seed, dtype);
        let (head, tail) = (c.rows(0, cut).unwrap(), c.rows(cut, n - cut).unwrap());
        prop_assert_eq!((head.offset(), tail.offset()), (9, 9 + cut as i64));
        prop_assert_eq!((head.dtype(), tail.dtype()), (dtype, dtype));
        if cut > 0 && cut < n {
            let parts = [
                kamera_ops::Placement { chunk: &head, patch: None },
                kamera_ops::Placement { chunk: &tail, patch: None },
            ];
            let whole = kamera_ops::assemble(&parts, &rope, 9, dtype).unwrap();
            prop_assert_eq!(chunk_diff(&whole, &c), 0.0);
        }
        prop_assert!(c.rows(cut, n - cut + 1).is_err(), "past the end is an error");
    }

    /// R(−a)·R(a) = id.
    #[test]
    fn rotation_inverts(a in -1_000_000i64..1_000_000, seed in any::<u64>(), f in 0usize..6) {
        let (_, layout, rope) = flavours(2).swap_remove(f);
        let c = chunk(layout, 4, 7, seed, DType::F32);
        let back = relocate(&relocate(&c, &rope, 7 + a).unwrap(), &rope, 7).unwrap();
        prop_assert!(chunk_diff(&back, &c) < 1e-5);
    }

    /// A chunk prefilled alone at 0 and relocated to p equals the chunk prefilled alone at p.
    #[test]
    fn relocation_equals_prefill_at_target(p in 0i64..200_000, seed in any::<u64>(), f in 0usize..6) {
        let (_, layout, rope) = flavours(2).swap_remove(f);
        let canonical = prefilled(layout, &rope, 6, 0, seed);
        let there = prefilled(layout, &rope, 6, p, seed);
        let moved = relocate(&canonical, &rope, p).unwrap();
        prop_assert!(chunk_diff(&moved, &there) < 1e-4 * (1.0 + p as f32 / 10_000.0), "diff {}", chunk_diff(&moved, &there));
    }

    /// q·k depends only on the relative position, for every pair layout, partial rotary and
    /// M-RoPE (a joint shift adds δ to every section's position id).
    #[test]
    fn scores_invariant_under_joint_shift(
        pq in prop::array::uniform3(0i64..4096), pk in prop::array::uniform3(0i64..4096),
        delta in -100_000i64..100_000, seed in any::<u64>(), f in 0usize..5,
    ) {
        let (_, _, rope) = flavours(2).swap_remove(f);
        let mut rng = Rng(seed);
        let (q0, k0) = (rng.vec(rope.head_dim), rng.vec(rope.head_dim));
        let score = |sq: [i64; 3], sk: [i64; 3]| {
            let (mut q, mut k) = (q0.clone(), k0.clone());
            rope.apply_mrope(1, &mut q, 1, &[sq]).unwrap();
            rope.apply_mrope(1, &mut k, 1, &[sk]).unwrap();
            q.iter().zip(&k).map(|(a, b)| a * b).sum::<f32>()
        };
        let shifted = |p: [i64; 3]| p.map(|x| x + delta);
        let s0 = score(pq, pk);
        let s1 = score(shifted(pq), shifted(pk));
        prop_assert!((s0 - s1).abs() < 1e-4 * rope.head_dim as f32, "{s0} vs {s1}");
    }

    /// MHA is GQA with one query head per KV head: same relocated bytes.
    #[test]
    fn mha_equals_gqa_with_one_group(p in -10_000i64..10_000, seed in any::<u64>(), heads in 1usize..6) {
        let rope = RopeSpec::new(8, 1e4, PairLayout::HalfSplit);
        let mha = chunk(KvLayout::mha(2, heads, 8), 3, 0, seed, DType::F32);
        let gqa_layout = KvLayout::gqa(2, heads, heads, 8);
        let gqa = kamera_ops::ChunkKv::new(gqa_layout, 0, mha.layers().to_vec()).unwrap();
        let a = relocate(&mha, &rope, p).unwrap();
        let b = relocate(&gqa, &rope, p).unwrap();
        prop_assert_eq!(a.layers(), b.layers());
    }

    /// MLA relocation rotates only k_rope; the latent c_KV is copied byte for byte.
    #[test]
    fn mla_latent_bytes_identical(p in -100_000i64..100_000, seed in any::<u64>(), dt in 0usize..3) {
        let (_, layout, rope) = flavours(2).swap_remove(5);
        let dtype = [DType::F32, DType::F16, DType::Bf16][dt];
        let c = chunk(layout, 4, 0, seed, dtype);
        let moved = relocate(&c, &rope, p).unwrap();
        for (a, b) in moved.layers().iter().zip(c.layers()) {
            prop_assert_eq!(a.v.data(), b.v.data());
        }
    }
}

/// Half-precision storage relocates within its rounding of the f32 result.
#[test]
fn half_precision_relocation_tracks_f32() {
    for (name, layout, rope) in flavours(2) {
        let c = chunk(layout, 8, 0, 42, DType::F32);
        let exact = relocate(&c, &rope, 12_345).unwrap();
        for (dtype, tol) in [(DType::F16, 2e-3), (DType::Bf16, 1.6e-2)] {
            let moved = relocate(&c.to_dtype(dtype), &rope, 12_345).unwrap();
            assert_eq!(moved.dtype(), dtype);
            let d = chunk_diff(&moved, &exact);
            assert!(d < tol, "{name} {dtype:?}: {d}");
        }
    }
}

/// Pair layouts differ: the same data relocated under the other layout gives other keys.
#[test]
fn pair_layouts_are_distinct() {
    let layout = KvLayout::gqa(1, 2, 1, 8);
    let c = chunk(layout, 2, 0, 1, DType::F32);
    let a = relocate(&c, &RopeSpec::new(8, 1e4, PairLayout::Interleaved), 9).unwrap();
    let b = relocate(&c, &RopeSpec::new(8, 1e4, PairLayout::HalfSplit), 9).unwrap();
    assert!(chunk_diff(&a, &b) > 1e-2);
}
