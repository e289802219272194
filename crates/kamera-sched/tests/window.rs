//! The window and its plans, executed by the reference executor on a synthetic model: budget and
//! contiguity under random operations, the exact path equals a full prefill, recall with a
//! patch restores the conditioned KV, orbit patches are formed once per set, survivors of a
//! slide are only re-rotated, and the cost model explains itself.

mod common;

use common::{Synth, exact, executor, max_diff, model};
use kamera_ops::{DType, PatchConfig};
use kamera_sched::{Choice, CostModel, Error, Executor, Order, Step, Window, WindowConfig};
use kamera_store::{ChunkId, MemStore};
use proptest::prelude::*;

fn window(budget: usize, reuses: f64) -> Window {
    let mut cfg = WindowConfig::new(budget, model());
    cfg.cost = exact(CostModel {
        expected_reuses: reuses,
        ..CostModel::default()
    });
    Window::new(cfg)
}

fn check_invariants(w: &Window, ex: &Executor<Synth, MemStore>) -> Result<(), TestCaseError> {
    prop_assert!(w.used() <= w.config().budget_tokens, "used {} > budget", w.used());
    let mut pos = 0;
    let mut seen_placed = false;
    for s in w.slots() {
        prop_assert_eq!(s.start, pos, "positions not contiguous");
        pos = s.end();
        prop_assert!(!(s.pinned && seen_placed), "pinned after placed");
        seen_placed |= !s.pinned;
    }
    let want: Vec<(ChunkId, i64, usize)> = w.slots().iter().map(|s| (s.chunk, s.start, s.n_tokens)).collect();
    prop_assert_eq!(ex.layout(), want, "executor KV layout differs from the window");
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Insert,
    Evict(usize),
    Slide(usize),
    Reorder(u8),
    Permute(u64),
    Recall(usize),
    Touch(usize),
    Relevance(usize, u8),
    Tail(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Insert),
        1 => any::<usize>().prop_map(Op::Evict),
        1 => (0usize..20).prop_map(Op::Slide),
        1 => (0u8..3).prop_map(Op::Reorder),
        1 => any::<u64>().prop_map(Op::Permute),
        2 => any::<usize>().prop_map(Op::Recall),
        1 => any::<usize>().prop_map(Op::Touch),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, s)| Op::Relevance(i, s)),
        1 => (0usize..8).prop_map(Op::Tail),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Under any sequence of operations the window stays within budget and contiguous, a failed
    /// operation changes nothing, and executing the plans keeps the runner's KV in the layout
    /// the window describes.
    #[test]
    fn budget_contiguity_and_plans_agree(
        budget in 20usize..60, pin in 0usize..6, reuses in prop_oneof![Just(0.0), Just(10.0)],
        ops in proptest::collection::vec(op(), 1..30),
    ) {
        let mut synth = Synth::new();
        let ids: Vec<ChunkId> = (0..40).map(|i| synth.chunk(i, 1 + (i as usize * 7) % 11)).collect();
        let sizes: Vec<usize> = (0..40).map(|i| 1 + (i * 7) % 11).collect();
        let mut ex = executor(synth);
        let mut w = window(budget, reuses);
        if pin > 0 {
            let sys = ex.encoder_mut().chunk(1000, pin);
            let plan = w.pin(sys, pin).unwrap();
            ex.run_now(&plan).unwrap();
        }
        let mut next = 0;
        for op in ops {
            let before = w.slots().to_vec();
            let placed: Vec<ChunkId> = w.slots().iter().filter(|s| !s.pinned).map(|s| s.chunk).collect();
            let evicted = w.evicted();
            let r = match op {
                Op::Insert if next >= ids.len() => continue,
                Op::Insert => { next += 1; w.insert(ids[next - 1], sizes[next - 1]) }
                Op::Evict(_) if placed.is_empty() => continue,
                Op::Evict(i) => w.evict(&placed[i % placed.len()]),
                Op::Slide(n) => w.slide(n),
                Op::Reorder(o) => w.reorder([Order::Arrival, Order::Recency, Order::Relevance][o as usize]),
                Op::Permute(seed) => {
                    let mut p = placed.clone();
                    let n = p.len().max(1);
                    p.rotate_left(seed as usize % n);
                    if seed % 2 == 1 { p.reverse(); }
                    w.reorder_to(&p)
                }
                Op::Recall(_) if evicted.is_empty() => continue,
                Op::Recall(i) => w.recall(evicted[i % evicted.len()]),
                Op::Touch(_) if placed.is_empty() => continue,
                Op::Touch(i) => { w.touch(&placed[i % placed.len()]); continue }
                Op::Relevance(..) if placed.is_empty() => continue,
                Op::Relevance(i, s) => { w.set_relevance(&placed[i % placed.len()], s as f64); continue }
                Op::Tail(n) => match w.set_tail(n) { Ok(()) => continue, Err(e) => Err(e) },
            };
            match r {
                Ok(plan) => { ex.run_now(&plan).unwrap(); }
                Err(Error::OverBudget { .. }) => prop_assert_eq!(w.slots(), &before[..], "a refused operation changed the window"),
                Err(e) => panic!("unexpected error: {e}"),
            }
            check_invariants(&w, &ex)?;
        }
    }

    /// Slot-conditioned orbit patches: one formation serves every later order of the same set
    /// with no model call; each chunk is placed with the patch of its slot in the set (none at
    /// the first slot when nothing precedes the set), and every key has orderings to average.
    #[test]
    fn slot_orbit_patches_serve_every_order_of_their_set(
        n in 2usize..6,
        pin in 0usize..3,
        perms in proptest::collection::vec(any::<u64>(), 1..6),
    ) {
        let mut synth = Synth::new();
        let ids: Vec<ChunkId> = (0..n).map(|i| synth.chunk(i as u64, 2 + i)).collect();
        let mut ex = executor(synth);
        let mut w = window(500, 1000.0);
        if pin > 0 {
            let sys = ex.encoder_mut().chunk(1000, pin);
            ex.run_now(&w.pin(sys, pin).unwrap()).unwrap();
        }
        for (i, id) in ids.iter().enumerate() {
            ex.run_now(&w.insert(*id, 2 + i).unwrap()).unwrap();
        }
        let mut set = ids.clone();
        set.sort();
        let mut formed = false;
        for seed in perms {
            let mut order = ids.clone();
            let mut x = seed;
            for i in (1..n).rev() {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                order.swap(i, (x >> 33) as usize % (i + 1));
            }
            let calls = ex.encoder().calls;
            let plan = w.reorder_to(&order).unwrap();
            for step in &plan.steps {
                if let Step::FormOrbit { keys, orderings, .. } = step {
                    prop_assert!(!formed, "formed twice: {plan}");
                    formed = true;
                    prop_assert_eq!(keys.len(), n * (n - usize::from(pin == 0)));
                    for k in keys {
                        prop_assert!(orderings.iter().any(|o| k.covers(o)), "{k:?} has no ordering");
                    }
                }
            }
            ex.run_now(&plan).unwrap();
            if formed && plan.count("form-orbit") == 0 {
                prop_assert_eq!(ex.encoder().calls, calls, "a cached reorder ran the model");
            }
            let placed: Vec<&kamera_sched::Slot> = w.slots().iter().filter(|s| !s.pinned).collect();
            prop_assert_eq!(placed.iter().map(|s| s.chunk).collect::<Vec<_>>(), order.clone());
            if !formed {
                continue;
            }
            for (slot, s) in placed.iter().enumerate() {
                let want = if slot == 0 && pin == 0 {
                    kamera_sched::SlotState::Relocated
                } else {
                    kamera_sched::SlotState::Patched(kamera_store::Key::orbit_slot(model(), s.chunk, &set, slot))
                };
                // Chunks of an unchanged prefix keep what they had.
                if s.state != kamera_sched::SlotState::Exact {
                    prop_assert_eq!(s.state, want);
                }
            }
        }
    }

    /// The cost model's patch is the most gap recovered within the byte budget (else the
    /// smallest), and slot orbit patches are chosen exactly when they recover more and fit.
    #[test]
    fn the_cost_model_picks_the_best_patch_within_its_budgets(
        points in proptest::collection::vec((0.0f64..1.0, 0.01f64..0.5), 1..8),
        budget in 0.0f64..0.4,
        orbit_budget in 0.0f64..1.5,
        n in 1usize..8,
        after in any::<bool>(),
        shares in (0.0f64..1.0, 0.0f64..1.0),
    ) {
        let c = CostModel {
            patch_points: points
                .iter()
                .enumerate()
                .map(|(i, &(gap, bytes))| kamera_sched::PatchPoint {
                    label: format!("p{i}"),
                    config: PatchConfig::fixed(i + 1, DType::Bf16),
                    gap,
                    bytes,
                    coded: None,
                    form_us_per_token: 0.0,
                })
                .collect(),
            patch_bytes_budget: budget,
            orbit_bytes_budget: orbit_budget,
            orbit_mean_share: shares.0,
            orbit_slot_share: shares.1,
            ..CostModel::default()
        };
        let p = c.patch_point().unwrap();
        prop_assert_eq!(c.patch_config(), p.config.clone());
        let fitting: Vec<_> = c.patch_points.iter().filter(|q| q.bytes <= budget).collect();
        if fitting.is_empty() {
            prop_assert!(c.patch_points.iter().all(|q| q.bytes >= p.bytes));
        } else {
            prop_assert!(p.bytes <= budget);
            prop_assert!(fitting.iter().all(|q| q.gap <= p.gap));
        }
        let (variant, per_chunk) = c.orbit_variant(n, after);
        let slots = if after { n } else { n - 1 };
        let slot = shares.1 > shares.0 && slots as f64 * p.bytes <= orbit_budget;
        prop_assert_eq!(variant, if slot { kamera_sched::OrbitVariant::Slot } else { kamera_sched::OrbitVariant::Mean });
        prop_assert_eq!(per_chunk, if slot { slots } else { 1 });
        let least = if slot { n } else { 1 };
        prop_assert!(c.orderings_for(n, variant) >= least);
    }

    /// On the exact path (every chunk placed where and after what it was prefilled) the
    /// executed window KV equals a full prefill of the same sequence.
    #[test]
    fn exact_path_equals_full_prefill(sizes in proptest::collection::vec(1usize..9, 1..8), pin in 0usize..5) {
        let mut synth = Synth::new();
        let sys = synth.chunk(999, pin.max(1));
        let ids: Vec<ChunkId> = sizes.iter().enumerate().map(|(i, n)| synth.chunk(i as u64, *n)).collect();
        let mut ex = executor(synth);
        let mut w = window(1000, 4.0);
        let mut seq = Vec::new();
        if pin > 0 {
            ex.run_now(&w.pin(sys, pin.max(1)).unwrap()).unwrap();
            seq.push(sys);
        }
        for (id, n) in ids.iter().zip(&sizes) {
            ex.run_now(&w.insert(*id, *n).unwrap()).unwrap();
            seq.push(*id);
        }
        let got = ex.window_kv().unwrap().unwrap();
        let want = ex.encoder().full(&seq);
        prop_assert!(max_diff(&got, &want) == 0.0, "exact path differs by {}", max_diff(&got, &want));
    }
}

