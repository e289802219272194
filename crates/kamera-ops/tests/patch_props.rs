//! The patch as algebra: exact at the deficit's rank, Eckart-Young truncation error, fused reuse
//! equal to relocate-then-add, byte accounting and budgets, orbit averaging.

mod common;
use common::{Rng, chunk, chunk_diff, flavours, max_abs_diff, prefilled};
use kamera_ops::*;
use proptest::prelude::*;

/// A deficit of exact rank `r`: Σ_j a_j b_jᵀ over random vectors.
fn low_rank(rows: usize, cols: usize, r: usize, rng: &mut Rng) -> Vec<f32> {
    let (a, b) = (rng.vec(rows * r), rng.vec(cols * r));
    let mut m = vec![0.0f32; rows * cols];
    for i in 0..rows {
        for c in 0..cols {
            m[i * cols + c] = (0..r).map(|j| a[i * r + j] * b[c * r + j]).sum();
        }
    }
    m
}

/// `canonical` plus a rank-`r` deficit per layer and channel, placed at `offset` like a
/// conditioned prefill (keys rotated there).
fn conditioned(canonical: &ChunkKv, rope: &RopeSpec, r: usize, offset: i64, seed: u64) -> ChunkKv {
    let mut rng = Rng(seed);
    let n = canonical.n_tokens();
    let layers = canonical
        .layers()
        .iter()
        .map(|kv| {
            let add = |m: &Mat, rng: &mut Rng| {
                let d = low_rank(n, m.cols(), r, rng);
                Mat::from_f32(n, m.cols(), m.to_f32_vec().iter().zip(d).map(|(x, y)| x + y).collect()).unwrap()
            };
            LayerKv {
                k: add(&kv.k, &mut rng),
                v: add(&kv.v, &mut rng),
            }
        })
        .collect();
    let c = ChunkKv::new(*canonical.layout(), canonical.offset(), layers).unwrap();
    relocate(&c, rope, offset).unwrap()
}

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cfg())]

    /// A rank-r deficit is recovered exactly by a rank-r patch, and reuse at the conditioned
    /// position reproduces the conditioned KV; rank r−1 does not.
    #[test]
    fn patch_is_exact_at_deficit_rank(r in 1usize..5, p in 0i64..5000, seed in any::<u64>(), f in 0usize..6) {
        let (_, layout, rope) = flavours(2).swap_remove(f);
        let canonical = chunk(layout, 12, 0, seed, DType::F32);
        let cond = conditioned(&canonical, &rope, r, p, seed ^ 1);
        let patch = form_patch(&cond, &canonical, &rope, &PatchConfig::fixed(r, DType::F32)).unwrap();
        let rebuilt = reuse(&canonical, Some(&patch), &rope, p).unwrap();
        // An f32 SVD: relative to the values' scale (a few, up to ~3).
        let scale = cond.layers().iter().flat_map(|l| l.k.to_f32_vec()).fold(1f32, |a, b| a.max(b.abs()));
        prop_assert!(chunk_diff(&rebuilt, &cond) < 2e-4 * scale, "rank {r}: {} (scale {scale})", chunk_diff(&rebuilt, &cond));
        let short = form_patch(&cond, &canonical, &rope, &PatchConfig::fixed(r - 1, DType::F32)).unwrap();
        let worse = reuse(&canonical, Some(&short), &rope, p).unwrap();
        prop_assert!(chunk_diff(&worse, &cond) > 1e-3);
    }

    /// ‖M − P Wᵀ‖²_F equals the tail singular energy Σ_{j≥m} σ_j² (Eckart-Young).
    #[test]
    fn truncation_error_is_tail_energy(rows in 2usize..24, cols in 2usize..24, m in 0usize..24, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let data = rng.vec(rows * cols);
        let mat = Mat::from_f32(rows, cols, data.clone()).unwrap();
        let svd = Svd::compute(&mat).unwrap();
        let lr = svd.truncate(m, DType::F32).unwrap();
        prop_assert_eq!(lr.rank(), m.min(rows).min(cols));
        let err: f64 = data.iter().zip(lr.dense()).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let tail = svd.tail_energy(m);
        let total: f64 = data.iter().map(|x| (*x as f64).powi(2)).sum();
        prop_assert!((err - tail).abs() <= 1e-4 * total + 1e-7, "err {err} tail {tail}");
        prop_assert!(svd.singular.windows(2).all(|w| w[0] >= w[1]));
    }

    /// Fused reuse = relocate(canonical + patch) = relocate(canonical) + relocate(patch), in every
    /// storage type and into a destination of another type.
    #[test]
    fn fused_reuse_equals_relocate_then_add(r in 0usize..4, p in -3000i64..3000, seed in any::<u64>(), f in 0usize..6, dt in 0usize..3) {
        let (_, layout, rope) = flavours(2).swap_remove(f);
        let dtype = [DType::F32, DType::F16, DType::Bf16][dt];
        let canonical = chunk(layout, 9, 0, seed, DType::F32);
        let cond = conditioned(&canonical, &rope, 3, 40, seed ^ 7);
        let patch = form_patch(&cond, &canonical, &rope, &PatchConfig::fixed(r, DType::F32)).unwrap();
        let fused = reuse(&canonical, Some(&patch), &rope, p).unwrap();
        let two_pass = relocate(&apply_patch(&canonical, &patch).unwrap(), &rope, p).unwrap();
        prop_assert!(chunk_diff(&fused, &two_pass) < 1e-5);
        // Linearity: relocating the dense patch separately and adding gives the same keys.
        let moved = relocate(&canonical, &rope, p).unwrap();
        let dense_layers = patch.layers().iter().map(|lp| LayerKv {
            k: Mat::from_f32(9, layout.k_features(), lp.k.dense()).unwrap(),
            v: Mat::from_f32(9, layout.v_features(), lp.v.dense()).unwrap(),
        }).collect();
        let dense = relocate(&ChunkKv::new(layout, 0, dense_layers).unwrap(), &rope, p).unwrap();
        let sum = ChunkKv::new(layout, p, moved.layers().iter().zip(dense.layers()).map(|(a, b)| LayerKv {
            k: Mat::from_f32(9, a.k.cols(), a.k.to_f32_vec().iter().zip(b.k.to_f32_vec()).map(|(x, y)| x + y).collect()).unwrap(),
            v: Mat::from_f32(9, a.v.cols(), a.v.to_f32_vec().iter().zip(b.v.to_f32_vec()).map(|(x, y)| x + y).collect()).unwrap(),
        }).collect()).unwrap();
        prop_assert!(chunk_diff(&fused, &sum) < 1e-5);
        // Half-precision canonical KV into an f32 destination, and f32 into half precision.
        let half = reuse(&canonical.to_dtype(dtype), Some(&patch), &rope, p).unwrap();
        prop_assert_eq!(half.dtype(), dtype);
        let tol = match dtype { DType::F32 => 1e-5, DType::F16 => 6e-3, DType::Bf16 => 5e-2 };
        prop_assert!(chunk_diff(&half, &two_pass) < tol, "{dtype:?} {}", chunk_diff(&half, &two_pass));
        // reuse (rows appended to new buffers) = reuse_into a zeroed chunk, exactly.
        let mut whole = ChunkKv::zeros(layout, p, 9, dtype).unwrap();
        reuse_into(&canonical.to_dtype(dtype), Some(&patch), &rope, &mut whole, 0).unwrap();
        prop_assert_eq!(chunk_diff(&half, &whole), 0.0);
        let mut dst = ChunkKv::zeros(layout, p - 2, 12, dtype).unwrap();
        reuse_into(&canonical, Some(&patch), &rope, &mut dst, 2).unwrap();
        let rows: Vec<f32> = dst.layers()[1].k.to_f32_vec()[2 * layout.k_features()..11 * layout.k_features()].to_vec();
        prop_assert!(max_abs_diff(&rows, &two_pass.layers()[1].k.to_f32_vec()) < tol);
    }

    /// A byte budget is never exceeded, and a larger budget never stores fewer directions.
    #[test]
    fn budget_ranks_respect_budget(frac in 0.0f64..0.6, seed in any::<u64>(), f in 0usize..6) {
        let (_, layout, rope) = flavours(3).swap_remove(f);
        let canonical = chunk(layout, 16, 0, seed, DType::Bf16);
        let cond = conditioned(&canonical.to_dtype(DType::F32), &rope, 6, 100, seed ^ 3);
        let cfg = |fraction| PatchConfig { rank: RankPolicy::Budget { fraction }, ..PatchConfig::fixed(0, DType::Bf16) };
        let small = form_patch(&cond, &canonical, &rope, &cfg(frac)).unwrap();
        let big = form_patch(&cond, &canonical, &rope, &cfg(frac + 0.2)).unwrap();
        prop_assert!(small.bytes() as f64 <= frac * canonical.kv_bytes() as f64);
        let dirs = |p: &Patch| p.ranks().iter().map(|(k, v)| k + v).sum::<usize>();
        prop_assert!(dirs(&big) >= dirs(&small));
        let share = PatchConfig { rank: RankPolicy::BudgetShare { fraction: frac }, ..PatchConfig::fixed(0, DType::Bf16) };
        let by_share = form_patch(&cond, &canonical, &rope, &share).unwrap();
        prop_assert!(by_share.bytes() as f64 <= frac * canonical.kv_bytes() as f64);
    }
}

