//! The measured patch points are keyed by fingerprint: each known model, fetched as kamera-model
//! fetches it, finds its own points, under any prefill precision.

use kamera_model::{Model, ModelName, PrefillPrecision};
use kamera_sched::{KNOWN_MODELS, gemma3_patch_points, measured_points, qwen25_patch_points};
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