#[test]
fn recall_forms_a_patch_once_and_restores_the_conditioned_kv() {
    // revisit_rate 0: the insert keeps no difference patch, so the first recall forms one; at
    // the default rate the insert keeps it and already the first recall is served from it.
    for revisit_rate in [0.0, 0.5] {
        let mut synth = Synth::new();
        let (a, b, c) = (synth.chunk(1, 5), synth.chunk(2, 6), synth.chunk(3, 7));
        let mut ex = executor(synth);
        let mut w = window(100, 10.0);
        w.cost_model_mut().revisit_rate = revisit_rate;
        for (id, n) in [(a, 5), (b, 6), (c, 7)] {
            ex.run_now(&w.insert(id, n).unwrap()).unwrap();
        }
        let exact = ex.window_kv().unwrap().unwrap();
        for round in 0..2 {
            ex.run_now(&w.evict(&c).unwrap()).unwrap();
            let plan = w.recall(c).unwrap();
            let want = if round == 0 && revisit_rate == 0.0 {
                Choice::FormPatch
            } else {
                Choice::CachedPatch
            };
            assert_eq!(
                plan.decisions[0].choice, want,
                "rate {revisit_rate} round {round}:\n{plan}"
            );
            assert_eq!(plan.count("store-patch"), usize::from(want == Choice::FormPatch));
            assert_eq!(
                plan.count("prefill"),
                usize::from(want == Choice::FormPatch),
                "a recall runs at most its one conditioned pass"
            );
            ex.run_now(&plan).unwrap();
            let got = ex.window_kv().unwrap().unwrap();
            let err = max_diff(&got, &exact);
            assert!(
                err < 1e-4,
                "rate {revisit_rate} round {round}: recalled KV differs by {err}"
            );
        }
        // Once: formed on the first recall, or kept at insert (b and c; a has no antecedent).
        let formed = if revisit_rate == 0.0 { 1 } else { 2 };
        assert_eq!(ex.stats.patches_formed, formed, "rate {revisit_rate}");
    }
    let mut synth = Synth::new();
    let (a, b, c) = (synth.chunk(1, 5), synth.chunk(2, 6), synth.chunk(3, 7));
    let ex = executor(synth);
    // Blind reuse (no patch) is measurably worse: the deficit is real.
    let canon = ex.encoder().kv(c, 0, None);
    let blind = kamera_ops::relocate(&canon, &ex.encoder().rope, 11).unwrap();
    let exact_c = ex.encoder().kv(
        c,
        11,
        Some(&common::concat(
            &ex.encoder().kv(a, 0, None),
            &ex.encoder().kv(b, 5, Some(&ex.encoder().kv(a, 0, None))),
            &ex.encoder().rope,
        )),
    );
    assert!(max_diff(&blind, &exact_c) > 1e-2);
}

