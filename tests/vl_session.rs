//! Screenshots as image chunks in the Session (tiny random Qwen2.5-VL, a real sled store on
//! disk, no browser): each image runs through the vision tower once, its chunk spans its largest
//! grid side + 2 positions, evicted images come back from the store relocated (never encoded
//! again), and the live context always tiles the window: after every step, a question appended
//! to it gives the logits of one prefill of the same window at HF's 3-D positions.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use kamera_agent::{Session, SessionConfig};
use kamera_gpu::CpuBackend;
use kamera_model::vision::RgbImage;
use kamera_model::vl::rope_index;
use kamera_model::{Input, Model, PrefillOptions};
use kamera_sched::Visit;
use kamera_store::{SledStore, StoreConfig};

fn golden() -> PathBuf {
    kamera_tests::root().join("crates/kamera-model/tests/golden")
}

fn png(name: &str) -> Result<Vec<u8>> {
    Ok(std::fs::read(golden().join(format!("qwen25vl-golden/{name}.png")))?)
}

/// Logits after `question` on the session's live context, and on one prefill of the window's
/// chunks (text tokens, images spliced in from their PNGs) + the question at HF's positions.
fn compare(s: &mut Session, m: &Model, images_in_window: &[&str], question: &str) -> Result<f32> {
    let images = images_in_window
        .iter()
        .map(|name| Ok(RgbImage::decode_png(&png(name)?)?))
        .collect::<Result<Vec<_>>>()?;
    compare_images(s, m, &images, question)
}

/// [`compare`] over decoded images.
fn compare_images(s: &mut Session, m: &Model, images_in_window: &[RgbImage], question: &str) -> Result<f32> {
    let q = m.tokenizer().encode(question)?;
    let ctx = s.context()?;
    let keep = ctx.len();
    let ours = m.extend(&q, ctx)?.logits;
    ctx.truncate(keep);
    let vision = m.vision().context("vision")?;
    let mut ids = s.window_tokens();
    ids.extend(&q);
    let mut embeds = Vec::new();
    let mut grids = Vec::new();
    for image in images_in_window {
        let (p, out) = vision.encode_image(image, Some(s.config().image_max_pixels))?;
        grids.push(p.grid_thw);
        embeds.push(out.embeds);
    }
    let (pos, _) = rope_index(&ids, vision.tokens().image, &grids, vision.config().merge_size, 0)?;
    let refs: Vec<&[f32]> = embeds.iter().map(Vec::as_slice).collect();
    let x = vision.splice(&ids, m.embed_tokens(&ids)?, &refs)?;
    let full = m
        .prefill_rotary(
            Input::Embeddings { data: &x, n: ids.len() },
            &pos,
            &m.empty_context(),
            PrefillOptions::default(),
        )?
        .logits;
    let scale = full.iter().fold(0f32, |a, x| a.max(x.abs()));
    Ok(full.iter().zip(&ours).fold(0f32, |a, (x, y)| a.max((x - y).abs())) / scale)
}

/// A session over `m` with `cfg` and an in-memory store, the system line pinned.
fn tiny_session(m: &Arc<Model>, cfg: SessionConfig) -> Result<Session> {
    let mut s = Session::new(
        m.clone(),
        Arc::new(kamera_store::MemStore::new()),
        Box::new(CpuBackend),
        cfg,
    );
    s.pin("<|im_start|>system\nYou read web pages.<|im_end|>\n")?;
    Ok(s)
}

