//! Weights kept in their GGUF quantisation on the three real models: every weight matrix held
//! as codes (no f32 copy), within the stated bytes of the file, and decode on the codes giving
//! the logits of a prefill through dequantized panels.

mod common;

use anyhow::Result;
use kamera_model::{Model, ModelName};

fn check(name: ModelName, types: &[&str], max_ratio: f64) -> Result<Model> {
    let m = common::load(name)?;
    let w = m.weight_bytes();
    let gguf = std::fs::metadata(kamera_model::model_path(name, &kamera_model::default_home()))?.len() as f64;
    let ratio = w.total as f64 / gguf;
    eprintln!(
        "{name}: weights {:.1} MB = {ratio:.3}x the GGUF; {:?}; dense {:.2} MB",
        w.total as f64 / 1e6,
        w.quantized,
        w.dense as f64 / 1e6
    );
    let held: Vec<&str> = w.quantized.keys().map(String::as_str).collect();
    anyhow::ensure!(held == types, "{name}: block types held {held:?}, expected {types:?}");
    // Only norms and biases stay f32.
    anyhow::ensure!(
        (w.dense as f64) < 0.002 * w.total as f64,
        "{name}: {} dense bytes",
        w.dense
    );
    anyhow::ensure!(
        ratio <= max_ratio,
        "{name}: weights take {ratio:.3}x the GGUF (bound {max_ratio})"
    );
    Ok(m)
}

/// Decode (one token at a time, matrix-vector products on the codes) against a prefill of the
/// same sequence (dequantized panels through the f32 GEMM): the same distribution.
fn decode_matches_prefill(m: &Model) -> Result<()> {
    let mut seq = m
        .tokenizer()
        .encode_raw("The weights stay quantized while the model decodes")?;
    let mut ctx = m.empty_context();
    m.extend(&seq, &mut ctx)?;
    for t in [11u32, 42, 7] {
        let step = m.extend(&[t], &mut ctx)?;
        seq.push(t);
        let full = m.prefill(&seq, 0, &m.empty_context())?;
        let kl = common::kl(&full.logits, &step.logits);
        anyhow::ensure!(kl < 1e-6, "decode vs prefill at {}: KL {kl}", seq.len());
    }
    Ok(())
}

#[test]
fn smollm2_held_as_q4_1_and_q8_0() -> Result<()> {
    let m = check(ModelName::Smollm2_135m, &["Q4_1", "Q8_0"], 1.2)?;
    decode_matches_prefill(&m)
}

#[test]
fn qwen25_held_as_its_four_block_types() -> Result<()> {
    let m = check(ModelName::Qwen25_05b, &["Q4_K", "Q5_0", "Q6_K", "Q8_0"], 1.5)?;
    decode_matches_prefill(&m)
}

#[test]
fn gemma3_held_as_its_four_block_types() -> Result<()> {
    let m = check(ModelName::Gemma3_270m, &["Q4_K", "Q5_0", "Q6_K", "Q8_0"], 1.2)?;
    decode_matches_prefill(&m)
}
