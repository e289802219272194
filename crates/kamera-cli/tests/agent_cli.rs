//! `kamera bench agent` end to end (real Chromium, SmolLM2-135M, one MiniWoB++ task, one seed):
//! the table and the JSON have the structure the README shows and agree with each other, the
//! two baselines scored on the same task and seed beside the model; and
//! `kamera doctor` names what is missing with the command that installs it, and fails for a
//! required piece.

mod common;

use std::path::Path;

use common::{kamera, text};

#[test]
fn bench_agent_table_and_json_agree() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("agent.json");
    let out = kamera(
        &[],
        &[
            "bench",
            "agent",
            "--models",
            "smollm2-135m",
            "--tasks",
            "click-test",
            "--seeds",
            "1",
            "--decodings",
            "constrained",
            "--max-steps",
            "2",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[1/3] smollm2-135m constrained click-test seed 1:"),
        "{stderr}"
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let eps = r["episodes"].as_array().unwrap();
    assert_eq!(eps.len(), 3, "the model's episode, then one per baseline");
    assert_eq!(r["baselines"], serde_json::json!(["first-element", "random-valid"]));
    for (e, d) in eps[1..].iter().zip(["first-element", "random-valid"]) {
        assert_eq!(
            (e["model"].as_str(), e["decoding"].as_str()),
            (Some("baseline"), Some(d)),
            "{e}"
        );
        assert_eq!(e["task"], "click-test");
    }
    // (random-valid may pick `back`, which leaves the task's page: a failed episode, error and
    // all, as it would be for a model.)
    assert!(eps[1]["error"].is_null(), "{}", eps[1]);
    // click-test's only element is its button: clicking element [1] passes it.
    assert_eq!(
        eps[1]["actions"][0].as_str().map(|a| a.starts_with("click")),
        Some(true),
        "{}",
        eps[1]
    );
    assert_eq!(eps[1]["success"], true, "{}", eps[1]);
    let e = &eps[0];
    assert_eq!(e["task"], "click-test");
    assert_eq!(e["goal"], "Click the button.", "the utterance is the goal");
    let steps = e["steps"].as_u64().unwrap();
    assert!((1..=2).contains(&steps), "{e}");
    let success = e["success"].as_bool().unwrap();
    assert_eq!(
        success,
        e["reward"].as_f64().is_some_and(|x| x > 0.0),
        "success is reward > 0: {e}"
    );
    let t = &r["totals"][0];
    assert_eq!(
        (t["episodes"].as_u64(), t["success"].as_u64()),
        (Some(1), Some(success as u64))
    );
    assert_eq!(r["rows"].as_array().unwrap().len(), 3);
    assert_eq!(r["totals"][2]["decoding"], "random-valid");
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        md.contains("| model | decoding | episodes | success | rate | mean reward |"),
        "{md}"
    );
    let cell = format!("| click-test | {}/1 ", success as u8);
    assert!(md.contains(&cell), "{cell} in {md}");
    assert!(md.contains("| **total** |"), "{md}");
    assert!(
        md.contains("| baseline | first-element | 1 |") && md.contains("| baseline | random-valid | 1 |"),
        "{md}"
    );
    let bad = kamera(&[], &["bench", "agent", "--tasks", "no-such-task", "--seeds", "1"]);
    assert!(
        !bad.status.success() && text(&bad).contains("no-such-task"),
        "{}",
        text(&bad)
    );
}

#[test]
fn doctor_names_what_is_missing_and_fails_when_required() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("models")).unwrap();
    // A model file without its sha256 stamp is not taken as verified.
    std::fs::write(home.path().join("models").join("smollm2-135m.gguf"), b"not a model").unwrap();
    let none = Path::new("/nonexistent/chromium");
    let out = kamera(&[("KAMERA_HOME", home.path()), ("KAMERA_CHROMIUM", none)], &["doctor"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("MISSING  chromium") && t.contains("fix: scripts/install-chromium.sh"),
        "{t}"
    );
    assert!(
        t.contains("no matching .verified stamp") && t.contains("fix: kamera models fetch smollm2-135m"),
        "{t}"
    );
    assert!(t.contains("required but missing: chromium, model smollm2-135m"), "{t}");
    assert!(t.contains("ok       store"), "{t}");

    // With a browser that runs and the default model verified (fetched once into the usual cache,
    // linked here with its stamp), nothing required is missing.
    let cache = kamera_model::default_home();
    let gguf = kamera_model::fetch(kamera_model::ModelName::Smollm2_135m, &cache).unwrap();
    let models = home.path().join("models");
    std::fs::remove_file(models.join("smollm2-135m.gguf")).unwrap();
    std::os::unix::fs::symlink(&gguf, models.join("smollm2-135m.gguf")).unwrap();
    let stamp = gguf.with_extension("gguf.verified");
    std::fs::copy(&stamp, models.join("smollm2-135m.gguf.verified")).unwrap();
    let ok = kamera(
        &[
            ("KAMERA_HOME", home.path()),
            ("KAMERA_CHROMIUM", Path::new("/bin/true")),
        ],
        &["doctor", "--json"],
    );
    assert!(ok.status.success(), "{}", text(&ok));
    let checks: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    let by = |n: &str| {
        checks
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(by("model smollm2-135m")["ok"], true, "{checks}");
    assert_eq!(
        by("model qwen2.5-0.5b")["fix"],
        "kamera models fetch qwen2.5-0.5b",
        "{checks}"
    );
    assert_eq!(by("chromium")["required"], true);
}

/// `kamera bench agent --action-cache DIR --passes 2`: the second pass over one cache makes no
/// model call on any episode the first pass passed, and passes each of them again; the table
/// reports it.
#[test]
fn bench_agent_second_pass_over_one_cache_makes_no_model_call() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("agent.json");
    let cache = dir.path().join("cache");
    let out = kamera(
        &[],
        &[
            "bench",
            "agent",
            "--models",
            "smollm2-135m",
            "--tasks",
            "click-test,click-button",
            "--seeds",
            "2",
            "--decodings",
            "constrained",
            "--max-steps",
            "2",
            "--baselines",
            "none",
            "--action-cache",
            cache.to_str().unwrap(),
            "--passes",
            "2",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(
        r["episodes"].as_array().unwrap().len(),
        8,
        "2 tasks x 2 seeds x 2 passes"
    );
    let passes = r["cache_passes"].as_array().unwrap();
    assert_eq!(passes.len(), 2, "{passes:?}");
    let (one, two) = (&passes[0], &passes[1]);
    let n = |p: &serde_json::Value, k: &str| p[k].as_u64().unwrap_or_else(|| panic!("no {k} in {p}"));
    assert!(n(one, "model_calls") >= n(one, "first_passed"), "{one}");
    let passed = n(one, "first_passed");
    assert!(passed >= 1, "click-test's only element is its button: {one}");
    assert_eq!(n(two, "first_passed"), passed, "{two}");
    assert_eq!(
        n(two, "first_passed_no_calls"),
        passed,
        "replayed from the cache: {two}"
    );
    assert_eq!(n(two, "first_passed_again"), passed, "and passed again: {two}");
    assert!(n(two, "cache_hits") >= passed, "{two}");
    let md = String::from_utf8_lossy(&out.stdout);
    let row = "| smollm2-135m | constrained | 2 | 4 |";
    assert!(
        md.contains(row) && md.contains(&format!("| {passed}/{passed} | {passed}/{passed} |")),
        "{md}"
    );
}