/// Exact byte accounting: (tokens + features) × rank × element size, per layer and channel.
#[test]
fn patch_bytes_are_exact() {
    for (name, layout, rope) in flavours(3) {
        let canonical = chunk(layout, 20, 0, 5, DType::Bf16);
        let cond = conditioned(&canonical.to_dtype(DType::F32), &rope, 8, 64, 6);
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let patch = form_patch(&cond, &canonical, &rope, &PatchConfig::fixed(4, dtype)).unwrap();
            let want = 3 * 4 * dtype.size() * ((20 + layout.k_features()) + (20 + layout.v_features()));
            assert_eq!(patch.bytes(), want, "{name}");
            let kv = 3 * 20 * 2 * (layout.k_features() + layout.v_features());
            assert_eq!(canonical.kv_bytes(), kv);
            assert!((patch.bytes_ratio(&canonical) - want as f64 / kv as f64).abs() < 1e-12);
        }
    }
}

/// The budget gives more directions to the layer whose deficit holds more energy.
#[test]
fn budget_prefers_energetic_layers() {
    let (_, layout, rope) = flavours(2).swap_remove(0);
    let canonical = chunk(layout, 32, 0, 11, DType::F32);
    let mut cond = conditioned(&canonical, &rope, 8, 0, 12);
    // Shrink layer 0's deficit tenfold.
    let l0 = &canonical.layers()[0];
    let scaled = |c: &Mat, b: &Mat| {
        Mat::from_f32(
            c.rows(),
            c.cols(),
            c.to_f32_vec()
                .iter()
                .zip(b.to_f32_vec())
                .map(|(x, y)| y + 0.1 * (x - y))
                .collect(),
        )
        .unwrap()
    };
    let new0 = LayerKv {
        k: scaled(&cond.layers()[0].k, &l0.k),
        v: scaled(&cond.layers()[0].v, &l0.v),
    };
    cond.layers_mut()[0] = new0;
    let patch = form_patch(
        &cond,
        &canonical,
        &rope,
        &PatchConfig {
            rank: RankPolicy::Budget { fraction: 0.3 },
            dtype: DType::F32,
            ..PatchConfig::fixed(0, DType::F32)
        },
    )
    .unwrap();
    let r = patch.ranks();
    assert!(r[1].0 + r[1].1 > r[0].0 + r[0].1, "{r:?}");
}