/// Chunks a (5 tokens), b (6), c (7) inserted in that order into a window whose cost model
/// expects no patch to be reused, and the executor holding them.
fn three_chunks_no_reuse() -> (Executor<Synth, MemStore>, Window, [ChunkId; 3]) {
    let mut synth = Synth::new();
    let (a, b, c) = (synth.chunk(1, 5), synth.chunk(2, 6), synth.chunk(3, 7));
    let mut ex = executor(synth);
    let mut w = window(100, 0.0);
    for (id, n) in [(a, 5), (b, 6), (c, 7)] {
        ex.run_now(&w.insert(id, n).unwrap()).unwrap();
    }
    (ex, w, [a, b, c])
}

#[test]
fn recall_after_a_changed_context_gets_a_new_patch_and_reprefills_when_not_worth_it() {
    let (mut ex, mut w, [a, b, c]) = three_chunks_no_reuse();
    ex.run_now(&w.evict(&b).unwrap()).unwrap();
    let plan = w.recall(b).unwrap();
    assert_eq!(plan.decisions[0].choice, Choice::Reprefill, "{plan}");
    assert!(plan.steps.contains(&Step::Prefill {
        chunk: b,
        at: 12,
        alone: false
    }));
    ex.run_now(&plan).unwrap();
    let got = ex.window_kv().unwrap().unwrap();
    let want = ex.encoder().full(&[a, c, b]);
    // a is untouched; c was prefilled after [a, b] and only re-rotated when b left; b is
    // prefilled in place after exactly what the window now holds.
    let rows = |kv: &kamera_ops::ChunkKv, r: std::ops::Range<usize>| {
        kv.layers()[1].k.to_f32_vec()[r.start * 16..r.end * 16].to_vec()
    };
    assert_eq!(rows(&got, 0..5), rows(&want, 0..5));
    assert_eq!(
        w.slot(&b).map(|s| (s.start, s.state)),
        Some((12, kamera_sched::SlotState::Exact))
    );
}

