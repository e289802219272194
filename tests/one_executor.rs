//! One executor for the plan language: kamera-sched's `Executor` is the only code that runs a
//! plan's steps. No library or binary source outside kamera-sched names a kamera-sched step
//! variant (tests may inspect plans; they run none).

use std::path::{Path, PathBuf};

const STEP_VARIANTS: [&str; 11] = [
    "Prefill",
    "StoreCanonical",
    "KeepCanonical",
    "Recall",
    "FormPatch",
    "StorePatch",
    "FormOrbit",
    "Place",
    "Relocate",
    "EvictToStore",
    "DropTail",
];

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_crate_but_kamera_sched_runs_plan_steps() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let mut files = Vec::new();
    for group in ["crates", "agents"] {
        for e in std::fs::read_dir(root.join(group))
            .expect("crates/ and agents/")
            .flatten()
        {
            if e.file_name() != "kamera-sched" {
                rust_sources(&e.path().join("src"), &mut files);
            }
        }
    }
    assert!(
        files.len() > 50,
        "found only {} source files under {}",
        files.len(),
        root.display()
    );
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            for v in STEP_VARIANTS {
                let uses = line.contains(&format!("Step::{v} "))
                    || line.contains(&format!("Step::{v} {{"))
                    || line.contains(&format!("Step::{v}("));
                if uses && !line.trim_start().starts_with("//") {
                    found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "plan steps handled outside kamera-sched's executor:\n{}",
        found.join("\n")
    );
}
