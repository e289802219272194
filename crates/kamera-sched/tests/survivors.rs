//! Survivors of an eviction (`CostModel::survivors`, `Window::repair`, `Window::make_room`):
//! their predicted KL scales with the window, a repair keeps patches only where the window's
//! record of reuse pays for the SVDs, and where survivors get repaired an eviction frees half
//! the window at once, so one repair serves several new chunks.

mod common;

use common::{Synth, executor, model, prefilled_in_place};
use kamera_sched::{Choice, CostModel, Step, Window, WindowConfig};

/// A blind KL measured at window 512 is predicted twice as large at 1024 (twice the stale KV a
/// read crosses) and half as large at 256; unscaled where no window was recorded.
#[test]
fn survivors_blind_kl_scales_with_the_window_it_was_measured_at() {
    let cost = CostModel {
        survivor_blind_kl: 6e-3,
        read_blind_kl: 6e-3,
        blind_kl_window: 512,
        kl_budget: 0.01,
        ..CostModel::default()
    };
    assert_eq!(cost.survivor_kl(512), 6e-3);
    assert!((cost.survivor_kl(1024) - 1.2e-2).abs() < 1e-12);
    assert!((cost.read_kl(256) - 3e-3).abs() < 1e-12);
    assert_eq!(cost.survivors(300, 200, 512, 4.0).choice, Choice::Blind);
    assert!(!cost.repairs_survivors(512) && cost.repairs_survivors(1024));
    assert_eq!(cost.survivors(300, 200, 1024, 4.0).choice, Choice::PrefillKeepPatch);
    assert_eq!(cost.read(100, 300, 512, 4.0).choice, Choice::Blind);
    assert_ne!(cost.read(100, 300, 1024, 4.0).choice, Choice::Blind);
    let unscaled = CostModel {
        blind_kl_window: 0,
        ..cost.clone()
    };
    assert_eq!(unscaled.survivor_kl(4096), 6e-3);
    // No expected reuse: the repair runs, its patches are not kept (their SVDs would not pay).
    let d = cost.survivors(300, 200, 1024, 0.0);
    assert_eq!(d.choice, Choice::Reprefill, "{}", d.reason);
}

fn window(survivor_blind_kl: f64, expected_reuses: f64) -> Window {
    let mut cfg = WindowConfig::new(100, model());
    cfg.cost = CostModel {
        recall_blind_kl: 0.0,
        survivor_blind_kl,
        expected_reuses,
        ..CostModel::default()
    };
    Window::new(cfg)
}

fn evicted(plan: &kamera_sched::Plan) -> usize {
    plan.steps
        .iter()
        .filter(|s| matches!(s, Step::EvictToStore { .. }))
        .count()
}

/// Five chunks of 18 tokens fill 90 of 100; a sixth needs room. With blind survivors one chunk
/// leaves; with repaired survivors chunks leave until half the window is free (three), so the
/// next two chunks fit without another eviction and another repair.
#[test]
fn where_survivors_are_repaired_an_eviction_frees_half_the_window() {
    for (blind_kl, want) in [(0.0, 1), (1.0, 3)] {
        let mut synth = Synth::new();
        let ids: Vec<_> = (0..8).map(|i| synth.chunk(i, 18)).collect();
        let mut w = window(blind_kl, 4.0);
        for id in &ids[..5] {
            w.insert(*id, 18).unwrap();
        }
        let plan = w.insert(ids[5], 18).unwrap();
        assert_eq!(evicted(&plan), want, "survivor KL {blind_kl}: {plan}");
        if blind_kl > 0.0 {
            for id in &ids[6..8] {
                let p = w.insert(*id, 18).unwrap();
                assert_eq!(evicted(&p), 0, "after freeing half, {id} fits: {p}");
            }
        }
    }
}

/// The repair of repaired survivors, run by the reference executor: every survivor is
/// prefilled again in place before the new chunk (which is then prefilled once, after them),
/// and its patch kept only where reuse is expected.
#[test]
fn a_repair_keeps_patches_only_where_reuse_is_expected() {
    for (reuses, patches) in [(4.0, true), (0.0, false)] {
        let mut synth = Synth::new();
        let ids: Vec<_> = (0..6).map(|i| synth.chunk(i + 10, 18)).collect();
        let mut ex = executor(synth);
        let mut w = window(1.0, reuses);
        for id in &ids[..5] {
            ex.run_now(&w.insert(*id, 18).unwrap()).unwrap();
        }
        let plan = w.insert(ids[5], 18).unwrap();
        // Three of five leave; the two survivors, then the new chunk, prefilled in place.
        assert_eq!(prefilled_in_place(&plan), vec![ids[3], ids[4], ids[5]], "{plan}");
        assert!(
            !plan.background.iter().any(|s| matches!(s, Step::Prefill { .. })),
            "nothing prefilled again after the answer: {plan}"
        );
        let stored = plan.background.iter().any(|s| matches!(s, Step::StorePatch { .. }));
        assert_eq!(stored, patches, "expected reuses {reuses}: {plan}");
        assert!(w.repair().is_empty(), "nothing left to repair");
        ex.run_now(&plan).unwrap();
        // The window is exact again: what a full prefill of its chunks in order gives.
        let order: Vec<_> = w.slots().iter().map(|s| s.chunk).collect();
        let got = ex.window_kv().unwrap().unwrap();
        let want = ex.encoder().full(&order);
        let (g, f) = (got.layers()[1].k.to_f32_vec(), want.layers()[1].k.to_f32_vec());
        let diff = g.iter().zip(&f).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(diff < 1e-4, "repaired window differs from the full prefill by {diff}");
    }
}

/// With repair off (`WindowConfig::repair`, a session's `repair = false`), survivors over the KL
/// budget stay re-rotated blind: the insert that evicts prefills only its own chunk.
#[test]
fn with_repair_off_survivors_stay_blind() {
    let mut synth = Synth::new();
    let ids: Vec<_> = (0..6).map(|i| synth.chunk(i + 20, 18)).collect();
    let mut cfg = window(1.0, 4.0).config().clone();
    cfg.repair = false;
    let mut w = Window::new(cfg);
    for id in &ids[..5] {
        w.insert(*id, 18).unwrap();
    }
    let plan = w.insert(ids[5], 18).unwrap();
    assert_eq!(prefilled_in_place(&plan), vec![ids[5]], "{plan}");
    assert!(w.slots().iter().any(|s| s.shifted), "survivors left re-rotated");
    assert!(w.repair().is_empty(), "nothing repaired later either");
}