/// A recall context that has occurred before is evidence it recurs: with a prior of no reuse,
/// the first recall into [a, c] prefills in place, the second (the same context again) forms
/// the patch, the third is served from it.
#[test]
fn a_recurring_recall_context_gets_its_patch() {
    let (mut ex, mut w, [a, b, c]) = three_chunks_no_reuse();
    for want in [Choice::Reprefill, Choice::FormPatch, Choice::CachedPatch] {
        ex.run_now(&w.evict(&b).unwrap()).unwrap();
        let plan = w.recall(b).unwrap();
        assert_eq!(plan.decisions[0].choice, want, "{plan}");
        ex.run_now(&plan).unwrap();
        let got = ex.window_kv().unwrap().unwrap();
        let err = max_diff(&got, &ex.encoder().full(&[a, c, b]));
        assert!(err < 1e-4, "{want:?}: the recalled window differs by {err}");
    }
    assert_eq!(ex.stats.patches_formed, 1);
}

#[test]
fn orbit_patches_are_formed_once_per_set_and_serve_other_orders() {
    let mut synth = Synth::new();
    let sys = synth.chunk(100, 3);
    let ids: Vec<ChunkId> = (0..4).map(|i| synth.chunk(i, 4 + i as usize)).collect();
    let mut ex = executor(synth);
    let mut w = window(200, 50.0);
    ex.run_now(&w.pin(sys, 3).unwrap()).unwrap();
    for (i, id) in ids.iter().enumerate() {
        ex.run_now(&w.insert(*id, 4 + i).unwrap()).unwrap();
    }
    let order1 = vec![ids[2], ids[0], ids[3], ids[1]];
    let plan = w.reorder_to(&order1).unwrap();
    assert_eq!(plan.count("form-orbit"), 1, "{plan}");
    assert_eq!(plan.count("place"), 4);
    ex.run_now(&plan).unwrap();
    // Slot-conditioned by default: one patch per chunk and slot (the pinned prefix precedes
    // the set, so its first slot has one too).
    assert_eq!(ex.stats.orbit_patches_formed, 16);
    let calls = ex.encoder().calls;
    let order2 = vec![ids[1], ids[3], ids[0], ids[2]];
    let plan = w.reorder_to(&order2).unwrap();
    assert_eq!(plan.decisions[0].choice, Choice::CachedPatch, "{plan}");
    assert_eq!(plan.count("form-orbit") + plan.count("prefill"), 0);
    ex.run_now(&plan).unwrap();
    assert_eq!(ex.encoder().calls, calls, "a cached reorder runs no model");
    let got: Vec<ChunkId> = w.slots().iter().skip(1).map(|s| s.chunk).collect();
    assert_eq!(got, order2);
    // Reorder by relevance: the most relevant chunk lands next to the tail.
    w.set_relevance(&ids[0], 9.0);
    let plan = w.reorder(Order::Relevance).unwrap();
    ex.run_now(&plan).unwrap();
    assert_eq!(w.slots().last().map(|s| s.chunk), Some(ids[0]));
    // The orbit patch approximates every order's conditioned KV better than no patch.
    let got = ex.window_kv().unwrap().unwrap();
    let seq: Vec<ChunkId> = w.slots().iter().map(|s| s.chunk).collect();
    let full = ex.encoder().full(&seq);
    let e = ex.encoder();
    let mut blind = e.kv(seq[0], 0, None);
    for id in &seq[1..] {
        let moved = kamera_ops::relocate(&e.kv(*id, 0, None), &e.rope, blind.n_tokens() as i64).unwrap();
        blind = common::concat(&blind, &moved, &e.rope);
    }
    let (e_orbit, e_blind) = (max_diff(&got, &full), max_diff(&blind, &full));
    eprintln!("orbit-patched max |err| {e_orbit:.3e}, blind {e_blind:.3e}");
    assert!(e_orbit < e_blind, "orbit {e_orbit} not better than blind {e_blind}");
}

