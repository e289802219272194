//! Qwen2.5-VL parity against HF transformers 4.57.6 (torch 2.9.1, CPU, f32) on the tiny seeded
//! random-weight checkpoint of scripts/qwen25vl_golden.py: tokenizer ids, vision tower, merged
//! image embeddings, 3-D position ids, logits at every position (mean KL <= 1e-6, same argmax);
//! the bf16 precision against the same goldens. And a second checkpoint saved by transformers
//! 5.25.0 (scripts/qwen25vl_golden_tf5.py: its config layout, `rope_parameters`, another
//! geometry, rotary base 5e5, tied head) against that version's goldens.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use candle_core::{Device, Tensor};
use kamera_model::vl::{Grid, rope_index};
use kamera_model::{Input, Model, PrefillOptions, PrefillPrecision};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// A tiny checkpoint and the goldens HF made from it (directories under tests/golden).
struct Checkpoint {
    model: &'static str,
    goldens: &'static str,
}

/// Saved by transformers 4.57.6 (scripts/qwen25vl_golden.py).
const TF4: Checkpoint = Checkpoint {
    model: "qwen25vl-tiny",
    goldens: "qwen25vl-golden",
};

/// Saved by transformers 5.25.0 (scripts/qwen25vl_golden_tf5.py).
const TF5: Checkpoint = Checkpoint {
    model: "qwen25vl-tiny-tf5",
    goldens: "qwen25vl-golden-tf5",
};

impl Checkpoint {
    fn load(&self) -> Result<Model> {
        Ok(Model::load(&golden_dir().join(self.model))?)
    }
    fn goldens(&self) -> Result<HashMap<String, Tensor>> {
        let file = golden_dir().join(self.goldens).join("golden.safetensors");
        Ok(candle_core::safetensors::load(file, &Device::Cpu)?)
    }
    fn meta(&self) -> Result<serde_json::Value> {
        let text = std::fs::read_to_string(golden_dir().join(self.goldens).join("golden.json"))?;
        Ok(serde_json::from_str(&text)?)
    }
}

fn f32s(g: &HashMap<String, Tensor>, k: &str) -> Result<Vec<f32>> {
    Ok(g.get(k)
        .with_context(|| k.to_string())?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

fn i64s(g: &HashMap<String, Tensor>, k: &str) -> Result<Vec<i64>> {
    Ok(g.get(k)
        .with_context(|| k.to_string())?
        .flatten_all()?
        .to_vec1::<i64>()?)
}

fn grid(g: &HashMap<String, Tensor>, img: &str) -> Result<Grid> {
    let v = i64s(g, &format!("{img}.grid_thw"))?;
    Ok([v[0] as usize, v[1] as usize, v[2] as usize])
}

/// Largest |a - b| relative to the largest |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
}

#[test]
fn tokenizer_matches_hf() -> Result<()> {
    let m = TF4.load()?;
    let meta = TF4.meta()?;
    for case in meta["tokenizer"].as_array().context("tokenizer cases")? {
        let text = case["text"].as_str().context("text")?;
        let want: Vec<u32> = case["ids"]
            .as_array()
            .context("ids")?
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(m.tokenizer().encode(text)?, want, "{text:?}");
        assert_eq!(m.tokenizer().decode(&want, false)?, text, "decode {text:?}");
    }
    Ok(())
}

#[test]
fn vision_tower_matches_hf() -> Result<()> {
    let m = TF4.load()?;
    let vision = m.vision().context("a VLM has a vision tower")?;
    let g = TF4.goldens()?;
    for img in ["img0", "img1", "img2"] {
        let out = vision.encode(&f32s(&g, &format!("{img}.pixel_values"))?, grid(&g, img)?)?;
        let blocks = rel_err(&out.blocks_out, &f32s(&g, &format!("{img}.vision_blocks_out"))?);
        let embeds = rel_err(&out.embeds, &f32s(&g, &format!("{img}.image_embeds"))?);
        println!("{img}: blocks rel err {blocks:.2e}, embeds rel err {embeds:.2e}");
        assert!(blocks < 1e-5 && embeds < 1e-5, "{img}: {blocks} {embeds}");
    }
    Ok(())
}

#[test]
fn logits_and_positions_match_hf() -> Result<()> {
    let (kl, same) = logits_kl_to_hf(&TF4.load()?, &TF4)?;
    assert!(kl <= 1e-6 && same == 1.0, "mean KL {kl}, same argmax at {same}");
    Ok(())
}

/// The checkpoint transformers 5 saved loads (its `rope_parameters` layout, rotary base 5e5,
/// tied head, three vision blocks) and matches that version's goldens: merged image embeddings,
/// 3-D positions and logits at every position.
#[test]
fn a_transformers5_checkpoint_matches_its_goldens() -> Result<()> {
    let m = TF5.load()?;
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        golden_dir().join(TF5.model).join("config.json"),
    )?)?;
    assert!(
        config["text_config"]["rope_parameters"]["rope_theta"].as_f64() == Some(500_000.0)
            && config["text_config"].get("rope_scaling").is_none(),
        "the checkpoint is in transformers 5's layout: {}",
        config["text_config"]
    );
    let vision = m.vision().context("a VLM has a vision tower")?;
    let g = TF5.goldens()?;
    for img in ["img0", "img1", "img2"] {
        let out = vision.encode(&f32s(&g, &format!("{img}.pixel_values"))?, grid(&g, img)?)?;
        let embeds = rel_err(&out.embeds, &f32s(&g, &format!("{img}.image_embeds"))?);
        println!("{img}: embeds rel err {embeds:.2e}");
        assert!(embeds < 1e-5, "{img}: {embeds}");
    }
    let (kl, same) = logits_kl_to_hf(&m, &TF5)?;
    assert!(kl <= 1e-6 && same == 1.0, "mean KL {kl}, same argmax at {same}");
    Ok(())
}

