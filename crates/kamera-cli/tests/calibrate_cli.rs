//! `kamera calibrate` times forming the patch the runtime forms for the model (its measured
//! point: SVDs, 4-bit quantisation, refit), not a plain rank-16 SVD: on SmolLM2-135M that costs
//! about one prefill per token (crates/kamera-agent/README.md, "Cost model": 1.6 ms/token against
//! ~1.75 for the prefill, where a rank-16 f32 SVD takes ~0.3). The file is written under the
//! `$KAMERA_HOME` given, so the shared home's calibration is untouched.

mod common;

use common::{kamera, text};
use kamera_model::ModelName;

#[test]
fn calibrate_times_the_patch_the_runtime_forms() {
    let model = kamera_model::fetch(ModelName::Smollm2_135m, &kamera_model::default_home()).expect("fetch SmolLM2");
    let home = tempfile::tempdir().unwrap();
    let out = kamera(
        &[("KAMERA_HOME", home.path())],
        &[
            "calibrate",
            "--model",
            model.to_str().unwrap(),
            "--tokens",
            "128",
            "--context",
            "128",
            "--reps",
            "1",
        ],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("kamera-budget:0.095/q4/rf patch"),
        "the runtime's patch point is the one timed: {said}"
    );
    let dir = home.path().join("calibration");
    let file = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .next()
        .expect("a calibration file")
        .unwrap()
        .path();
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let svd = j["cost"]["svd_us_per_token"].as_f64().unwrap();
    let prefill = j["cost"]["prefill_us_per_token"].as_f64().unwrap();
    // Both are timed in the same run, so the ratio holds on a loaded machine; a rank-16 f32 SVD
    // (what calibrate timed before) comes to ~0.17 of the prefill.
    let ratio = svd / prefill;
    assert!(
        (0.3..4.0).contains(&ratio),
        "forming the runtime's patch costs {svd:.0} µs/token against {prefill:.0} for the prefill ({ratio:.2}x): {said}"
    );
}
