//! `kamera bench model`'s argument errors that need no model: a requantized file is made only
//! for the comparison with llama.cpp, and only to the types its fast kernels cover.

mod common;

use common::{kamera, text};

#[test]
fn requant_needs_llamacpp_and_a_type_it_has_kernels_for() {
    let alone = kamera(&[], &["bench", "model", "--model", "smollm2-135m", "--requant", "q4_0"]);
    assert!(
        !alone.status.success()
            && text(&alone).contains("--requant q4_0")
            && text(&alone).contains("--against llama.cpp"),
        "{}",
        text(&alone)
    );
    let other = kamera(
        &[],
        &[
            "bench",
            "model",
            "--model",
            "smollm2-135m",
            "--against",
            "llama.cpp",
            "--requant",
            "q5_k",
        ],
    );
    assert!(
        !other.status.success() && text(&other).contains("q5_k") && text(&other).contains("q4_0"),
        "{}",
        text(&other)
    );
}