/// The orbit patch is the patch of the mean deficit; with one ordering it is the plain patch.
#[test]
fn orbit_patch_averages_deficits() {
    let (_, layout, rope) = flavours(2).swap_remove(1);
    let canonical = chunk(layout, 10, 0, 21, DType::F32);
    let a = conditioned(&canonical, &rope, 2, 30, 22);
    let b = conditioned(&canonical, &rope, 2, 75, 23);
    let cfg = PatchConfig::fixed(10, DType::F32);
    let single = orbit_patch(std::slice::from_ref(&a), &canonical, &rope, &cfg).unwrap();
    let plain = form_patch(&a, &canonical, &rope, &cfg).unwrap();
    assert!(
        chunk_diff(
            &reuse(&canonical, Some(&single), &rope, 0).unwrap(),
            &reuse(&canonical, Some(&plain), &rope, 0).unwrap()
        ) < 1e-5
    );
    // Rank 4 holds both rank-2 deficits, so the orbit patch reproduces their exact mean.
    let orbit = orbit_patch(
        &[a.clone(), b.clone()],
        &canonical,
        &rope,
        &PatchConfig::fixed(4, DType::F32),
    )
    .unwrap();
    let rebuilt = reuse(&canonical, Some(&orbit), &rope, 0).unwrap();
    let (a0, b0) = (relocate(&a, &rope, 0).unwrap(), relocate(&b, &rope, 0).unwrap());
    for l in 0..2 {
        let mean: Vec<f32> = a0.layers()[l]
            .k
            .to_f32_vec()
            .iter()
            .zip(b0.layers()[l].k.to_f32_vec())
            .map(|(x, y)| 0.5 * (x + y))
            .collect();
        assert!(max_abs_diff(&mean, &rebuilt.layers()[l].k.to_f32_vec()) < 1e-4);
    }
}