/// The same reorders with the plain orbit mean (no room for slot patches) and with slot
/// patches: the slot-conditioned window is closer to the full prefill of each order.
#[test]
fn slot_orbit_patches_beat_the_mean() {
    let run = |orbit_bytes_budget: f64| {
        let mut synth = Synth::new();
        let sys = synth.chunk(100, 3);
        let ids: Vec<ChunkId> = (0..3).map(|i| synth.chunk(i, 5)).collect();
        let mut ex = executor(synth);
        let mut w = window(200, 50.0);
        w.cost_model_mut().orbit_bytes_budget = orbit_bytes_budget;
        ex.run_now(&w.pin(sys, 3).unwrap()).unwrap();
        for id in &ids {
            ex.run_now(&w.insert(*id, 5).unwrap()).unwrap();
        }
        let mut err = 0.0f32;
        for order in [[2, 0, 1], [1, 2, 0], [0, 2, 1]] {
            let order: Vec<ChunkId> = order.iter().map(|&i| ids[i]).collect();
            ex.run_now(&w.reorder_to(&order).unwrap()).unwrap();
            let seq: Vec<ChunkId> = w.slots().iter().map(|s| s.chunk).collect();
            let got = ex.window_kv().unwrap().unwrap();
            err = err.max(max_diff(&got, &ex.encoder().full(&seq)));
        }
        (err, ex.stats.orbit_patches_formed)
    };
    let ((slot, n_slot), (mean, n_mean)) = (run(0.5), run(0.0));
    eprintln!("max |err| over three orders: slot {slot:.3e}, mean {mean:.3e}");
    assert_eq!((n_slot, n_mean), (9, 3));
    assert!(slot < mean, "slot {slot} vs mean {mean}");
}

