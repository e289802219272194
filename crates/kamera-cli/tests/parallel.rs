//! `kamera run --parallel` on real Chromium and the embedded SmolLM2-135M: two episodes of
//! different scenarios at once in one process keep their traces, remembered values and answers
//! apart; bad combinations are clear errors.

mod common;

use common::{kamera, text};

fn scenario(name: &str) -> String {
    format!("{}/../../scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn two_parallel_episodes_keep_their_traces_and_answers_apart() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("traces");
    let out = kamera(
        &[],
        &[
            "run",
            "--parallel",
            "2",
            &scenario("order-status"),
            &scenario("directory-pages"),
            "--no-store",
            "--json",
            "--trace",
            trace.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["concurrency"], 2);
    assert_eq!(j["episodes"], 2);
    let runs = j["runs"].as_array().unwrap();
    // Both ran at once: the second started before the first ended.
    assert!(
        runs[1]["started_ms"].as_f64().unwrap() < runs[0]["ended_ms"].as_f64().unwrap(),
        "{j}"
    );
    // What each episode remembered and used: order-status types the tracking number it read,
    // directory-pages asks about the team it read. Its answer is SmolLM2-135M's own, pinned to
    // catch a change in what the model reads, not the right one (the team page says floor 9).
    let expected = [
        ("order-status", "Awaiting pickup", "\"TRK-"),
        ("directory-pages", "1", "On which floor is team "),
    ];
    let mut origins = Vec::new();
    for (i, (run, (name, answer, used))) in runs.iter().zip(expected).enumerate() {
        assert_eq!(run["scenario"], name);
        assert_eq!(run["success"], true, "{run}");
        assert_eq!(run["answer"], answer, "{run}");
        let t =
            std::fs::read_to_string(std::path::Path::new(run["trace"].as_str().unwrap()).join("trace.ndjson")).unwrap();
        let lines: Vec<serde_json::Value> = t.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        // The trace is this episode's alone: its header names it, its steps are its own count
        // on its own site, and what it remembered is in it and not in the other's.
        assert!(t.contains(&format!("name = \\\"{name}\\\"")), "{name}: header");
        let steps: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "step").collect();
        assert_eq!(steps.len() as u64, run["steps"].as_u64().unwrap(), "{name}");
        let urls: Vec<&str> = steps
            .iter()
            .map(|s| s["observation"]["url"].as_str().unwrap())
            .collect();
        let origin = urls[0].split('/').take(3).collect::<Vec<_>>().join("/");
        assert!(urls.iter().all(|u| u.starts_with(&origin)), "{name}: {urls:?}");
        origins.push(origin);
        assert!(t.contains(used), "{name} used {used:?}");
        let (_, _, other) = expected[1 - i];
        assert!(!t.contains(other), "{name} holds the other episode's {other:?}");
    }
    assert_ne!(origins[0], origins[1], "each episode serves its own site");
    assert!(j["peak_pss_mb"].as_f64().unwrap() > j["peak_rss_self_mb"].as_f64().unwrap() * 0.5);
}

#[test]
fn parallel_refuses_what_belongs_to_one_run() {
    let path = scenario("order-status");
    for (flag, value) in [("--profile", "alice"), ("--report", "r.html"), ("--parallel", "0")] {
        let mut args = vec!["run", &path, flag, value];
        if flag != "--parallel" {
            args.extend(["--parallel", "2"]);
        }
        let out = kamera(&[], &args);
        assert!(!out.status.success());
        let t = text(&out);
        assert!(t.contains("one run") || t.contains("--parallel 0"), "{flag}: {t}");
    }
}
