//! Background steps on the synthetic encoder. The repair of survivors of an eviction
//! ([`Window::repair`]): after it runs, each survivor holds the KV a prefill in place gives, and
//! the patch stored for its new context takes its canonical record to that KV (not to the blind
//! KV it had when the repair was planned), so a later placement there is exact. A worker stopped
//! early leaves only patches formed from snapshots queued, and a placement forms the one it needs.

mod common;

use common::{Synth, executor, max_diff, model, resident_and_in_place};
use kamera_ops::DType;
use kamera_sched::{CostModel, Encoder, Window, WindowConfig};
use kamera_store::{ChunkId, ChunkStore, Key};

#[test]
fn repaired_survivors_are_exact_and_their_patches_restore_them() {
    let mut synth = Synth::new();
    let ids: Vec<ChunkId> = (0..5).map(|i| synth.chunk(i, 6)).collect();
    let mut ex = executor(synth);
    let mut wcfg = WindowConfig::new(24, model());
    // Blind survivors are predicted over the KL budget: they are repaired.
    wcfg.cost = CostModel {
        survivor_blind_kl: 1.0,
        kl_budget: 0.01,
        ..CostModel::default()
    };
    let mut w = Window::new(wcfg);
    for id in &ids[..4] {
        ex.run_now(&w.insert(*id, 6).unwrap()).unwrap();
    }
    // The fifth frees half the window (survivors get repaired): the first two leave, the third
    // and fourth survive, shifted left, and are prefilled again in place before the fifth.
    let plan = w.insert(ids[4], 6).unwrap();
    assert!(w.slot(&ids[1]).is_none());
    assert!(!w.slot(&ids[2]).unwrap().shifted);
    assert_eq!(plan.count("store-patch"), 2, "{plan}");
    ex.run(&plan).unwrap();
    ex.settle().unwrap();
    let survivors = [ids[2], ids[3]];
    for (s, (got, want)) in w.slots().iter().zip(resident_and_in_place(&w, &ex)) {
        assert!(
            max_diff(&got, &want) < 1e-4,
            "survivor at {} differs by {}",
            s.start,
            max_diff(&got, &want)
        );
        if !survivors.contains(&s.chunk) {
            continue;
        }
        // Its stored patch takes the canonical record to this KV.
        let key = w.patch_key(&s.chunk).unwrap();
        let patch = ex.store().lookup(&key).unwrap().expect("the repair stored a patch");
        let canon = ex
            .store()
            .lookup(&Key::canonical(model(), s.chunk))
            .unwrap()
            .expect("a canonical record");
        let mut enc = Synth::new();
        let placed = enc
            .reuse(canon.as_kv().unwrap(), patch.as_patch(), s.start, DType::F32)
            .unwrap();
        let blind = enc.reuse(canon.as_kv().unwrap(), None, s.start, DType::F32).unwrap();
        let (err, gap) = (max_diff(&placed, &got), max_diff(&blind, &got));
        // (Nothing precedes the first: there blind is exact already.)
        assert!(
            err < 1e-3 && (gap < 1e-6 || err < gap / 10.0),
            "patched error {err}, blind {gap}"
        );
    }
}

/// A worker stopped early ([`Executor::settle_until`]) leaves a patch formed from a snapshot
/// queued; the next recall that needs it forms it first, and the recalled KV is the
/// conditioned one.
#[test]
fn a_patch_left_queued_is_formed_when_a_placement_needs_it() {
    let mut synth = Synth::new();
    let (a, b, c) = (synth.chunk(1, 5), synth.chunk(2, 6), synth.chunk(3, 7));
    let mut ex = executor(synth);
    let mut wcfg = WindowConfig::new(100, model());
    wcfg.cost = common::exact(CostModel {
        expected_reuses: 10.0,
        revisit_rate: 0.0,
        ..CostModel::default()
    });
    let mut w = Window::new(wcfg);
    for (id, n) in [(a, 5), (b, 6), (c, 7)] {
        ex.run_now(&w.insert(id, n).unwrap()).unwrap();
    }
    let exact = ex.window_kv().unwrap().unwrap();
    ex.run_now(&w.evict(&c).unwrap()).unwrap();
    let first = w.recall(c).unwrap();
    assert_eq!(first.count("store-patch"), 1, "{first}");
    ex.run(&first).unwrap();
    // Stopped at once: the SVD waits (it reads a snapshot), nothing else was queued.
    ex.settle_until(&|| true).unwrap();
    assert_eq!(ex.queued().len(), 1);
    assert!(ex.queue_may_wait());
    assert_eq!(ex.stats.patches_formed, 0);
    // The next recall after the same context is a placement with that patch: formed first.
    ex.run(&w.evict(&c).unwrap()).unwrap();
    let again = w.recall(c).unwrap();
    assert_eq!(again.count("prefill"), 0, "{again}");
    ex.run(&again).unwrap();
    assert!(ex.queued().is_empty(), "the placement ran the queued patch");
    assert_eq!(ex.stats.patches_formed, 1);
    let err = max_diff(&ex.window_kv().unwrap().unwrap(), &exact);
    assert!(err < 1e-4, "recalled KV differs by {err}");
}
