//! Parity with an independent implementation (HF transformers + torch, float32, same GGUF):
//! same token ids, top-1 equal and mean KL < 1e-3 over every position of the golden prompts.

mod common;

use anyhow::{Context as _, Result, ensure};
use kamera_model::{Input, ModelName, PrefillOptions};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    source: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    ids: Vec<u32>,
    lse: Vec<f64>,
    top_ids: Vec<Vec<usize>>,
    top_logits: Vec<Vec<f64>>,
}

/// KL(ref || ours) over the reference top-K plus one tail bucket (a lower bound of the full KL
/// that is tight when the top-K holds nearly all the mass).
fn bucketed_kl(lse: f64, ids: &[usize], logits: &[f64], ours: &[f32]) -> f64 {
    let lq = common::log_softmax(ours);
    let (mut kl, mut pm, mut qm) = (0.0, 0.0, 0.0);
    for (&i, &l) in ids.iter().zip(logits) {
        let lp = l - lse;
        kl += lp.exp() * (lp - lq[i]);
        pm += lp.exp();
        qm += lq[i].exp();
    }
    let (pt, qt) = ((1.0 - pm).max(1e-30), (1.0 - qm).max(1e-30));
    (kl + pt * (pt / qt).ln()).max(0.0)
}

fn parity(name: ModelName) -> Result<()> {
    let text = std::fs::read_to_string(common::golden_path(name)).context("golden file")?;
    let golden: Golden = serde_json::from_str(&text)?;
    let model = common::load(name)?;
    let vocab = model.config().vocab;
    let (mut kl_sum, mut n_pos, mut top1_eq, mut kl_max) = (0.0, 0usize, 0usize, 0.0f64);
    let mut last_top1_ok = true;
    for case in &golden.cases {
        let ours_ids = model.tokenizer().encode(&case.prompt)?;
        ensure!(
            ours_ids == case.ids,
            "{name}: tokenizer differs on {:?}:\n ours {:?}\n ref  {:?}",
            case.prompt,
            ours_ids,
            case.ids
        );
        let out = model.prefill_with(
            Input::Tokens(&case.ids),
            0,
            &model.empty_context(),
            PrefillOptions { all_logits: true },
        )?;
        let all = out.all_logits.context("all logits")?;
        for (t, row) in all.chunks_exact(vocab).enumerate() {
            let kl = bucketed_kl(case.lse[t], &case.top_ids[t], &case.top_logits[t], row);
            kl_sum += kl;
            kl_max = kl_max.max(kl);
            n_pos += 1;
            let eq = common::argmax(row) == case.top_ids[t][0];
            top1_eq += eq as usize;
            if t + 1 == case.ids.len() {
                last_top1_ok &= eq;
            }
        }
    }
    let mean_kl = kl_sum / n_pos as f64;
    eprintln!(
        "{name}: vs {}: mean KL {mean_kl:.3e}, max KL {kl_max:.3e}, top-1 equal at {top1_eq}/{n_pos} positions",
        golden.source
    );
    ensure!(last_top1_ok, "{name}: top-1 differs at a last position");
    ensure!(
        top1_eq * 100 >= n_pos * 97,
        "{name}: top-1 equal at only {top1_eq}/{n_pos} positions"
    );
    ensure!(mean_kl < 1e-3, "{name}: mean KL {mean_kl:.3e} >= 1e-3");
    Ok(())
}

#[test]
fn parity_smollm2() -> Result<()> {
    parity(ModelName::Smollm2_135m)
}

#[test]
fn parity_qwen25() -> Result<()> {
    parity(ModelName::Qwen25_05b)
}

#[test]
fn parity_gemma3() -> Result<()> {
    parity(ModelName::Gemma3_270m)
}