/// The bf16 precision (tower and text matrices held in bf16, products and attention on the bf16
/// tiles) against the same f32 goldens: the rounding costs a little, bounded.
#[test]
fn bf16_tower_and_prefill_stay_close_to_hf() -> Result<()> {
    if !PrefillPrecision::Bf16.available() {
        kamera_ops::testkit::skip(
            "vl_parity::bf16_tower_and_prefill_stay_close_to_hf",
            "this CPU has no AVX512_BF16",
        );
        return Ok(());
    }
    let m = Model::load_with_precision(&golden_dir().join(TF4.model), PrefillPrecision::Bf16)?;
    assert_eq!(m.prefill_precision(), PrefillPrecision::Bf16);
    let f32_bytes = TF4.load()?.weight_bytes().total;
    let bytes = m.weight_bytes().total;
    println!("weights: {bytes} bytes in bf16, {f32_bytes} in f32");
    assert!(
        bytes * 10 < f32_bytes * 6,
        "matrices held in bf16: {bytes} vs {f32_bytes}"
    );
    let vision = m.vision().context("vision")?;
    let g = TF4.goldens()?;
    for img in ["img0", "img1", "img2"] {
        let out = vision.encode(&f32s(&g, &format!("{img}.pixel_values"))?, grid(&g, img)?)?;
        let embeds = rel_err(&out.embeds, &f32s(&g, &format!("{img}.image_embeds"))?);
        println!("{img}: bf16 embeds rel err {embeds:.2e}");
        assert!(embeds < 2e-2, "{img}: {embeds}");
    }
    let (kl, same) = logits_kl_to_hf(&m, &TF4)?;
    assert!(kl <= 1e-4 && same >= 0.95, "bf16: mean KL {kl}, same argmax at {same}");
    Ok(())
}