/// Assembling placed chunks equals reusing each at its slot.
#[test]
fn assemble_places_chunks_contiguously() {
    let (_, layout, rope) = flavours(2).swap_remove(0);
    let (a, b) = (chunk(layout, 3, 0, 1, DType::F32), chunk(layout, 5, 0, 2, DType::Bf16));
    let ctx = assemble(
        &[
            Placement { chunk: &a, patch: None },
            Placement { chunk: &b, patch: None },
        ],
        &rope,
        10,
        DType::F32,
    )
    .unwrap();
    assert_eq!((ctx.offset(), ctx.n_tokens()), (10, 8));
    let kf = layout.k_features();
    let kb = reuse(&b.to_dtype(DType::F32), None, &rope, 13).unwrap();
    assert!(
        max_abs_diff(
            &ctx.layers()[1].k.to_f32_vec()[3 * kf..],
            &kb.layers()[1].k.to_f32_vec()
        ) < 1e-6
    );
}

/// K and V budgets apart, energy ranks, dropped layers and quantised factors: each keeps its
/// promise on bytes or energy, and quantised budgets count the bytes the codes take.
#[test]
fn compact_patch_policies_keep_their_promises() {
    for (name, layout, rope) in flavours(3) {
        let canonical = chunk(layout, 24, 0, 31, DType::F32);
        let cond = conditioned(&canonical, &rope, 6, 40, 32);
        let kv = canonical.kv_bytes() as f64;
        let form = |rank, quant, drop_below| {
            let cfg = PatchConfig {
                rank,
                quant,
                drop_below,
                ..PatchConfig::fixed(0, DType::F32)
            };
            form_patch(&cond, &canonical, &rope, &cfg).unwrap()
        };
        let split = form(RankPolicy::BudgetKv { k: 0.05, v: 0.2 }, Quant::None, 0.0);
        let bytes = |p: &Patch, ch: usize| -> usize {
            p.ranks()
                .iter()
                .map(|r| {
                    let (m, f) = if ch == 0 {
                        (r.0, layout.k_features())
                    } else {
                        (r.1, layout.v_features())
                    };
                    m * (24 + f) * 4
                })
                .sum()
        };
        assert!(
            bytes(&split, 0) as f64 <= 0.05 * kv && bytes(&split, 1) as f64 <= 0.2 * kv,
            "{name}"
        );
        assert!(bytes(&split, 1) > bytes(&split, 0), "{name}");
        // Energy ranks: every matrix keeps at least 90% of its energy, with its smallest such rank.
        let e = form(RankPolicy::Energy { k: 0.9, v: 0.9 }, Quant::None, 0.0);
        for lp in e.layers() {
            for lr in [&lp.k, &lp.v] {
                let r = lr.rank();
                assert!(lr.energy_share(r) >= 0.9 - 1e-9, "{name}");
                assert!(r == 0 || lr.energy_share(r - 1) < 0.9, "{name}");
            }
        }
        // Dropping at a share above any layer's keeps nothing; at 0 keeps everything.
        assert!(
            form(RankPolicy::Fixed(3), Quant::None, 1.1)
                .ranks()
                .iter()
                .all(|r| *r == (0, 0))
        );
        for quant in [Quant::Int8, Quant::Int4, Quant::Int4Mixed] {
            let q = form(RankPolicy::Budget { fraction: 0.1 }, quant, 0.0);
            assert_eq!(q.quant(), quant);
            assert!(q.bytes() as f64 <= 0.1 * kv, "{name} {quant:?}");
            // More directions than the float patch at the same budget.
            let f = form(RankPolicy::Budget { fraction: 0.1 }, Quant::None, 0.0);
            let dirs = |p: &Patch| p.ranks().iter().map(|(k, v)| k + v).sum::<usize>();
            assert!(dirs(&q) > dirs(&f), "{name} {quant:?}");
            // The quantised patch stays close to the float one of its ranks.
            let fixed = form(RankPolicy::Fixed(4), Quant::None, 0.0);
            let qf = fixed.quantise(quant).unwrap();
            let flags = if quant == Quant::Int4Mixed { 3 } else { 0 };
            let want: usize = qf
                .scales()
                .iter()
                .map(|(sk, sv)| {
                    if let Some(g) = quant.grain() {
                        assert_eq!((sk.grain, sv.grain), ([g, g], [g, g]), "{name}");
                    }
                    quant.factor_bytes(24, 4, layout.k_features(), sk.grain)
                        + quant.factor_bytes(24, 4, layout.v_features(), sv.grain)
                })
                .sum();
            assert_eq!(qf.bytes(), want + flags, "{name}");
            let (a, b) = (
                reuse(&canonical, Some(&fixed), &rope, 5).unwrap(),
                reuse(&canonical, Some(&qf), &rope, 5).unwrap(),
            );
            let scale = chunk_diff(&reuse(&canonical, None, &rope, 5).unwrap(), &a);
            let tol = if quant == Quant::Int8 { 0.05 } else { 0.5 };
            assert!(
                chunk_diff(&a, &b) <= tol * scale,
                "{name} {quant:?} {} vs {scale}",
                chunk_diff(&a, &b)
            );
            assert!(qf.quantise(quant).is_err());
        }
    }
}

