//! The repair of survivors of an eviction ([`Window::repair`]), on the synthetic encoder: after
//! the background steps run, each survivor holds the KV a prefill in place gives, and the patch
//! stored for its new context takes its canonical record to that KV (not to the blind KV it had
//! when the repair was planned), so a later placement there is exact.

mod common;

use common::{Synth, concat, max_diff, model};
use kamera_ops::{ChunkKv, DType, PatchConfig};
use kamera_sched::{CostModel, Encoder, ExecConfig, Executor, Window, WindowConfig};
use kamera_store::{ChunkId, ChunkStore, Key, MemStore};

#[test]
fn repaired_survivors_are_exact_and_their_patches_restore_them() {
    let mut synth = Synth::new();
    let ids: Vec<ChunkId> = (0..4).map(|i| synth.chunk(i, 6)).collect();
    let cfg = ExecConfig {
        model: model(),
        patch: PatchConfig::fixed(2, DType::F32),
        dtype: DType::F32,
    };
    let mut ex = Executor::new(synth, MemStore::new(), cfg);
    let mut wcfg = WindowConfig::new(18, model());
    // Blind survivors are predicted over the KL budget: they are repaired.
    wcfg.cost = CostModel {
        survivor_blind_kl: 1.0,
        kl_budget: 0.01,
        ..CostModel::default()
    };
    let mut w = Window::new(wcfg);
    for id in &ids[..3] {
        ex.run_now(&w.insert(*id, 6).unwrap()).unwrap();
    }
    // The fourth evicts the first; the second and third survive, shifted left.
    ex.run_now(&w.insert(ids[3], 6).unwrap()).unwrap();
    assert!(w.slot(&ids[1]).unwrap().shifted);
    let repair = w.repair();
    assert_eq!(repair.count("store-patch"), 3, "{repair}");
    ex.run(&repair).unwrap();
    ex.settle().unwrap();
    let mut ctx: Option<ChunkKv> = None;
    for s in w.slots() {
        let got = ex.resident(&s.chunk).unwrap().clone();
        let want = ex.encoder().kv(s.chunk, s.start, ctx.as_ref());
        assert!(
            max_diff(&got, &want) < 1e-4,
            "survivor at {} differs by {}",
            s.start,
            max_diff(&got, &want)
        );
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
        ctx = Some(match ctx {
            None => got,
            Some(prev) => concat(&prev, &got, &ex.encoder().rope),
        });
    }
}
