//! Transform-coded patches in the window: the cost model chooses the coded point exactly when the
//! model's basis is loaded, and the executor forms, stores (a version-3 record on disk, decoded in
//! the basis the store is given) and serves them.

mod common;

use std::sync::Arc;

use common::{Synth, exact, max_diff, model};
use kamera_ops::{Bases, DType};
use kamera_sched::{Choice, CostModel, ExecConfig, Executor, Step, Window, WindowConfig};

/// Gemma's transform-coded point is chosen exactly when the model's basis is loaded, and the
/// configuration it gives codes patches in that basis.
#[test]
fn transform_coded_points_need_the_models_basis() {
    let mut c = CostModel {
        patch_points: kamera_sched::gemma3_patch_points(),
        ..CostModel::default()
    };
    assert_eq!(c.patch_point().unwrap().label, "kamera-budget:0.095/q4/rf");
    assert!(c.patch_config().basis.is_none());
    let plain = c.svd(100);
    let f = 4;
    let eye: Vec<f32> = (0..f * f).map(|i| if i % (f + 1) == 0 { 1.0 } else { 0.0 }).collect();
    let basis = Arc::new(kamera_ops::PatchBasis::new(f, f, vec![(eye.clone(), eye)], None).unwrap());
    c.basis = Some(basis.clone());
    assert_eq!(c.patch_point().unwrap().label, "kamera-budget:0.1/klte/ls");
    let cfg = c.patch_config();
    assert_eq!(
        cfg.basis.as_ref().map(|b| (b.basis.fp(), b.entropy)),
        Some((basis.fp(), true))
    );
    // Forming a coded patch costs its coding too.
    assert_eq!(c.svd(100), plain + 100.0 * c.patch_point().unwrap().form_us_per_token);
    assert!(c.svd(100) > plain);
    c.patch_bytes_budget = 0.097;
    assert_eq!(
        c.patch_point().unwrap().label,
        "kamera-budget:0.095/q4/rf",
        "10.0% does not fit 9.7%"
    );
}

/// The runtime path of a transform-coded patch: the executor forms it in the model's basis (the
/// cost model's choice once a basis is loaded), the sled store keeps it as a version-3 record on
/// disk, a reopened store decodes it, and the recall it serves restores the conditioned KV to
/// within the coding's error (every column at up to 8 bits under a whole-KV budget).
#[test]
fn transform_coded_patches_are_formed_stored_on_disk_and_served() {
    let dir = std::env::temp_dir().join(format!("kamera-sched-klt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut synth = Synth::new();
    let (a, b, c) = (synth.chunk(1, 5), synth.chunk(2, 6), synth.chunk(3, 40));
    let layout = synth.layout;
    let f = layout.k_features();
    let eye: Vec<f32> = (0..f * f).map(|i| if i % (f + 1) == 0 { 1.0 } else { 0.0 }).collect();
    let layers = (0..layout.n_layers).map(|_| (eye.clone(), eye.clone())).collect();
    let basis = Arc::new(kamera_ops::PatchBasis::new(f, f, layers, None).unwrap());
    // The store decodes coded records in the bases it is opened with: the model's.
    let open = || {
        kamera_store::SledStore::open(kamera_store::StoreConfig {
            bases: Bases::from(basis.clone()),
            ..kamera_store::StoreConfig::at(&dir)
        })
        .unwrap()
    };
    let mut cost = CostModel {
        patch_points: kamera_sched::gemma3_patch_points(),
        ..CostModel::default()
    };
    cost.basis = Some(basis.clone());
    cost.patch_bytes_budget = 1.0;
    cost.patch_points[1].config.rank = kamera_ops::RankPolicy::Budget { fraction: 1.0 };
    cost.patch_points[1].bytes = 1.0;
    cost.revisit_rate = 0.0;
    // Coding costs ~10 ms per token: at 4 expected reuses re-prefilling 40 tokens is cheaper.
    cost.expected_reuses = 100.0;
    let cfg = ExecConfig::new(model(), &cost, DType::F32);
    assert!(
        cfg.patch.basis.is_some(),
        "the cost model chose the transform-coded point"
    );
    let store = open();
    let mut ex = Executor::new(synth, Box::new(store) as Box<dyn kamera_store::ChunkStore>, cfg);
    let mut wcfg = WindowConfig::new(100, model());
    wcfg.cost = exact(cost);
    let mut w = Window::new(wcfg);
    for (id, n) in [(a, 5), (b, 6), (c, 40)] {
        ex.run_now(&w.insert(id, n).unwrap()).unwrap();
    }
    let exact = ex.window_kv().unwrap().unwrap();
    // Without a patch the recalled chunk would be off by this much.
    let blind = max_diff(
        &kamera_ops::relocate(&ex.encoder().kv(c, 0, None), &ex.encoder().rope, 11).unwrap(),
        ex.resident(&c).unwrap(),
    );
    ex.run_now(&w.evict(&c).unwrap()).unwrap();
    let plan = w.recall(c).unwrap();
    assert_eq!(plan.decisions[0].choice, Choice::FormPatch, "{plan}");
    ex.run_now(&plan).unwrap();
    // The first placement is the conditioned prefill itself (exact); the next recall after the
    // same context goes through the coded patch read from the store.
    assert_eq!(max_diff(&ex.window_kv().unwrap().unwrap(), &exact), 0.0);
    ex.run_now(&w.evict(&c).unwrap()).unwrap();
    let again = w.recall(c).unwrap();
    assert_eq!(again.decisions[0].choice, Choice::CachedPatch, "{again}");
    ex.run_now(&again).unwrap();
    let err = max_diff(&ex.window_kv().unwrap().unwrap(), &exact);
    assert!(
        err > 0.0 && err < blind / 10.0,
        "recalled through the coded patch: off by {err}, blind {blind}"
    );
    let key = plan
        .background
        .iter()
        .find_map(|s| match s {
            Step::StorePatch { key, .. } => Some(*key),
            _ => None,
        })
        .unwrap();
    let formed = ex.store().get(&key).unwrap().unwrap();
    assert!(formed.as_patch().unwrap().code().is_some());
    drop(ex);
    let store = open();
    let back = kamera_store::ChunkStore::get(&store, &key).unwrap().unwrap();
    assert_eq!(back, formed, "the record read back from disk");
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}
