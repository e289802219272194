//! Parity with an independent implementation (HF transformers + torch, float32, same GGUF):
//! same token ids, top-1 equal and mean KL < 1e-3 over every position of the golden prompts.

mod common;

use anyhow::{Result, ensure};
use kamera_model::{Golden, ModelName};

fn parity(name: ModelName) -> Result<()> {
    let golden = Golden::read(&Golden::path(name))?;
    let model = common::load(name)?;
    for case in &golden.cases {
        let ours_ids = model.tokenizer().encode(&case.prompt)?;
        ensure!(
            ours_ids == case.ids,
            "{name}: tokenizer differs on {:?}:\n ours {:?}\n ref  {:?}",
            case.prompt,
            ours_ids,
            case.ids
        );
    }
    let s = golden.score(&model)?;
    eprintln!(
        "{name}: vs {}: mean KL {:.3e}, max KL {:.3e}, top-1 equal at {}/{} positions",
        golden.source, s.mean_kl, s.max_kl, s.top1_equal, s.positions
    );
    ensure!(s.last_top1_equal, "{name}: top-1 differs at a last position");
    ensure!(
        s.top1_equal * 100 >= s.positions * 97,
        "{name}: top-1 equal at only {}/{} positions",
        s.top1_equal,
        s.positions
    );
    ensure!(s.mean_kl < 1e-3, "{name}: mean KL {:.3e} >= 1e-3", s.mean_kl);
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
