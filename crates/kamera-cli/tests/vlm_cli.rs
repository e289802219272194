//! The `kamera` binary with a model directory a user brings: `models add` checks that it loads
//! and registers it under a name, `models list` shows it, `bench reuse --model NAME` runs the
//! image-chunk table on it; a directory that does not load is refused with the reason.

use std::path::PathBuf;
use std::process::{Command, Output};

fn kamera(home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kamera"))
        .args(args)
        .env("KAMERA_HOME", home)
        .output()
        .expect("run kamera")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn models_add_then_bench_reuse_on_a_vlm_directory() {
    let home = tempfile::tempdir().unwrap();
    let tiny: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "kamera-model",
        "tests",
        "golden",
        "qwen25vl-tiny",
    ]
    .iter()
    .collect();
    let add = kamera(home.path(), &["models", "add", "tiny-vl", tiny.to_str().unwrap()]);
    assert!(add.status.success(), "{}", text(&add));
    assert!(text(&add).contains("vision: yes"), "{}", text(&add));
    let list = kamera(home.path(), &["models", "list"]);
    assert!(text(&list).contains("tiny-vl"), "{}", text(&list));

    let bench = kamera(
        home.path(),
        &[
            "bench",
            "reuse",
            "--model",
            "tiny-vl",
            "--chunk-tokens",
            "32",
            "--chunks",
            "1",
            "--question-tokens",
            "4",
            "--reps",
            "1",
            "--image-size",
            "320x200",
            "--pixels",
            "12544",
        ],
    );
    let out = text(&bench);
    assert!(bench.status.success(), "{out}");
    assert!(
        out.contains("reuse speedup") && out.contains("revisit TTFT speedup"),
        "{out}"
    );

    let empty = tempfile::tempdir().unwrap();
    let bad = kamera(
        home.path(),
        &["models", "add", "nothing", empty.path().to_str().unwrap()],
    );
    assert!(!bad.status.success());
    assert!(text(&bad).contains("config.json"), "{}", text(&bad));
    let builtin = kamera(home.path(), &["models", "add", "smollm2-135m", tiny.to_str().unwrap()]);
    assert!(!builtin.status.success(), "a built-in name cannot be taken");
}
