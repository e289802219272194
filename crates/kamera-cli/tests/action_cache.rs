//! `kamera run --action-cache DIR` end to end (real Chromium, SmolLM2-135M fetched as every CLI
//! test does): a task run twice with one cache makes no model call the second time and passes;
//! on the perturbed site (kamera-site `perturb = 1`) the cache of the unperturbed run heals every
//! step it needs (a target re-found by its features or its kind, an answer re-read by one model
//! call) and the task passes with at most one model call per healed step, where the same
//! scenario without the cache fails; a corrupt entry fails the run with an error naming its file.

mod common;

use std::path::{Path, PathBuf};

use common::{kamera, text};

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../scenarios/{name}.toml"))
}

/// `kamera run SCENARIO --json --no-store [--action-cache DIR]`: the summary, and whether it exited 0.
fn run(name: &str, cache: Option<&Path>) -> (serde_json::Value, bool, String) {
    let s = scenario(name);
    let mut args = vec!["run", s.to_str().unwrap(), "--json", "--no-store"];
    if let Some(c) = cache {
        args.extend(["--action-cache", c.to_str().unwrap()]);
    }
    let out = kamera(&[], &args);
    let all = text(&out);
    let j = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (j, out.status.success(), all)
}

fn n(j: &serde_json::Value, k: &str) -> u64 {
    j[k].as_u64().unwrap_or_else(|| panic!("no {k} in {j}"))
}

#[test]
fn second_run_makes_no_model_call_and_the_perturbed_site_heals() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");

    let (first, ok, log) = run("track-button", Some(&cache));
    assert!(ok, "{log}");
    assert_eq!(first["end"]["success"], true, "{log}");
    assert_eq!(
        n(&first, "model_calls"),
        1,
        "the question; scripted targets need no model: {log}"
    );
    assert_eq!(n(&first, "cache_hits"), 0);
    assert_eq!(first["cache"]["stored"], 6, "five targets and the answer: {log}");
    let unperturbed = dir.path().join("unperturbed");
    copy_dir(&cache, &unperturbed);

    let (second, ok, log) = run("track-button", Some(&cache));
    assert!(ok, "{log}");
    assert_eq!(second["end"]["success"], true, "{log}");
    assert_eq!(n(&second, "model_calls"), 0, "{log}");
    assert_eq!(n(&second, "cache_hits"), 6, "{log}");
    assert_eq!(first["end"]["answer"], second["end"]["answer"]);

    // Without the cache the perturbed site defeats the script.
    let (_, ok, log) = run("track-button-perturbed", None);
    assert!(!ok, "the perturbed site should defeat the bare script: {log}");

    let (healed, ok, log) = run("track-button-perturbed", Some(&unperturbed));
    assert!(ok, "{log}");
    assert_eq!(healed["end"]["success"], true, "{log}");
    let (calls, heals) = (n(&healed, "model_calls"), n(&healed, "cache_healed"));
    assert!(heals > 0, "{log}");
    assert!(calls <= heals, "{calls} model calls for {heals} healed steps: {log}");
    assert_eq!(
        healed["cache"]["mismatches"], 0,
        "every healed step led where it did before: {log}"
    );

    // The healed entries now fit the perturbed site: it replays with no model call.
    let (again, ok, log) = run("track-button-perturbed", Some(&unperturbed));
    assert!(ok, "{log}");
    assert_eq!((n(&again, "model_calls"), n(&again, "cache_hits")), (0, 6), "{log}");
}

#[test]
fn a_corrupt_entry_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("0123456789abcdef0123456789abcdef.json");
    std::fs::write(&bad, b"{\"version\": 1, \"kind\": ").unwrap();
    let (_, ok, log) = run("track-button", Some(dir.path()));
    assert!(!ok, "{log}");
    assert!(
        log.contains("0123456789abcdef0123456789abcdef.json") && log.contains("not JSON"),
        "{log}"
    );
    std::fs::write(&bad, b"{\"version\": 2}").unwrap();
    let (_, ok, log) = run("track-button", Some(dir.path()));
    assert!(
        !ok && log.contains("entry version 2") && log.contains("reads version 1"),
        "{log}"
    );
    assert!(bad.exists(), "the bad entry is left for its owner");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}
