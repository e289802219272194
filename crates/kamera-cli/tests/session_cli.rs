//! `kamera bench session` end to end on a short walk (real Chromium, SmolLM2-135M): the JSON
//! holds the fields a reader and the checks use, every method ran on every step, the full
//! re-prefill is the reference (KL 0), a second Kamera policy (`--front`) ran beside the
//! default on the same steps, and the work/KL Pareto front names exactly the rows no other row
//! beats on both.

mod common;

use common::{kamera, text};

#[test]
fn bench_session_reports_every_method_and_the_front() {
    let dir = tempfile::tempdir().unwrap();
    let out = kamera(
        &[],
        &[
            "bench",
            "session",
            "--steps",
            "8",
            "--window",
            "256",
            "--front",
            "1",
            "--out",
            dir.path().to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let j: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("session.json")).unwrap()).unwrap();
    let s = &j["summary"];
    assert_eq!(s["steps"], 8);
    let methods = s["methods"].as_array().unwrap();
    let names: Vec<&str> = methods.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "kamera",
            "radix-cache",
            "full-reprefill",
            "llama.cpp-prompt-cache",
            "llama.cpp-context-shift"
        ]
    );
    for m in &methods[..3] {
        assert_eq!(m["status"], "run", "{m}");
        for f in [
            "ttft_p50_ms",
            "ttft_p95_ms",
            "work_mean_ms",
            "mean_kl",
            "max_kl",
            "action_agreement",
        ] {
            assert!(m[f].as_f64().is_some_and(f64::is_finite), "{} {f}: {m}", m["name"]);
        }
    }
    assert_eq!(methods[2]["mean_kl"], 0.0, "the full re-prefill is the reference");
    assert_eq!(methods[2]["action_agreement"], 1.0);
    // llama.cpp was not asked for: said so, with no figures.
    assert!(methods[3]["status"].as_str().unwrap().starts_with("not run"));
    assert!(methods[3]["ttft_p50_ms"].is_null());
    let policies = s["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 1);
    assert_eq!(policies[0]["name"], "kamera@kl1");
    assert_eq!(policies[0]["status"], "run");
    // Every step has every run method and policy.
    for row in j["steps"].as_array().unwrap() {
        for n in ["kamera", "radix-cache", "full-reprefill", "kamera@kl1"] {
            assert!(row["methods"][n].is_object(), "step {}: no {n}", row["step"]);
        }
    }
    // The front: exactly the rows that no other row beats on both mean work and mean KL.
    let rows: Vec<(&str, f64, f64)> = methods
        .iter()
        .chain(policies)
        .filter(|m| m["status"] == "run")
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["work_mean_ms"].as_f64().unwrap(),
                m["mean_kl"].as_f64().unwrap(),
            )
        })
        .collect();
    let want: Vec<&str> = rows
        .iter()
        .filter(|(_, w, k)| !rows.iter().any(|(_, w2, k2)| w2 <= w && k2 <= k && (w2 < w || k2 < k)))
        .map(|r| r.0)
        .collect();
    let got: Vec<&str> = s["pareto"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(got, want);
    assert!(!got.is_empty());
    let md = std::fs::read_to_string(dir.path().join("session.md")).unwrap();
    assert!(md.contains("Pareto front"), "{md}");
    assert!(md.contains("| kamera@kl1 |"), "{md}");
}
