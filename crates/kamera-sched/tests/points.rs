//! The measured patch points are keyed by fingerprint: each known model, fetched as kamera-model
//! fetches it, finds its own points, under any prefill precision.

use kamera_model::{Model, ModelName, PrefillPrecision};
use kamera_sched::{
    Choice, CostModel, KNOWN_MODELS, gemma3_patch_points, measured_blind_kl, measured_points, qwen25_patch_points,
};
use kamera_store::ModelFp;

#[test]
fn each_known_model_finds_its_points_by_fingerprint() {
    let home = kamera_model::default_home();
    for (name, want) in [
        (ModelName::Smollm2_135m, kamera_sched::default_patch_points()),
        (ModelName::Qwen25_05b, qwen25_patch_points()),
        (ModelName::Gemma3_270m, gemma3_patch_points()),
    ] {
        let path = kamera_model::fetch(name, &home).unwrap_or_else(|e| panic!("fetching {name}: {e}"));
        let mut m = Model::load(&path).unwrap_or_else(|e| panic!("loading {name}: {e}"));
        let fp = ModelFp::of(m.base_fingerprint());
        eprintln!("{name}: base fingerprint {fp}");
        let got = measured_points(&fp);
        assert_eq!(
            got.as_ref(),
            Some(&want),
            "{name}: base fingerprint {fp} not in KNOWN_MODELS"
        );
        // A bf16 prefill changes the store's fingerprint, not the measured points.
        if m.set_prefill_precision(PrefillPrecision::Bf16).is_ok() {
            assert_eq!(measured_points(&ModelFp::of(m.base_fingerprint())), Some(want));
        }
    }
    assert_eq!(measured_points(&ModelFp::of("no such model")), None);
    let mut fps: Vec<_> = KNOWN_MODELS.iter().map(|m| m.fp).collect();
    fps.sort();
    fps.dedup();
    assert_eq!(fps.len(), 3);
}

/// The blind KLs measured on the session bench decide the default policy per model: Qwen2.5-0.5B
/// (blind recall 5.8e-3) places recalls and survivors blind under the default budget 0.01,
/// SmolLM2-135M (7.0e-2) does not, and Gemma 3 (never measured) keeps the conservative default.
#[test]
fn measured_blind_kls_set_each_models_default_policy() {
    let home = kamera_model::default_home();
    for (name, blind_by_default) in [
        (ModelName::Smollm2_135m, Some(false)),
        (ModelName::Qwen25_05b, Some(true)),
        (ModelName::Gemma3_270m, None),
    ] {
        let path = kamera_model::fetch(name, &home).unwrap_or_else(|e| panic!("fetching {name}: {e}"));
        let m = Model::load(&path).unwrap_or_else(|e| panic!("loading {name}: {e}"));
        let fp = ModelFp::of(m.base_fingerprint());
        let blind = measured_blind_kl(&fp);
        assert_eq!(
            blind.is_some(),
            blind_by_default.is_some(),
            "{name}: measured blind KL {blind:?}"
        );
        let Some(blind) = blind else { continue };
        let cost = CostModel {
            recall_blind_kl: blind.recall,
            survivor_blind_kl: blind.survivors,
            read_blind_kl: blind.read,
            blind_kl_window: blind.window,
            ..CostModel::default()
        };
        let recall = cost.recall(kamera_store::ChunkId::of(b"a page", "text", fp), 300, 200, false, 4.0);
        let survivors = cost.survivors(300, 200, blind.window, 4.0);
        let want = blind_by_default.unwrap();
        assert_eq!(recall.choice == Choice::Blind, want, "{name}: {}", recall.reason);
        assert_eq!(survivors.choice == Choice::Blind, want, "{name}: {}", survivors.reason);
        // A question's read of a blind page costs more than the budget on both measured models.
        let read = cost.read(130, 300, blind.window, 0.0);
        assert_eq!(read.choice, Choice::Reprefill, "{name}: {}", read.reason);
        // Twice the window: twice the stale KV a read crosses. Qwen2.5's survivors (5.1e-3 at
        // 512, 1.02e-2 predicted at 1024; 9.6e-3 measured) go over the budget there.
        let wide = cost.survivors(300, 200, 2 * blind.window, 4.0);
        assert_ne!(
            wide.choice,
            Choice::Blind,
            "{name} at window {}: {}",
            2 * blind.window,
            wide.reason
        );
    }
    assert!(CostModel::default().recall_blind_kl > CostModel::default().kl_budget);
}