/// Checks `m`'s 3-D position ids on every prompt of `set`'s goldens against HF's, and returns
/// the largest prompt's mean KL(HF ‖ ours) over its positions and the share of positions whose
/// argmax is HF's (the random model's logits are close to flat, so rounding can flip near ties).
fn logits_kl_to_hf(m: &Model, set: &Checkpoint) -> Result<(f64, f64)> {
    let vision = m.vision().context("vision")?;
    let (g, meta) = (set.goldens()?, set.meta()?);
    let merge = vision.config().merge_size;
    let (mut worst, mut same, mut total) = (0f64, 0usize, 0usize);
    for (name, p) in meta["prompts"].as_object().context("prompts")? {
        let ids: Vec<u32> = i64s(&g, &format!("{name}.input_ids"))?
            .iter()
            .map(|&x| x as u32)
            .collect();
        let images: Vec<String> = p["images"]
            .as_array()
            .context("images")?
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect();
        let grids = images.iter().map(|i| grid(&g, i)).collect::<Result<Vec<_>>>()?;
        let (pos, _) = rope_index(&ids, vision.tokens().image, &grids, merge, 0)?;
        let want_pos = i64s(&g, &format!("{name}.position_ids"))?;
        let n = ids.len();
        for (i, p3) in pos.iter().enumerate() {
            assert_eq!(
                *p3,
                [want_pos[i], want_pos[n + i], want_pos[2 * n + i]],
                "{name}: position ids at {i}"
            );
        }
        let encoded = images
            .iter()
            .zip(&grids)
            .map(|(img, &gr)| {
                vision
                    .encode(&f32s(&g, &format!("{img}.pixel_values"))?, gr)
                    .map_err(Into::into)
            })
            .collect::<Result<Vec<_>>>()?;
        let embeds: Vec<&[f32]> = encoded.iter().map(|o| o.embeds.as_slice()).collect();
        let x = vision.splice(&ids, m.embed_tokens(&ids)?, &embeds)?;
        let out = m.prefill_rotary(
            Input::Embeddings { data: &x, n },
            &pos,
            &m.empty_context(),
            PrefillOptions { all_logits: true },
        )?;
        let ours = out.all_logits.context("all logits")?;
        let want = f32s(&g, &format!("{name}.logits"))?;
        let vocab = m.config().vocab;
        let mut kl = 0.0;
        for i in 0..n {
            let (a, b) = (&ours[i * vocab..(i + 1) * vocab], &want[i * vocab..(i + 1) * vocab]);
            let (la, lb) = (log_softmax(a), log_softmax(b));
            kl += lb.iter().zip(&la).map(|(p, q)| p.exp() * (p - q)).sum::<f64>();
            same += usize::from(argmax(a) == argmax(b));
            total += 1;
        }
        kl /= n as f64;
        let spread = log_softmax(&want[..vocab]).iter().fold(0f64, |m, x| m.max(-x));
        println!(
            "{name} ({}): {n} tokens, mean KL {kl:.2e} (golden row 0 spans {spread:.1} nats)",
            m.prefill_precision()
        );
        worst = worst.max(kl);
    }
    let same = same as f64 / total.max(1) as f64;
    println!("same argmax at {:.1}% of {total} positions", 100.0 * same);
    Ok((worst, same))
}

#[test]
fn png_to_image_embeddings_matches_hf() -> Result<()> {
    let m = TF4.load()?;
    let vision = m.vision().context("vision")?;
    let g = TF4.goldens()?;
    for img in ["img0", "img1", "img2"] {
        let png = std::fs::read(golden_dir().join(TF4.goldens).join(format!("{img}.png")))?;
        let image = kamera_model::vision::RgbImage::decode_png(&png)?;
        let (patches, out) = vision.encode_image(&image, None)?;
        assert_eq!(patches.grid_thw, grid(&g, img)?, "{img}");
        let cheap = vision.preprocess_config().grid(image.height(), image.width())?;
        assert_eq!(cheap, patches.grid_thw, "{img}: the grid without resizing");
        let err = rel_err(&out.embeds, &f32s(&g, &format!("{img}.image_embeds"))?);
        println!("{img}: PNG -> embeddings rel err {err:.2e}");
        assert!(err < 1e-5, "{img}: {err}");
    }
    Ok(())
}
