//! The Kamera operator end to end on a real model: B reused after A from its canonical KV plus a
//! full-rank conditioning patch reproduces the conditioned prefill; without the patch it does not.

mod common;

use anyhow::Result;
use kamera_model::{Context, ModelName, Placement};
use kamera_ops::{DType, PatchConfig, form_patch};

#[test]
fn full_rank_patch_restores_conditioning_smollm2() -> Result<()> {
    let m = common::load(ModelName::Smollm2_135m)?;
    let tok = |s: &str| m.tokenizer().encode_raw(s);
    let a = tok("Alice keeps her bicycle in the blue shed behind the library. ")?;
    let b = tok("She lent it to Bob on Tuesday. ")?;
    let q = tok("Question: whose bicycle did Bob borrow? Answer:")?;
    let na = a.len() as i64;
    let a_kv = m.prefill(&a, 0, &m.empty_context())?.chunk;
    let b_alone = m.prefill(&b, 0, &m.empty_context())?.chunk;
    let b_cond = m.prefill(&b, na, &Context::from_chunk(&a_kv)?)?.chunk;
    let patch = form_patch(&b_cond, &b_alone, m.rope(), &PatchConfig::fixed(usize::MAX, DType::F32))?;
    let run = |patched: bool| -> Result<Vec<f32>> {
        let parts = [
            Placement {
                chunk: &a_kv,
                patch: None,
            },
            Placement {
                chunk: &b_alone,
                patch: if patched { Some(&patch) } else { None },
            },
        ];
        let ctx = Context::from_chunks(&parts, m.rope(), 0)?;
        Ok(m.prefill(&q, ctx.end(), &ctx)?.logits)
    };
    let mut all = a.clone();
    all.extend(&b);
    all.extend(&q);
    let full = m.prefill(&all, 0, &m.empty_context())?.logits;
    let (kl_patch, kl_blind) = (common::kl(&full, &run(true)?), common::kl(&full, &run(false)?));
    eprintln!(
        "smollm2-135m: next-token KL vs full prefill: blind reuse {kl_blind:.2e}, full-rank patch {kl_patch:.2e}"
    );
    anyhow::ensure!(kl_patch < 1e-6, "patched reuse KL {kl_patch:.3e}");
    anyhow::ensure!(
        kl_blind > 100.0 * kl_patch,
        "blind reuse should be clearly worse ({kl_blind:.3e})"
    );
    Ok(())
}