/// Slot orbit patches: one per slot, each the orbit patch of the orderings with the chunk there.
#[test]
fn slot_orbit_patches_split_by_slot() {
    let (_, layout, rope) = flavours(2).swap_remove(0);
    let canonical = chunk(layout, 10, 0, 41, DType::F32);
    let (a, b, c) = (
        conditioned(&canonical, &rope, 2, 30, 42),
        conditioned(&canonical, &rope, 2, 60, 43),
        conditioned(&canonical, &rope, 2, 90, 44),
    );
    let cfg = PatchConfig::fixed(8, DType::F32);
    let slots = slot_orbit_patches(
        &[(1, a.clone()), (2, b.clone()), (2, c.clone())],
        3,
        &canonical,
        &rope,
        &cfg,
    )
    .unwrap();
    assert!(slots[0].is_none());
    let one = orbit_patch(std::slice::from_ref(&a), &canonical, &rope, &cfg).unwrap();
    let two = orbit_patch(&[b, c], &canonical, &rope, &cfg).unwrap();
    assert_eq!(slots[1].as_ref(), Some(&one));
    assert_eq!(slots[2].as_ref(), Some(&two));
    assert!(slot_orbit_patches(&[(3, a)], 3, &canonical, &rope, &cfg).is_err());
}

/// Per-layer gains: unit gains are the plain budget; a layer with gain 0 gets no directions
/// and its bytes go elsewhere; a gained layer never gets fewer directions; the budget holds.
#[test]
fn budget_gains_weigh_layers() {
    for (name, layout, rope) in flavours(3) {
        let canonical = chunk(layout, 24, 0, 41, DType::F32);
        let cond = conditioned(&canonical, &rope, 6, 40, 42);
        let kv = canonical.kv_bytes() as f64;
        let form = |rank| {
            let cfg = PatchConfig {
                rank,
                quant: Quant::Int4,
                ..PatchConfig::fixed(0, DType::F32)
            };
            form_patch(&cond, &canonical, &rope, &cfg).unwrap()
        };
        let fraction = 0.15;
        let plain = form(RankPolicy::Budget { fraction });
        let unit = form(RankPolicy::BudgetGains {
            fraction,
            gains: vec![(1.0, 1.0); 3],
        });
        assert_eq!(plain.ranks(), unit.ranks(), "{name}");
        let muted = form(RankPolicy::BudgetGains {
            fraction,
            gains: vec![(0.0, 0.0), (1.0, 1.0), (1.0, 1.0)],
        });
        let boosted = form(RankPolicy::BudgetGains {
            fraction,
            gains: vec![(1.0, 1.0), (1.0, 1.0), (1e3, 1e3)],
        });
        let (p, m, b) = (plain.ranks(), muted.ranks(), boosted.ranks());
        assert_eq!(m[0], (0, 0), "{name}");
        assert!(
            m[1].0 + m[1].1 + m[2].0 + m[2].1 >= p[1].0 + p[1].1 + p[2].0 + p[2].1,
            "{name}"
        );
        assert!(b[2].0 + b[2].1 >= p[2].0 + p[2].1, "{name}");
        for q in [&unit, &muted, &boosted] {
            assert!(q.bytes() as f64 <= fraction * kv, "{name}");
        }
        let cfg = PatchConfig {
            rank: RankPolicy::BudgetGains {
                fraction,
                gains: vec![(1.0, 1.0); 2],
            },
            ..PatchConfig::fixed(0, DType::F32)
        };
        assert!(
            form_patch(&cond, &canonical, &rope, &cfg).is_err(),
            "{name}: wrong gain count"
        );
        let cfg = PatchConfig {
            rank: RankPolicy::BudgetGains {
                fraction,
                gains: vec![(1.0, f64::NAN); 3],
            },
            ..cfg
        };
        assert!(form_patch(&cond, &canonical, &rope, &cfg).is_err(), "{name}: NaN gain");
    }
}

#[test]
fn the_zero_patch_places_by_relocation_alone() {
    for (name, layout, rope) in flavours(2) {
        let canonical = prefilled(layout, &rope, 7, 0, 11);
        let zero = Patch::zero(layout, 7);
        assert_eq!(zero.ranks(), vec![(0, 0); 2], "{name}");
        let placed = kamera_ops::reuse(&canonical, Some(&zero), &rope, 300).unwrap();
        let moved = kamera_ops::relocate(&canonical, &rope, 300).unwrap();
        assert_eq!(chunk_diff(&placed, &moved), 0.0, "{name}: a rank-0 patch adds nothing");
    }
}
