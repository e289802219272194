//! Kamera on image chunks (tiny random Qwen2.5-VL): an image's canonical KV is its prefill alone
//! with all three M-RoPE sections starting at 0; relocating it by δ (every section rotated by δ)
//! equals prefilling it at offset δ in every layer; a full-rank patch restores the KV it has
//! after a text prefix, which the relocated canonical KV alone does not.

use std::path::Path;

use anyhow::{Context as _, Result};
use candle_core::Device;
use kamera_model::vl::{Grid, image_positions, image_span, rope_index};
use kamera_model::{ChunkKv, Context, Input, Model, PrefillOptions, kamera_ops_relocate};
use kamera_ops::{DType, PatchConfig, form_patch, reuse};

fn load() -> Result<(Model, Vec<f32>, Grid)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let m = Model::load(&dir.join("qwen25vl-tiny"))?;
    let g = candle_core::safetensors::load(dir.join("qwen25vl-golden/golden.safetensors"), &Device::Cpu)?;
    let pv = g
        .get("img0.pixel_values")
        .context("pixels")?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let gr = g
        .get("img0.grid_thw")
        .context("grid")?
        .flatten_all()?
        .to_vec1::<i64>()?;
    let grid = [gr[0] as usize, gr[1] as usize, gr[2] as usize];
    let embeds = m.vision().context("vision")?.encode(&pv, grid)?.embeds;
    Ok((m, embeds, grid))
}

/// The image's KV prefilled after `ctx` with its sections starting at `offset`.
fn image_kv(m: &Model, embeds: &[f32], grid: Grid, offset: i64, ctx: &Context) -> Result<ChunkKv> {
    let n = embeds.len() / m.config().hidden;
    let pos = image_positions(grid, 2, offset);
    Ok(m.prefill_rotary(
        Input::Embeddings { data: embeds, n },
        &pos,
        ctx,
        PrefillOptions::default(),
    )?
    .chunk)
}

/// Largest |a - b| over every layer's K and V, relative to the largest |b|.
fn rel_diff(a: &ChunkKv, b: &ChunkKv) -> f32 {
    let (mut num, mut den) = (0f32, 0f32);
    for (la, lb) in a.layers().iter().zip(b.layers()) {
        for (x, y) in [(&la.k, &lb.k), (&la.v, &lb.v)] {
            let (x, y) = (x.to_f32_vec(), y.to_f32_vec());
            num = x.iter().zip(&y).fold(num, |m, (p, q)| m.max((p - q).abs()));
            den = y.iter().fold(den, |m, q| m.max(q.abs()));
        }
    }
    num / den
}

#[test]
fn relocating_an_image_chunk_equals_prefilling_it_there() -> Result<()> {
    let (m, embeds, grid) = load()?;
    let canonical = image_kv(&m, &embeds, grid, 0, &m.empty_context())?;
    assert_eq!(canonical.offset(), 0);
    assert_eq!(canonical.n_tokens(), 12);
    assert_eq!(image_span(grid, 2), 4, "a 3x4 merged image spans 4 positions, not 12");
    for delta in [1, 37, 5000] {
        let moved = kamera_ops_relocate(&canonical, m.rope(), delta)?;
        let direct = image_kv(&m, &embeds, grid, delta, &m.empty_context())?;
        let err = rel_diff(&moved, &direct);
        println!("delta {delta}: relocated vs prefilled there, rel. diff {err:.2e}");
        assert!(err < 2e-5, "delta {delta}: {err}");
        assert!(rel_diff(&canonical, &direct) > 1e-2, "the shift must matter");
    }
    Ok(())
}

#[test]
fn full_rank_patch_restores_the_conditioned_image_kv() -> Result<()> {
    let (m, embeds, grid) = load()?;
    let prefix = m
        .tokenizer()
        .encode("<|im_start|>user\nThe order page:<|vision_start|>")?;
    let (pos, next) = rope_index(&prefix, m.vision().context("vision")?.tokens().image, &[], 2, 0)?;
    let x = m.embed_tokens(&prefix)?;
    let text = m.prefill_rotary(
        Input::Embeddings {
            data: &x,
            n: prefix.len(),
        },
        &pos,
        &m.empty_context(),
        PrefillOptions::default(),
    )?;
    let ctx = Context::from_chunk(&text.chunk)?;
    let conditioned = image_kv(&m, &embeds, grid, next, &ctx)?;
    let canonical = image_kv(&m, &embeds, grid, 0, &m.empty_context())?;
    let patch = form_patch(
        &conditioned,
        &canonical,
        m.rope(),
        &PatchConfig::fixed(usize::MAX, DType::F32),
    )?;
    let patched = reuse(&canonical, Some(&patch), m.rope(), next)?;
    let blind = reuse(&canonical, None, m.rope(), next)?;
    let (e_patch, e_blind) = (rel_diff(&patched, &conditioned), rel_diff(&blind, &conditioned));
    println!("conditioned image KV: full-rank patch rel. diff {e_patch:.2e}, blind {e_blind:.2e}");
    assert!(e_patch < 1e-4, "{e_patch}");
    assert!(e_blind > 1e-2, "{e_blind}");
    Ok(())
}

#[test]
fn text_after_a_pushed_image_resumes_at_its_span() -> Result<()> {
    let (m, embeds, grid) = load()?;
    let vision = m.vision().context("vision")?;
    let tok = |s: &str| m.tokenizer().encode(s);
    let (prefix, suffix) = (
        tok("<|im_start|>user\n<|vision_start|>")?,
        tok("<|vision_end|>What is shown?")?,
    );
    // Reference: one prefill over prefix + image + suffix at HF's 3-D positions.
    let n_img = vision.image_tokens(grid);
    let mut ids = prefix.clone();
    ids.extend(std::iter::repeat_n(vision.tokens().image, n_img));
    ids.extend(&suffix);
    let (pos, _) = rope_index(&ids, vision.tokens().image, &[grid], 2, 0)?;
    let x = vision.splice(&ids, m.embed_tokens(&ids)?, &[&embeds])?;
    let full = m.prefill_rotary(
        Input::Embeddings { data: &x, n: ids.len() },
        &pos,
        &m.empty_context(),
        PrefillOptions::default(),
    )?;
    // Ours: prefix, the image pushed with its span, then the suffix appended in place.
    let mut ctx = m.empty_context();
    m.extend(&prefix, &mut ctx)?;
    let at = ctx.rotary_end();
    let img = image_kv(&m, &embeds, grid, at, &ctx)?;
    ctx.push_spanned(&img, image_span(grid, 2))?;
    assert_eq!(ctx.rotary_end(), at + 4);
    assert_eq!(ctx.len(), prefix.len() + n_img);
    let out = m.extend(&suffix, &mut ctx)?;
    let scale = full.logits.iter().fold(0f32, |a, x| a.max(x.abs()));
    let err = full
        .logits
        .iter()
        .zip(&out.logits)
        .fold(0f32, |a, (x, y)| a.max((x - y).abs()))
        / scale;
    println!("prefix + pushed image + extended suffix vs one prefill: logits rel. diff {err:.2e}");
    assert!(err < 1e-5, "{err}");
    // Truncating back into the image's rows forgets its shift.
    ctx.truncate(prefix.len());
    assert_eq!(ctx.rotary_end(), prefix.len() as i64);
    Ok(())
}
