//! Loading a Qwen2.5-VL directory: bf16 weights in one model.safetensors load, are held in bf16
//! and agree with the f32 sharded checkpoint; a missing or mis-shaped tensor is an error naming it and the shapes.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use kamera_model::Model;

mod common;
use common::{tiny_vl as tiny, vl_text_logits};

/// A copy of the tiny checkpoint's config and tokenizer with `tensors` as one model.safetensors.
fn variant(name: &str, tensors: &HashMap<String, Tensor>) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kamera-vl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
    ] {
        std::fs::copy(tiny().join(f), dir.join(f))?;
    }
    candle_core::safetensors::save(tensors, dir.join("model.safetensors"))?;
    Ok(dir)
}

fn all_tensors() -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for e in std::fs::read_dir(tiny())? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            out.extend(candle_core::safetensors::load(&p, &Device::Cpu)?);
        }
    }
    Ok(out)
}

#[test]
fn bf16_weights_load_and_agree() -> Result<()> {
    let bf16: HashMap<String, Tensor> = all_tensors()?
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(DType::BF16)?)))
        .collect::<Result<_>>()?;
    let dir = variant("bf16", &bf16)?;
    let (a, b) = (Model::load(&tiny())?, Model::load(&dir)?);
    assert_ne!(a.fingerprint(), b.fingerprint(), "other weights, other store key");
    let (la, lb) = (vl_text_logits(&a)?, vl_text_logits(&b)?);
    let argmax = |v: &[f32]| (0..v.len()).fold(0, |m, i| if v[i] > v[m] { i } else { m });
    let scale = la.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = la.iter().zip(&lb).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
    println!("bf16 vs f32 weights: last-position logits rel. diff {err:.2e}");
    assert_eq!(argmax(&la), argmax(&lb));
    assert!(err < 0.05 && err > 0.0, "{err}");
    // A bf16 checkpoint's matrices stay bf16 at the f32 precision (exact values, f32 products).
    let (fa, fb) = (a.weight_bytes(), b.weight_bytes());
    assert_eq!(b.prefill_precision(), kamera_model::PrefillPrecision::F32);
    assert!(
        fb.total * 10 < fa.total * 6,
        "bf16 checkpoint held in {} bytes, the f32 one in {}",
        fb.total,
        fa.total
    );
    std::fs::remove_dir_all(dir)?;
    Ok(())
}

#[test]
fn missing_or_misshaped_tensors_are_named() -> Result<()> {
    let mut t = all_tensors()?;
    let name = "model.layers.1.self_attn.k_proj.weight";
    t.insert(name.into(), Tensor::zeros((64, 32), DType::F32, &Device::Cpu)?);
    let dir = variant("shape", &t)?;
    let err = Model::load(&dir).expect_err("mis-shaped tensor").to_string();
    assert!(
        err.contains(name) && err.contains("[32, 64]") && err.contains("[64, 32]"),
        "{err}"
    );
    std::fs::remove_dir_all(dir)?;

    let mut t = all_tensors()?;
    t.remove("visual.merger.ln_q.weight");
    let dir = variant("missing", &t)?;
    let err = Model::load(&dir).expect_err("missing tensor").to_string();
    assert!(err.contains("visual.merger.ln_q.weight"), "{err}");
    std::fs::remove_dir_all(dir)?;

    let empty = std::env::temp_dir().join(format!("kamera-vl-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty)?;
    let err = Model::load(&empty).expect_err("no config").to_string();
    assert!(err.contains("config.json"), "{err}");
    std::fs::remove_dir_all(empty)?;
    Ok(())
}

/// A Hugging Face checkpoint's dense matrices follow the prefill precision: bf16 holds them in
/// bf16 (half the bytes) under another fingerprint (the store keeps its KV apart), f32 again
/// gives back the f32 fingerprint; loading at bf16 equals converting after an f32 load.
#[test]
fn dense_weights_follow_the_prefill_precision() -> Result<()> {
    use kamera_model::PrefillPrecision;
    if !PrefillPrecision::Bf16.available() {
        kamera_ops::testkit::skip(
            "vl_load::dense_weights_follow_the_prefill_precision",
            "this CPU has no AVX512_BF16",
        );
        return Ok(());
    }
    let mut m = Model::load(&tiny())?;
    let (fp, bytes) = (m.fingerprint().to_string(), m.weight_bytes().total);
    m.set_prefill_precision(PrefillPrecision::Bf16)?;
    anyhow::ensure!(
        m.prefill_precision() == PrefillPrecision::Bf16,
        "{}",
        m.prefill_precision()
    );
    anyhow::ensure!(m.fingerprint() != fp, "bf16 KV must not share f32's store key");
    anyhow::ensure!(
        m.weight_bytes().total * 10 < bytes * 6,
        "{} of {bytes} bytes",
        m.weight_bytes().total
    );
    let loaded = Model::load_with_precision(&tiny(), PrefillPrecision::Bf16)?;
    anyhow::ensure!(loaded.fingerprint() == m.fingerprint(), "load at bf16 = convert after");
    anyhow::ensure!(
        vl_text_logits(&loaded)? == vl_text_logits(&m)?,
        "the same logits bit for bit"
    );
    m.set_prefill_precision(PrefillPrecision::F32)?;
    anyhow::ensure!(m.prefill_precision() == PrefillPrecision::F32 && m.fingerprint() == fp);
    Ok(())
}