#[test]
fn screenshots_are_encoded_once_relocated_and_recalled() -> Result<()> {
    let m = Arc::new(Model::load(&golden().join("qwen25vl-tiny"))?);
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(StoreConfig {
        path: dir.path().join("store"),
        dtype: None,
        ..StoreConfig::default()
    })?;
    let cfg = SessionConfig {
        window_tokens: 34,
        image_max_pixels: 28 * 28 * 16,
        ..SessionConfig::default()
    };
    let mut s = Session::new(m.clone(), Arc::new(store), Box::new(CpuBackend), cfg);
    s.pin("<|im_start|>system\nYou read web pages.<|im_end|>\n")?;
    let q = "<|im_start|>user\nWhere is the order?<|im_end|>\n";

    // img0: 12 merged tokens + 2 markers, span 4 + 2.
    // Each observation is read by the model before the next (as an agent step does): the
    // session holds its plans until a read ([`SessionConfig::lazy`]).
    let a = s.observe_image(&png("img0")?)?;
    s.context()?;
    assert_eq!(a.visit, Some(Visit::New));
    let img0 = a.chunk.context("chunk")?;
    let slot = s.window().slot(&img0).context("img0 in the window")?.clone();
    assert_eq!((slot.n_tokens, slot.span), (14, 6));
    assert_eq!(s.stats().images_encoded, 1);
    let err = compare(&mut s, &m, &["img0"], q)?;
    println!("after img0: logits rel. diff to one prefill {err:.2e}");
    assert!(err < 1e-4, "{err}");

    // img1 (16 tokens) then img2 (14): the budget of 34 evicts img0, img1 moves left.
    s.observe_image(&png("img1")?)?;
    s.context()?;
    let c = s.observe_image(&png("img2")?)?;
    s.context()?;
    assert!(s.window().is_evicted(&img0), "{}", c.plan);
    assert!(
        c.plan.count("relocate") >= 1,
        "img1 is re-rotated, not re-encoded: {}",
        c.plan
    );
    assert_eq!(s.stats().images_encoded, 3);

    // img0 again: recalled from the sled store, relocated, never through the tower again.
    let back = s.observe_image(&png("img0")?)?;
    s.context()?;
    assert_eq!(back.visit, Some(Visit::Recall), "{}", back.plan);
    assert_eq!(
        s.stats().images_encoded,
        3,
        "a recalled screenshot is not encoded again"
    );
    // The same screenshot seen again while resident is a hit that costs nothing.
    let hit = s.observe_image(&png("img0")?)?;
    assert_eq!((hit.visit, hit.prefill_tokens), (Some(Visit::Hit), 0));
    s.settle()?;
    let order: Vec<&str> = s
        .window()
        .slots()
        .iter()
        .skip(1)
        .map(|sl| {
            if sl.chunk == img0 {
                "img0"
            } else if sl.n_tokens == 16 {
                "img1"
            } else {
                "img2"
            }
        })
        .collect();
    let end = s.context()?.rotary_end();
    assert_eq!(end, s.window().end(), "the context ends where the window does");
    let err = compare(&mut s, &m, &order, q)?;
    println!("window {order:?} after the recall: logits rel. diff to one prefill {err:.2e}");
    assert!(err < 1e-5, "{err}");
    Ok(())
}

/// The tower's outputs are kept within `tower_cache_bytes`, least recently used out first: with
/// none kept or room for one image, the walk of the test above (three screenshots, an eviction,
/// a recall, a hit) holds no more than the budget after every step, runs the tower again where an
/// image's output has gone (counted), and ends at the logits of one prefill of its window, as
/// with the default budget (which encodes each image once).
#[test]
fn tower_outputs_stay_within_their_budget_and_are_computed_again_when_gone() -> Result<()> {
    let m = Arc::new(Model::load(&golden().join("qwen25vl-tiny"))?);
    // img1's output: 16 tokens, less the two markers, at the model's width.
    let one = 4 * 14 * m.config().hidden;
    let q = "<|im_start|>user\nWhere is the order?<|im_end|>\n";
    for budget in [0, one, kamera_agent::TOWER_CACHE_BYTES] {
        let cfg = SessionConfig {
            window_tokens: 34,
            image_max_pixels: 28 * 28 * 16,
            tower_cache_bytes: budget,
            ..SessionConfig::default()
        };
        let mut s = tiny_session(&m, cfg)?;
        let mut order = Vec::new();
        for name in ["img0", "img1", "img2", "img0", "img0"] {
            let a = s.observe_image(&png(name)?)?;
            s.context()?;
            s.settle()?;
            assert!(
                s.tower_bytes() <= budget,
                "budget {budget}: {} bytes held",
                s.tower_bytes()
            );
            order.push((a.chunk.context("chunk")?, name));
        }
        let window: Vec<&str> = s
            .window()
            .slots()
            .iter()
            .skip(1)
            .map(|sl| order.iter().find(|(id, _)| *id == sl.chunk).map_or("?", |(_, n)| *n))
            .collect();
        let err = compare(&mut s, &m, &window, q)?;
        let encoded = s.stats().images_encoded;
        println!("budget {budget}: window {window:?}, {encoded} tower runs, logits rel. diff {err:.2e}");
        assert!(err < 1e-5, "budget {budget}: {err}");
        if budget == kamera_agent::TOWER_CACHE_BYTES {
            assert_eq!(encoded, 3, "each image through the tower once");
        } else {
            assert!(
                encoded > 3,
                "budget {budget}: images whose output left run again: {encoded}"
            );
        }
    }
    Ok(())
}

