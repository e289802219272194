//! The `kamera` binary with a model directory a user brings: `models add` checks that it loads
//! and registers it under a name, `models list` shows it, `bench reuse --model NAME` runs the
//! image-chunk table on it; a directory that does not load is refused with the reason; `bench
//! vision` times the tower and the image prefill on it.

use std::path::PathBuf;
use std::process::{Command, Output};

fn kamera(home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kamera"))
        .args(args)
        .env("KAMERA_HOME", home)
        .output()
        .expect("run kamera")
}

/// The tiny random-weight Qwen2.5-VL checkpoint kamera-model's parity tests use.
fn tiny() -> PathBuf {
    [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "kamera-model",
        "tests",
        "golden",
        "qwen25vl-tiny",
    ]
    .iter()
    .collect()
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
    let tiny = tiny();
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

/// `kamera bench vision` on the tiny checkpoint: our side's table and JSON (the tower is part
/// of tower + prefill, the grid and token count are the preprocessing's), and bad arguments
/// refused with the reason. (`--against transformers` needs torch: run by hand.)
#[test]
fn bench_vision_on_a_vlm_directory() {
    let home = tempfile::tempdir().unwrap();
    let tiny = tiny();
    let json = home.path().join("vision.json");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "bench",
            "vision",
            "--model",
            tiny.to_str().unwrap(),
            "--image-size",
            "320x200",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        kamera(home.path(), &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let ok = run(&["--pixels", "12544", "--rounds", "3", "--json", json.to_str().unwrap()]);
    let out = text(&ok);
    assert!(ok.status.success(), "{out}");
    assert!(out.contains("| kamera ("), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let e = &v["engines"][0];
    assert_eq!(e["name"], "kamera");
    let (tower, total) = (
        e["tower_ms"]["median"].as_f64().unwrap(),
        e["encode_ms"]["median"].as_f64().unwrap(),
    );
    assert!(
        tower > 0.0 && tower <= total,
        "tower {tower} ms within tower + prefill {total} ms"
    );
    let grid: Vec<usize> = serde_json::from_value(v["grid"].clone()).unwrap();
    assert_eq!(
        v["image_tokens"].as_u64().unwrap() as usize,
        grid[0] * grid[1] / 2 * grid[2] / 2
    );
    assert_eq!(e["tower_ms"]["n"], 3);

    let few = run(&["--rounds", "2"]);
    assert!(
        !few.status.success() && text(&few).contains("--rounds 2"),
        "{}",
        text(&few)
    );
    let other = run(&["--against", "onnx"]);
    assert!(
        !other.status.success() && text(&other).contains("expected transformers"),
        "{}",
        text(&other)
    );
    let size = kamera(
        home.path(),
        &[
            "bench",
            "vision",
            "--model",
            tiny.to_str().unwrap(),
            "--image-size",
            "wide",
        ],
    );
    assert!(
        !size.status.success() && text(&size).contains("WIDTHxHEIGHT"),
        "{}",
        text(&size)
    );
}
