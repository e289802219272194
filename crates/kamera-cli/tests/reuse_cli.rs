//! `kamera bench reuse` on SmolLM2-135M with small chunks: the JSON holds the host (CPU, cores,
//! load, commit, date), the precision, memcpy and relocation at the same thread counts with the
//! STREAM ceiling, and the revisit on the session's path with its KL to the full re-prefill;
//! medians lie inside their spread; the table prints them.

mod common;

use common::{kamera, text};

#[test]
fn bench_reuse_json_has_host_same_thread_memcpy_and_revisit_kl() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("reuse.json");
    let out = kamera(
        &[],
        &[
            "bench",
            "reuse",
            "--model",
            "smollm2-135m",
            "--chunk-tokens",
            "48",
            "--chunks",
            "2",
            "--question-tokens",
            "8",
            "--rank",
            "64",
            "--reps",
            "3",
            "--pairs",
            "5",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let m = &v["machine"];
    assert!(!m["cpu"].as_str().unwrap().is_empty(), "{m}");
    assert!(m["cores"].as_u64().unwrap() >= 1, "{m}");
    assert!(!m["loadavg_start"].as_str().unwrap().is_empty(), "{m}");
    assert!(!m["commit"].as_str().unwrap().is_empty(), "{m}");
    assert!(m["date"].as_str().unwrap().starts_with("20"), "{m}");
    let c = &v["cpu"];
    assert!(
        ["f32", "bf16"].contains(&c["prefill_precision"].as_str().unwrap()),
        "{c}"
    );
    assert_eq!(c["dtype"], "f32");
    let threads = c["threads"].as_u64().unwrap();
    let at = c["limits"]["same_threads"].as_array().unwrap();
    // One thread, then every thread of the pool (once when the pool has one).
    assert_eq!(at[0]["threads"], 1);
    assert_eq!(at.last().unwrap()["threads"].as_u64(), Some(threads));
    assert_eq!(at.len(), if threads > 1 { 2 } else { 1 });
    for t in at {
        for k in [
            "memcpy_gbs",
            "relocate_f32_gbs",
            "relocate_f32_of_memcpy",
            "relocate_bf16_of_memcpy",
        ] {
            assert!(t[k].as_f64().unwrap() > 0.0, "{k}: {t}");
        }
    }
    assert!(c["limits"]["stream"]["best_gbs"].as_f64().unwrap() > 0.0);
    for s in [
        &c["chunk"]["reuse_speedup"],
        &c["revisit"]["speedup"],
        &c["revisit"]["ttft_ms"],
        &c["revisit"]["full_ms"],
    ] {
        let (q1, med, q3) = (
            s["q1"].as_f64().unwrap(),
            s["median"].as_f64().unwrap(),
            s["q3"].as_f64().unwrap(),
        );
        assert!(q1 <= med && med <= q3 && s["n"] == 5, "{s}");
    }
    let r = &c["revisit"];
    // Every chunk placed from the store with the patch formed for this context, nothing
    // prefilled; a patch of full rank (64 >= the chunk's tokens, f32 factors) leaves only the
    // prefill's own rounding: the revisit answers as the full re-prefill does.
    assert_eq!(r["patches_applied"], 2, "{r}");
    assert_eq!(r["prefill_tokens"], 0, "{r}");
    let kl = r["kl"].as_f64().unwrap();
    assert!((0.0..1e-2).contains(&kl), "revisit KL {kl}");
    assert_eq!(r["top1_agree"], true, "{r}");
    assert!(r["speedup"]["median"].as_f64().unwrap() > 1.0, "{r}");
    assert!(
        text.contains("revisit KL to the full re-prefill") && text.contains("STREAM copy"),
        "{text}"
    );
}

/// Without the `cuda` feature the device path is refused at once, naming the flag and the build
/// that has it (before any model is loaded).
#[cfg(not(feature = "cuda"))]
#[test]
fn bench_reuse_on_a_device_without_cuda_is_a_clear_error() {
    let out = kamera(&[], &["bench", "reuse", "--device", "cuda", "--model", "no-such-model"]);
    let text = text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("--device cuda") && text.contains("--features cuda"),
        "{text}"
    );
}