/// A screenshot over the pixel budget, cut into at most four bands: four image chunks in reading
/// order, each encoded once and downscaled to the budget; seen again, every band is a hit; the
/// live context gives the logits of one prefill of the four bands.
#[test]
fn a_screenshot_over_the_budget_becomes_bands_of_image_chunks() -> Result<()> {
    let m = Arc::new(Model::load(&golden().join("qwen25vl-tiny"))?);
    let cfg = SessionConfig {
        window_tokens: 200,
        image_max_pixels: 28 * 28 * 16,
        screenshot_tiles: 4,
        ..SessionConfig::default()
    };
    let mut s = tiny_session(&m, cfg)?;
    // img2 is 400 x 300: 120,000 pixels over a budget of 12,544; four bands of 84 rows (whole
    // 28-pixel rows), the last 48.
    let shot = s.observe_screenshot(&png("img2")?)?;
    assert_eq!(shot.chunks.len(), 4);
    s.context()?;
    assert_eq!(s.stats().images_encoded, 4);
    let placed: Vec<_> = s.window().slots().iter().skip(1).map(|sl| sl.chunk).collect();
    assert_eq!(placed, shot.chunks, "the bands in reading order");
    let img = RgbImage::decode_png(&png("img2")?)?;
    let bands: Vec<RgbImage> = [0..84, 84..168, 168..252, 252..300]
        .into_iter()
        .map(|r| RgbImage::new(400, r.len(), img.data()[r.start * 1200..r.end * 1200].to_vec()))
        .collect::<std::result::Result<_, _>>()?;
    let err = compare_images(
        &mut s,
        &m,
        &bands,
        "<|im_start|>user\nWhat does the page say?<|im_end|>\n",
    )?;
    println!("four bands: logits rel. diff to one prefill {err:.2e}");
    assert!(err < 1e-4, "{err}");
    // The same screenshot again: every band a hit, nothing encoded.
    let again = s.observe_screenshot(&png("img2")?)?;
    assert_eq!(again.chunks, shot.chunks);
    assert_eq!(
        (again.applied.visit, again.applied.prefill_tokens),
        (Some(Visit::Hit), 0)
    );
    s.context()?;
    assert_eq!(s.stats().images_encoded, 4);
    Ok(())
}

/// The no-reuse baseline (`kamera run --no-reuse`) with screenshots: the window decides as with
/// reuse, and every read re-encodes it from scratch, each screenshot through the vision tower
/// again (two reads of two screenshots: four encodings), to the logits of one prefill of the
/// window.
#[test]
fn the_no_reuse_baseline_re_encodes_screenshots_every_read() -> Result<()> {
    let m = Arc::new(Model::load(&golden().join("qwen25vl-tiny"))?);
    let cfg = SessionConfig {
        window_tokens: 64,
        image_max_pixels: 28 * 28 * 16,
        reuse: false,
        ..SessionConfig::default()
    };
    let mut s = tiny_session(&m, cfg)?;
    s.observe_image(&png("img0")?)?;
    s.observe_image(&png("img1")?)?;
    let q = "<|im_start|>user\nWhere is the order?<|im_end|>\n";
    let err = compare(&mut s, &m, &["img0", "img1"], q)?;
    assert!(err < 1e-5, "no-reuse window vs one prefill: {err}");
    assert_eq!(s.stats().images_encoded, 2);
    let err = compare(&mut s, &m, &["img0", "img1"], q)?;
    assert!(err < 1e-5, "{err}");
    assert_eq!(s.stats().images_encoded, 4, "each read encodes every screenshot again");
    // Reencoding for a bench touches neither the counters nor the live context.
    let w = s.reencode_window()?;
    assert_eq!((w.images, s.stats().images_encoded), (2, 4));
    assert_eq!(w.tokens, s.window_tokens().len());
    assert_eq!(w.ctx.rotary_end(), s.window().end());
    Ok(())
}

/// A prompt's rows kept over a window that holds a screenshot come back when the window returns
/// to that layout (their rotary positions start at the screenshot's span's end, where the
/// context ends), and the logits equal one prefill of the window and the prompt.
#[test]
fn prompt_rows_after_a_screenshot_come_back_with_its_layout() -> Result<()> {
    let m = Arc::new(Model::load(&golden().join("qwen25vl-tiny"))?);
    let cfg = SessionConfig {
        window_tokens: 64,
        image_max_pixels: 28 * 28 * 16,
        ..SessionConfig::default()
    };
    let mut s = tiny_session(&m, cfg)?;
    let q = m
        .tokenizer()
        .encode("<|im_start|>user\nWhere is the order?<|im_end|>\n")?;
    s.observe_image(&png("img0")?)?;
    let (first, reused) = s.live()?.prompt(&m, &q)?;
    assert_eq!(reused, 0);
    let img1 = s.observe_image(&png("img1")?)?.chunk.context("img1")?;
    s.live()?.prompt(&m, &q)?;
    s.evict(&img1)?;
    let (back, reused) = s.live()?.prompt(&m, &q)?;
    assert!(
        reused >= q.len() - 1,
        "the rows kept for [prefix, img0] came back: {reused} of {}",
        q.len()
    );
    let diff = common_max_abs(&first.logits, &back.logits);
    assert!(diff < 1e-5, "kept rows give the same logits: {diff}");
    let err = compare(
        &mut s,
        &m,
        &["img0"],
        "<|im_start|>user\nWhere is the order?<|im_end|>\n",
    )?;
    assert!(err < 1e-5, "{err}");
    Ok(())
}

fn common_max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}
