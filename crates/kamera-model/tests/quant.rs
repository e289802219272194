//! Weights kept in their GGUF quantisation on the three real models: every weight matrix held
//! as codes (no f32 copy), within the stated bytes of the file (Q4_0 ... Q8_0 take their block's
//! bytes, f16 scales included; the K-quants' f32 scales and Q6_K's byte codes take more), and
//! decode on the codes giving the logits of a prefill through dequantized panels.

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

/// The bf16 prefill (AVX512_BF16 CPUs) against the f32 one on a 300-token text: the mean KL over
/// every position's next-token distribution (the README reports it), top-1 agreement, and a
/// fingerprint of its own (the store keeps bf16 KV apart) that f32 gives back.
fn bf16_prefill_matches_f32(mut m: Model, test: &str) -> Result<()> {
    use kamera_model::{Input, PrefillOptions, PrefillPrecision};
    if !PrefillPrecision::Bf16.available() {
        let test = format!("kamera-model quant::{test} (its bf16 prefill part)");
        kamera_ops::testkit::skip(&test, "this CPU has no AVX512_BF16");
        return Ok(());
    }
    let text = "A web agent reads the order page, finds the status field and reports it. ".repeat(20);
    let mut ids = m.tokenizer().encode_raw(&text)?;
    ids.truncate(300);
    let all = |m: &Model| -> Result<Vec<f32>> {
        let opts = PrefillOptions { all_logits: true };
        let out = m.prefill_with(Input::Tokens(&ids), 0, &m.empty_context(), opts)?;
        out.all_logits.ok_or_else(|| anyhow::anyhow!("no logits"))
    };
    let f32_fp = m.fingerprint().to_string();
    let reference = all(&m)?;
    m.set_prefill_precision(PrefillPrecision::Bf16)?;
    anyhow::ensure!(m.fingerprint() != f32_fp, "bf16 prefill kept the f32 fingerprint");
    let fast = all(&m)?;
    let vocab = m.config().vocab;
    let (mut kl, mut same) = (0.0, 0usize);
    for (a, b) in reference.chunks_exact(vocab).zip(fast.chunks_exact(vocab)) {
        kl += common::kl(a, b);
        same += (common::argmax(a) == common::argmax(b)) as usize;
    }
    let n = ids.len();
    kl /= n as f64;
    eprintln!("bf16 vs f32 prefill over {n} positions: mean KL {kl:.3e}, top-1 equal at {same}/{n}");
    anyhow::ensure!(kl < 3e-4, "bf16 prefill: mean KL {kl:.3e} vs f32 (bound 3e-4)");
    anyhow::ensure!(same * 100 >= n * 97, "bf16 prefill: top-1 equal at only {same}/{n}");
    m.set_prefill_precision(PrefillPrecision::F32)?;
    anyhow::ensure!(m.fingerprint() == f32_fp, "f32 did not give the fingerprint back");
    Ok(())
}

#[test]
fn smollm2_held_as_q4_1_and_q8_0() -> Result<()> {
    let m = check(ModelName::Smollm2_135m, &["Q4_1", "Q8_0"], 0.99)?;
    decode_matches_prefill(&m)?;
    bf16_prefill_matches_f32(m, "smollm2_held_as_q4_1_and_q8_0")
}

#[test]
fn qwen25_held_as_its_four_block_types() -> Result<()> {
    let m = check(ModelName::Qwen25_05b, &["Q4_K", "Q5_0", "Q6_K", "Q8_0"], 1.06)?;
    decode_matches_prefill(&m)?;
    bf16_prefill_matches_f32(m, "qwen25_held_as_its_four_block_types")
}

#[test]
fn gemma3_held_as_its_four_block_types() -> Result<()> {
    let m = check(ModelName::Gemma3_270m, &["Q4_K", "Q5_0", "Q6_K", "Q8_0"], 1.02)?;
    decode_matches_prefill(&m)?;
    bf16_prefill_matches_f32(m, "gemma3_held_as_its_four_block_types")
}
