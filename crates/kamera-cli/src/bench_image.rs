//! `kamera bench reuse` on a vision-language model: a screenshot's image chunk encoded (resize +
//! vision tower + prefill) against relocated + patched from its canonical KV, and the revisit's
//! time to first token (prefix + screenshot + question) against re-encoding it all, one run.

use std::time::Instant;

use anyhow::{Context as _, Result};
use kamera_gpu::median;
use kamera_model::vision::RgbImage;
use kamera_model::{ChunkKv, Context, Input, Model, PrefillOptions};
use kamera_ops::{DType, PatchConfig, form_patch, reuse};
use serde::Serialize;

/// The figures of one run.
#[derive(Debug, Serialize)]
pub struct ImageBench {
    pub image: [usize; 2],
    pub grid: [usize; 3],
    pub image_tokens: usize,
    pub span: i64,
    pub prefix_tokens: usize,
    pub question_tokens: usize,
    pub rank: usize,
    pub preprocess_ms: f64,
    pub tower_ms: f64,
    pub prefill_ms: f64,
    pub relocate_patch_ms: f64,
    /// (preprocess + tower + prefill) / relocate + patch.
    pub reuse_speedup: f64,
    pub revisit_ms: f64,
    pub full_ms: f64,
    pub revisit_speedup: f64,
}

fn timed<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<(f64, T)> {
    let mut times = Vec::with_capacity(reps);
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        last = Some(f()?);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median(times), last.expect("at least one repetition")))
}

/// A deterministic synthetic screenshot: bands of text-like strokes on a light page.
pub(crate) fn screenshot(w: usize, h: usize) -> Result<RgbImage> {
    let mut data = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let ink = (y / 12) % 3 == 0 && ((x * 7 + y * 3) / 5) % 9 < 4 && x % 300 < 260;
            let v = if ink { 40 } else { 245 - ((x + y) % 16) as u8 };
            data.extend([v, v, if y < 60 { 200 } else { v }]);
        }
    }
    Ok(RgbImage::new(w, h, data)?)
}

pub fn run(
    model: &Model,
    size: [usize; 2],
    pixels: usize,
    prefix: usize,
    question: usize,
    rank: usize,
    reps: usize,
) -> Result<ImageBench> {
    let vision = model
        .vision()
        .context("bench reuse on images needs a vision-language model directory")?;
    let image = screenshot(size[0], size[1])?;
    let cfg = vision.preprocess_config().clone().with_max_pixels(pixels);
    let (preprocess_ms, patches) = timed(reps, || Ok(kamera_model::vision::preprocess(&image, &cfg)?))?;
    let grid = patches.grid_thw;
    let (tower_ms, out) = timed(reps, || Ok(vision.encode(&patches.pixel_values, grid)?))?;
    let ids = vision.chunk_tokens(grid);
    let span = vision.chunk_span(grid);
    let rot = |at: i64| vision.chunk_positions(grid, at);
    let x = vision.splice(&ids, model.embed_tokens(&ids)?, &[&out.embeds])?;
    let input = Input::Embeddings { data: &x, n: ids.len() };
    let prefill_at = |at: i64, ctx: &Context| -> Result<ChunkKv> {
        Ok(model
            .prefill_rotary(input, &rot(at), ctx, PrefillOptions::default())?
            .chunk)
    };
    let (prefill_ms, canonical) = timed(reps, || prefill_at(0, &model.empty_context()))?;
    // A text prefix before the screenshot: its conditioned KV there gives the patch.
    let filler = "The order page lists every order with its id, its date and whether it shipped. ";
    let mut prefix_ids = model.tokenizer().encode(&filler.repeat(prefix / 8 + 1))?;
    prefix_ids.truncate(prefix.max(1));
    let mut ctx = model.empty_context();
    model.extend(&prefix_ids, &mut ctx)?;
    let at = ctx.rotary_end();
    let conditioned = prefill_at(at, &ctx)?;
    let patch = form_patch(
        &conditioned,
        &canonical,
        model.rope(),
        &PatchConfig::fixed(rank, DType::F32),
    )?;
    let (relocate_patch_ms, _) = timed(reps, || Ok(reuse(&canonical, Some(&patch), model.rope(), at)?))?;
    let q_ids: Vec<u32> = model
        .tokenizer()
        .encode(&"Which order shipped? ".repeat(question / 4 + 1))?
        .into_iter()
        .take(question.max(1))
        .collect();
    // Revisit: the prefix's rows stay, the screenshot is placed, the question is prefilled.
    let base = ctx.len();
    let (revisit_ms, _) = timed(reps, || {
        ctx.truncate(base);
        let placed = reuse(&canonical, Some(&patch), model.rope(), at)?;
        ctx.push_spanned(&placed, span)?;
        Ok(model.extend(&q_ids, &mut ctx)?)
    })?;
    // Full: preprocess + tower + prefill of the screenshot after the prefix, then the question.
    let (full_ms, _) = timed(reps, || {
        ctx.truncate(base);
        let p = kamera_model::vision::preprocess(&image, &cfg)?;
        let o = vision.encode(&p.pixel_values, grid)?;
        model.extend_image(grid, &o.embeds, &mut ctx)?;
        Ok(model.extend(&q_ids, &mut ctx)?)
    })?;
    let encode = preprocess_ms + tower_ms + prefill_ms;
    Ok(ImageBench {
        image: size,
        grid,
        image_tokens: ids.len(),
        span,
        prefix_tokens: prefix_ids.len(),
        question_tokens: q_ids.len(),
        rank,
        preprocess_ms,
        tower_ms,
        prefill_ms,
        relocate_patch_ms,
        reuse_speedup: encode / relocate_patch_ms,
        revisit_ms,
        full_ms,
        revisit_speedup: full_ms / revisit_ms,
    })
}

impl ImageBench {
    pub fn markdown(&self) -> String {
        format!(
            "| screenshot {}x{} -> grid {:?}: {} image tokens, span {} | ms |\n|---|---:|\n\
             | resize + normalise | {:.2} |\n| vision tower | {:.2} |\n| prefill alone (canonical KV) | {:.2} |\n\
             | **encode total** | **{:.2}** |\n| relocate + rank-{} patch (after a {}-token prefix) | {:.3} |\n\
             | **reuse speedup** | **{:.1}x** |\n| revisit: place + {}-token question | {:.2} |\n\
             | full: encode after the prefix + question | {:.2} |\n| **revisit TTFT speedup** | **{:.1}x** |\n",
            self.image[0],
            self.image[1],
            self.grid,
            self.image_tokens,
            self.span,
            self.preprocess_ms,
            self.tower_ms,
            self.prefill_ms,
            self.preprocess_ms + self.tower_ms + self.prefill_ms,
            self.rank,
            self.prefix_tokens,
            self.relocate_patch_ms,
            self.reuse_speedup,
            self.question_tokens,
            self.revisit_ms,
            self.full_ms,
            self.revisit_speedup
        )
    }
}
