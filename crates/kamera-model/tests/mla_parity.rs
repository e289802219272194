//! DeepSeek-V2 (MLA + MoE) parity against HF transformers 5.25.0 (torch 2.15.0, CPU, f32) on the
//! tiny seeded random-weight checkpoints of scripts/deepseek_v2_golden.py: logits at every
//! position (mean KL <= 1e-6, same argmax), and per layer the cached latent c_KV and k_rope.
//! Two variants: q_lora + YaRN + greedy routing, and q_proj + plain rope + group-limited routing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use candle_core::{Device, Tensor};
use kamera_model::PrefillOptions;
use kamera_model::mla::MlaModel;

const VARIANTS: [&str; 2] = ["deepseekv2-tiny", "deepseekv2-tiny-noq"];
/// What the README reports: mean KL to HF, and the cached KV's relative error.
const MAX_MEAN_KL: f64 = 1e-6;
const MAX_KV_REL: f32 = 1e-5;

fn dir(variant: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(variant)
}

fn goldens(variant: &str) -> Result<HashMap<String, Tensor>> {
    Ok(candle_core::safetensors::load(
        dir(variant).join("golden.safetensors"),
        &Device::Cpu,
    )?)
}

fn f32s(g: &HashMap<String, Tensor>, k: &str) -> Result<Vec<f32>> {
    Ok(g.get(k)
        .with_context(|| k.to_string())?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

fn ids(g: &HashMap<String, Tensor>) -> Result<Vec<u32>> {
    let v = g.get("input_ids").context("input_ids")?.to_vec1::<i64>()?;
    Ok(v.into_iter().map(|x| x as u32).collect())
}

/// Largest |a - b| relative to the largest |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// KL(p || q) of two logit rows.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

/// (mean KL, positions whose argmax differs) of `ours` against `hf`, both `n x vocab`.
fn compare_logits(ours: &[f32], hf: &[f32], vocab: usize) -> (f64, usize) {
    let rows = hf.len() / vocab;
    let mut total = 0.0;
    let mut diff = 0;
    for (a, b) in ours.chunks(vocab).zip(hf.chunks(vocab)) {
        total += kl(b, a);
        diff += usize::from(argmax(a) != argmax(b));
    }
    (total / rows as f64, diff)
}

#[test]
fn logits_latent_and_k_rope_match_hf() -> Result<()> {
    for variant in VARIANTS {
        let model = MlaModel::load(&dir(variant))?;
        let g = goldens(variant)?;
        let ids = ids(&g)?;
        let opts = PrefillOptions { all_logits: true };
        let out = model.prefill_with(&ids, 0, &model.empty_context(), opts)?;
        let hf = f32s(&g, "logits")?;
        let (mean_kl, diff) = compare_logits(
            out.all_logits.as_deref().context("all logits")?,
            &hf,
            model.config().vocab,
        );
        eprintln!(
            "{variant}: mean KL {mean_kl:.3e} over {} positions, argmax differs at {diff}",
            ids.len()
        );
        assert!(mean_kl <= MAX_MEAN_KL, "{variant}: mean KL {mean_kl:e}");
        assert_eq!(diff, 0, "{variant}: argmax differs at {diff} positions");
        for (l, layer) in out.chunk.layers().iter().enumerate() {
            let lat = rel_err(&layer.v.to_f32_vec(), &f32s(&g, &format!("layer{l}.latent"))?);
            let kr = rel_err(&layer.k.to_f32_vec(), &f32s(&g, &format!("layer{l}.k_rope"))?);
            eprintln!("{variant} layer {l}: latent rel err {lat:.2e}, k_rope rel err {kr:.2e}");
            assert!(
                lat <= MAX_KV_REL && kr <= MAX_KV_REL,
                "{variant} layer {l}: {lat:e} {kr:e}"
            );
        }
    }
    Ok(())
}

/// A chunk prefilled after a context of cached MLA KV gives HF's logits and KV for its tokens.
#[test]
fn chunked_prefill_after_a_context_matches_hf() -> Result<()> {
    for variant in VARIANTS {
        let model = MlaModel::load(&dir(variant))?;
        let g = goldens(variant)?;
        let ids = ids(&g)?;
        let vocab = model.config().vocab;
        let split = 10;
        let first = model.prefill(&ids[..split], 0, &model.empty_context())?;
        let mut ctx = model.empty_context();
        ctx.push(&first.chunk)?;
        let opts = PrefillOptions { all_logits: true };
        let rest = model.prefill_with(&ids[split..], split as i64, &ctx, opts)?;
        let hf = f32s(&g, "logits")?;
        let (mean_kl, diff) = compare_logits(
            rest.all_logits.as_deref().context("all logits")?,
            &hf[split * vocab..],
            vocab,
        );
        eprintln!("{variant}: chunk after context: mean KL {mean_kl:.3e}, argmax differs at {diff}");
        assert!(mean_kl <= MAX_MEAN_KL && diff == 0, "{variant}: {mean_kl:e}, {diff}");
        let lat = model.config().kv_lora_rank;
        for (l, layer) in rest.chunk.layers().iter().enumerate() {
            let want = f32s(&g, &format!("layer{l}.latent"))?;
            assert!(rel_err(&layer.v.to_f32_vec(), &want[split * lat..]) <= MAX_KV_REL);
        }
    }
    Ok(())
}

/// Decoding token by token into a context (`extend`) gives the one-shot prefill's logits.
#[test]
fn extend_token_by_token_matches_hf() -> Result<()> {
    let variant = VARIANTS[0];
    let model = MlaModel::load(&dir(variant))?;
    let g = goldens(variant)?;
    let ids = ids(&g)?;
    let vocab = model.config().vocab;
    let hf = f32s(&g, "logits")?;
    let mut ctx = model.empty_context();
    let mut worst = 0f64;
    for (i, &id) in ids.iter().enumerate() {
        let out = model.extend(&[id], &mut ctx)?;
        let want = &hf[i * vocab..(i + 1) * vocab];
        worst = worst.max(kl(want, &out.logits));
        assert_eq!(argmax(&out.logits), argmax(want), "position {i}");
    }
    assert_eq!(ctx.len(), ids.len());
    eprintln!("{variant}: extend token by token: worst KL {worst:.2e}");
    assert!(worst <= MAX_MEAN_KL, "{worst:e}");
    Ok(())
}

/// `dir(variant)`'s checkpoint with its config.json passed through `edit`, in a temp directory.
fn edited(variant: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Result<tempfile::TempDir> {
    let tmp = tempfile::tempdir()?;
    let src = dir(variant);
    std::fs::copy(src.join("model.safetensors"), tmp.path().join("model.safetensors"))?;
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json"))?)?;
    edit(&mut cfg);
    std::fs::write(tmp.path().join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    Ok(tmp)
}

/// The released checkpoints' layout (`rope_theta` + `rope_scaling` {type: yarn}, `moe_layer_freq`,
/// `scoring_func`) loads to the same logits bit for bit; unsupported settings are errors.
#[test]
fn released_config_layout_loads_the_same_and_unsupported_settings_fail() -> Result<()> {
    let variant = VARIANTS[0];
    let ids = ids(&goldens(variant)?)?;
    let logits = |m: &MlaModel| -> Result<Vec<f32>> { Ok(m.prefill(&ids, 0, &m.empty_context())?.logits) };
    let want = logits(&MlaModel::load(&dir(variant))?)?;
    let released = edited(variant, |c| {
        let mut rope = c["rope_parameters"].take();
        c.as_object_mut().map(|o| o.remove("rope_parameters"));
        c["rope_theta"] = rope["rope_theta"].take();
        rope.as_object_mut().map(|o| o.remove("rope_theta"));
        rope.as_object_mut().map(|o| o.remove("rope_type"));
        rope["type"] = "yarn".into();
        c["rope_scaling"] = rope;
        c["moe_layer_freq"] = 1.into();
        c["scoring_func"] = "softmax".into();
    })?;
    let got = logits(&MlaModel::load(released.path())?)?;
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    let fails = |edit: fn(&mut serde_json::Value), needle: &str| -> Result<()> {
        let d = edited(variant, edit)?;
        let err = MlaModel::load(d.path()).expect_err(needle).to_string();
        assert!(err.contains(needle), "{err}");
        Ok(())
    };
    fails(|c| c["scoring_func"] = "sigmoid".into(), "scoring_func")?;
    fails(|c| c["topk_method"] = "noaux_tc".into(), "topk_method")?;
    fails(|c| c["rope_parameters"]["rope_type"] = "longrope".into(), "longrope")?;
    fails(|c| c["kv_lora_rank"] = 48.into(), "self_attn.kv_")?;
    Ok(())
}

/// `Model::load` on the directory runs the same runner: MLA layout, YaRN rope, the byte
/// tokenizer, logits bit for bit those of `MlaModel`, `extend` as prefill + push; what needs
/// per-layer GQA weights is an error.
#[test]
fn model_load_runs_the_mla_runner() -> Result<()> {
    use kamera_model::{Model, Selection};
    let variant = VARIANTS[0];
    let model = Model::load(&dir(variant))?;
    let mla = MlaModel::load(&dir(variant))?;
    assert_eq!(model.layout(), mla.layout());
    assert_eq!(model.rope(), mla.rope());
    assert_eq!(model.config().family, kamera_model::Family::DeepseekV2);
    let ids = model.tokenizer().encode_raw("Where is the bicycle?")?;
    assert_eq!(ids, "Where is the bicycle?".bytes().map(u32::from).collect::<Vec<_>>());
    let a = model.prefill(&ids, 0, &model.empty_context())?;
    let b = mla.prefill(&ids, 0, &mla.empty_context())?;
    assert!(a.logits.iter().zip(&b.logits).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_eq!(a.chunk, b.chunk);
    let mut ctx = model.empty_context();
    model.extend(&ids[..5], &mut ctx)?;
    let step = model.extend(&ids[5..], &mut ctx)?;
    assert!(step.logits.iter().zip(&a.logits).all(|(x, y)| (x - y).abs() <= 1e-4));
    assert_eq!(ctx.len(), ids.len());
    let sel = Selection::Tokens(vec![0]);
    let err = model.selective_recompute(&ids, &model.empty_context(), &a.chunk, &sel);
    assert!(err.is_err_and(|e| e.to_string().contains("DeepSeek-V2")));
    assert!(model.weight_bytes().total > 0);
    Ok(())
}