#[test]
fn slide_survivors_are_only_re_rotated() {
    let mut synth = Synth::new();
    let ids: Vec<ChunkId> = (0..5).map(|i| synth.chunk(i, 6)).collect();
    let mut ex = executor(synth);
    let mut w = window(30, 4.0);
    for id in &ids {
        ex.run_now(&w.insert(*id, 6).unwrap()).unwrap();
    }
    let before = ex.window_kv().unwrap().unwrap();
    let plan = w.slide(12).unwrap();
    assert_eq!(plan.count("evict"), 2);
    assert_eq!(plan.count("relocate"), 3);
    // The first chunk (at 0, no canonical KV formed there) is kept as it leaves.
    assert_eq!(plan.steps.len(), 5 + plan.count("keep"), "{plan}");
    assert_eq!(plan.count("keep"), 1, "{plan}");
    assert!(
        plan.steps
            .iter()
            .all(|s| !matches!(s, Step::Relocate { delta, .. } if *delta != -12))
    );
    ex.run_now(&plan).unwrap();
    let after = ex.window_kv().unwrap().unwrap();
    // Survivors = the old rows 12..30 re-rotated by -12.
    let old_tail = kamera_ops::ChunkKv::new(
        before.layout().to_owned(),
        12,
        before
            .layers()
            .iter()
            .map(|l| kamera_ops::LayerKv {
                k: kamera_ops::Mat::from_f32(18, 16, l.k.to_f32_vec()[12 * 16..].to_vec()).unwrap(),
                v: kamera_ops::Mat::from_f32(18, 16, l.v.to_f32_vec()[12 * 16..].to_vec()).unwrap(),
            })
            .collect(),
    )
    .unwrap();
    let shifted = kamera_ops::relocate(&old_tail, &ex.encoder().rope, 0).unwrap();
    assert!(
        max_diff(&after, &shifted) < 1e-5,
        "survivors differ from a pure re-rotation"
    );
    assert_eq!(after.n_tokens(), 18);
    assert!(w.used() + 12 <= 30);
    assert!(w.slide(31).is_err());
}

