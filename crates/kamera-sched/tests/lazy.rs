//! Lazy execution ([`Window::materialize`]): plans held until a model read are run then, or
//! replaced by the window built afresh where that costs less before the first token. Under any
//! sequence of operations and reads the executor's KV ends in the window's layout and every
//! step it is given can run (a chunk whose keeping was dropped is prefilled, never placed from a
//! record that is not there); pages that leave before a read cost no prefill.

mod common;

use common::{Synth, exact, executor, max_diff, model, prefilled_in_place, resident_and_in_place};
use kamera_sched::{CostModel, Executor, Plan, SlotState, Window, WindowConfig};
use kamera_store::{ChunkId, ChunkStore, MemStore};
use proptest::prelude::*;

fn window(budget: usize, cost: CostModel) -> Window {
    let mut cfg = WindowConfig::new(budget, model());
    cfg.cost = cost;
    Window::new(cfg)
}

/// Runs `pending` or its rebuild on `ex`; returns whether it was rebuilt.
fn read(w: &mut Window, built: &mut Window, pending: &mut Vec<Plan>, ex: &mut Executor<Synth, MemStore>) -> bool {
    let held = std::mem::take(pending);
    let m = {
        let enc = ex.encoder();
        let store = ex.store();
        w.materialize(
            built,
            held,
            ex.queued().is_empty(),
            &|id| enc.chunks.get(id).map_or(0, |c| c.0),
            &|k| store.contains(k).unwrap(),
        )
    };
    for plan in &m.plans {
        ex.run_now(plan).unwrap();
    }
    *built = w.clone();
    m.rebuilt
}

#[derive(Debug, Clone)]
enum Op {
    Visit(usize),
    Evict(usize),
    Read,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0usize..12).prop_map(Op::Visit),
        1 => any::<usize>().prop_map(Op::Evict),
        2 => Just(Op::Read),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Visits (hit, recall, new) and evictions held until random reads: every read leaves the
    /// executor's KV in the window's layout, every exact slot holds the KV a prefill after the
    /// resident chunks before it gives, and nothing the executor is asked for is missing.
    #[test]
    fn held_plans_or_their_rebuild_keep_the_executor_in_the_windows_layout(
        budget in 20usize..50, blind in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let mut synth = Synth::new();
        let ids: Vec<ChunkId> = (0..12).map(|i| synth.chunk(i, 2 + (i as usize * 5) % 9)).collect();
        let sizes: Vec<usize> = (0..12).map(|i| 2 + (i * 5) % 9).collect();
        let mut ex = executor(synth);
        let cost = if blind { CostModel::default() } else { exact(CostModel::default()) };
        let mut w = window(budget, cost);
        let mut built = w.clone();
        let mut pending: Vec<Plan> = Vec::new();
        for op in ops {
            match op {
                Op::Visit(i) => {
                    let store = ex.store();
                    let (_, plan) = w.visit(ids[i], sizes[i], &|k| store.contains(k).unwrap()).unwrap();
                    pending.push(plan);
                }
                Op::Evict(i) => {
                    let placed: Vec<ChunkId> = w.slots().iter().map(|s| s.chunk).collect();
                    if placed.is_empty() { continue; }
                    pending.push(w.evict(&placed[i % placed.len()]).unwrap());
                }
                Op::Read => {
                    read(&mut w, &mut built, &mut pending, &mut ex);
                    let want: Vec<(ChunkId, i64, usize)> = w.slots().iter().map(|s| (s.chunk, s.start, s.n_tokens)).collect();
                    prop_assert_eq!(ex.layout(), want);
                    for (i, (s, (got, want))) in w.slots().iter().zip(resident_and_in_place(&w, &ex)).enumerate() {
                        if s.state == SlotState::Exact && !s.shifted {
                            prop_assert!(max_diff(&got, &want) < 1e-4, "exact slot {i} differs by {}", max_diff(&got, &want));
                        }
                    }
                }
            }
        }
    }
}