#[test]
fn cost_model_explains_each_choice() {
    let c = exact(CostModel::default());
    let id = ChunkId::of(b"x", "t", model());
    assert_eq!(c.recall(id, 100, 0, false, c.expected_reuses).choice, Choice::Relocate);
    assert_eq!(
        c.recall(id, 100, 500, true, c.expected_reuses).choice,
        Choice::CachedPatch
    );
    let form = c.recall(id, 100, 500, false, c.expected_reuses);
    assert_eq!(form.choice, Choice::FormPatch);
    assert!(form.to_string().contains("saves"), "{form}");
    let never = exact(CostModel {
        expected_reuses: 0.0,
        ..CostModel::default()
    });
    assert_eq!(
        never.recall(id, 100, 500, false, never.expected_reuses).choice,
        Choice::Reprefill
    );
    assert!(c.recall(id, 100, 500, true, c.expected_reuses).chosen_cost() < c.prefill(100, 500) / 10.0);
    let v = c.orbit_variant(3, true);
    assert_eq!(c.reorder(300, 3, 10, true, v).choice, Choice::CachedPatch);
    assert_eq!(never.reorder(300, 3, 10, false, v).choice, Choice::Reprefill);
    // By default: slot orbit patches and the best measured patch within a tenth of the KV bytes.
    assert_eq!(v.0, kamera_sched::OrbitVariant::Slot);
    let p = c.patch_point().unwrap();
    assert!(p.bytes <= c.patch_bytes_budget, "{p:?}");
    assert_eq!((p.label.as_str(), p.config.refit), ("kamera-budget:0.095/q4/rf", true));
    assert!(
        c.reorder(300, 3, 10, false, v)
            .to_string()
            .contains("Slot orbit patches")
    );
}

#[test]
fn bad_requests_are_errors() {
    let mut synth = Synth::new();
    let a = synth.chunk(1, 5);
    let mut w = window(10, 1.0);
    assert!(matches!(w.insert(a, 11), Err(Error::OverBudget { .. })));
    w.insert(a, 5).unwrap();
    assert!(w.insert(a, 5).is_err());
    assert!(w.recall(a).is_err());
    assert!(w.pin(ChunkId::of(b"s", "t", model()), 1).is_err());
    assert!(w.evict(&ChunkId::of(b"zz", "t", model())).is_err());
    assert!(w.reorder_to(&[]).is_err());
}

#[test]
fn image_chunks_occupy_their_span_and_count_their_tokens() {
    let id = |s: &str| ChunkId::of(s.as_bytes(), "t", model());
    let (a, img, b) = (id("text a"), id("image"), id("text b"));
    let mut w = window(100, 4.0);
    w.declare_span(img, 4).unwrap();
    w.insert(a, 10).unwrap();
    w.insert(img, 12).unwrap();
    w.insert(b, 5).unwrap();
    let starts: Vec<i64> = w.slots().iter().map(|s| s.start).collect();
    assert_eq!(
        starts,
        vec![0, 10, 14],
        "text after the image resumes at its start + span"
    );
    assert_eq!((w.end(), w.used()), (19, 27), "positions by span, budget by tokens");
    let plan = w.evict(&a).unwrap();
    assert!(
        plan.steps.contains(&Step::Relocate { chunk: img, delta: -10 }),
        "{plan}"
    );
    assert!(plan.steps.contains(&Step::Relocate { chunk: b, delta: -10 }), "{plan}");
    assert_eq!(w.slot(&b).map(|s| s.start), Some(4));
    let plan = w.recall(a).unwrap();
    assert_eq!(w.slot(&a).map(|s| (s.start, s.end())), Some((9, 19)), "{plan}");
    // A span is part of the chunk: it cannot change, nor be declared after the chunk entered.
    assert!(w.declare_span(img, 5).is_err());
    assert!(w.declare_span(img, 4).is_ok());
    assert_eq!((w.declared_span(&img), w.declared_span(&a)), (Some(4), None));
    assert!(w.declare_span(a, 3).is_err());
    assert!(w.declare_span(id("new"), 0).is_err());
}