/// Six pages through a window of two, no read between them: the read prefills the two pages
/// left and nothing else, where running the held plans would have prefilled all six.
#[test]
fn pages_that_leave_before_a_read_cost_no_prefill() {
    let mut synth = Synth::new();
    let ids: Vec<ChunkId> = (0..6).map(|i| synth.chunk(i, 10)).collect();
    let mut ex = executor(synth);
    let mut w = window(20, CostModel::default());
    let mut built = w.clone();
    let mut pending: Vec<Plan> = Vec::new();
    for id in &ids {
        let (_, plan) = w.visit(*id, 10, &|_| false).unwrap();
        pending.push(plan);
    }
    // Each page, and the survivor each eviction repairs before the next page (default cost:
    // blind survivors over the KL budget).
    let held = pending.iter().map(|p| p.prefill_tokens(|_| 10)).sum::<usize>();
    assert!(held >= 60, "held plans prefill {held} tokens");
    assert!(read(&mut w, &mut built, &mut pending, &mut ex), "rebuilt");
    assert_eq!(
        ex.stats.prefill_tokens, 20,
        "only the two pages in the window are prefilled"
    );
    assert_eq!(ex.layout().iter().map(|l| l.0).collect::<Vec<_>>(), ids[4..].to_vec());
    // Page 0 never reached the store: its recall prefills it in place (after the survivor of
    // the eviction that makes room, prefilled again first).
    let (_, plan) = w.visit(ids[0], 10, &|k| ex.store().contains(k).unwrap()).unwrap();
    let prefilled = prefilled_in_place(&plan);
    assert_eq!(prefilled.last(), Some(&ids[0]), "{plan}");
    assert_eq!(prefilled.iter().filter(|c| **c == ids[0]).count(), 1, "{plan}");
    assert_eq!(plan.count("place"), 0, "{plan}");
    pending.push(plan);
    read(&mut w, &mut built, &mut pending, &mut ex);
    assert_eq!(ex.layout().len(), 2);
}

/// Pages the executor holds keep their canonical records however the read is served: evicted
/// and one recalled with no read between, the read stores both records (kept from the KV the
/// executor holds, no forward pass) and the recall's patch, so the next recall there places.
#[test]
fn a_read_keeps_what_the_executor_holds() {
    let mut synth = Synth::new();
    let (sys, a, b) = (synth.chunk(0, 4), synth.chunk(1, 8), synth.chunk(2, 8));
    let mut ex = executor(synth);
    let mut w = window(
        40,
        CostModel {
            recall_blind_kl: f64::INFINITY,
            survivor_blind_kl: f64::INFINITY,
            expected_reuses: 10.0,
            ..CostModel::default()
        },
    );
    let mut built = w.clone();
    let mut pending: Vec<Plan> = vec![w.pin(sys, 4).unwrap()];
    for id in [a, b] {
        pending.push(w.visit(id, 8, &|_| false).unwrap().1);
        read(&mut w, &mut built, &mut pending, &mut ex);
    }
    assert_eq!(ex.stats.patches_formed, 0);
    pending.push(w.evict(&b).unwrap());
    pending.push(w.evict(&a).unwrap());
    let store = ex.store();
    let (_, recall) = w.visit(b, 8, &|k| store.contains(k).unwrap()).unwrap();
    assert_eq!(recall.count("store-patch"), 1, "{recall}");
    pending.push(recall);
    read(&mut w, &mut built, &mut pending, &mut ex);
    for id in [a, b] {
        assert!(ex.store().contains(&kamera_store::Key::canonical(model(), id)).unwrap());
    }
    assert_eq!(ex.stats.patches_formed, 1, "the recall's patch");
    pending.push(w.evict(&b).unwrap());
    read(&mut w, &mut built, &mut pending, &mut ex);
    let store = ex.store();
    let (_, plan) = w.visit(b, 8, &|k| store.contains(k).unwrap()).unwrap();
    assert_eq!(plan.count("prefill"), 0, "{plan}");
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s, kamera_sched::Step::Place { patch: Some(_), .. })),
        "{plan}"
    );
}
