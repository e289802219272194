//! Qwen2.5-VL image preprocessing against HF transformers 4.57.6 / Pillow 13.0 goldens
//! (scripts/qwen25vl_golden.py): PNG decoding, bicubic resize byte for byte, smart_resize, and
//! pixel values (bit-identical) and grids for the three golden images.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use kamera_model::Error;
use kamera_model::vision::{PreprocessConfig, RgbImage, preprocess, resize_bicubic, smart_resize};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("read {}", path.display()))
}

/// A golden tensor's raw little-endian bytes and shape, checking its dtype.
fn tensor(st: &SafeTensors, name: &str, dtype: Dtype) -> Result<(Vec<u8>, Vec<usize>)> {
    let t = st.tensor(name).with_context(|| format!("golden tensor {name}"))?;
    ensure!(t.dtype() == dtype, "{name}: dtype {:?}, expected {dtype:?}", t.dtype());
    Ok((t.data().to_vec(), t.shape().to_vec()))
}

/// A u8 [h, w, 3] golden as an image.
fn image(st: &SafeTensors, name: &str) -> Result<RgbImage> {
    let (data, shape) = tensor(st, name, Dtype::U8)?;
    ensure!(shape.len() == 3 && shape[2] == 3, "{name}: shape {shape:?}");
    Ok(RgbImage::new(shape[1], shape[0], data)?)
}

fn first_diff(ours: &RgbImage, theirs: &RgbImage) -> Option<(usize, usize)> {
    (0..theirs.height())
        .flat_map(|y| (0..theirs.width()).map(move |x| (x, y)))
        .find(|&(x, y)| ours.pixel(x, y) != theirs.pixel(x, y))
}

fn check_same(what: &str, ours: &RgbImage, theirs: &RgbImage) -> Result<()> {
    ensure!(
        (ours.width(), ours.height()) == (theirs.width(), theirs.height()),
        "{what}: size {}x{}, PIL {}x{}",
        ours.width(),
        ours.height(),
        theirs.width(),
        theirs.height()
    );
    if let Some((x, y)) = first_diff(ours, theirs) {
        bail!(
            "{what}: pixel ({x}, {y}) is {:?}, PIL {:?}",
            ours.pixel(x, y),
            theirs.pixel(x, y)
        );
    }
    Ok(())
}

fn tiny_config() -> Result<PreprocessConfig> {
    Ok(PreprocessConfig::from_file(
        golden().join("qwen25vl-tiny/preprocessor_config.json"),
    )?)
}

#[test]
fn png_decoding_matches_pil_convert_rgb() -> Result<()> {
    let dir = golden().join("qwen25vl-preprocess");
    let bytes = read(&dir.join("preprocess.safetensors"))?;
    let st = SafeTensors::deserialize(&bytes)?;
    let mut n = 0;
    for name in st.names() {
        let Some(kind) = name.strip_prefix("decode.") else {
            continue;
        };
        let ours = RgbImage::decode_png(&read(&dir.join(format!("{kind}.png")))?)?;
        check_same(&format!("decode {kind}.png"), &ours, &image(&st, name)?)?;
        n += 1;
    }
    ensure!(n == 20, "expected 20 PNG kinds, found {n}");
    Ok(())
}

/// `encode_png` gives back every decoded image unchanged through `decode_png` (the Session keeps
/// screenshots so).
#[test]
fn png_encoding_round_trips_every_decoded_image() -> Result<()> {
    let dir = golden().join("qwen25vl-preprocess");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "png") {
            let image = RgbImage::decode_png(&read(&path)?)?;
            let back = RgbImage::decode_png(&image.encode_png()?)?;
            check_same(&format!("{} round trip", path.display()), &back, &image)?;
            n += 1;
        }
    }
    ensure!(n >= 20, "expected the 20 PNG kinds, found {n}");
    Ok(())
}

#[test]
fn bicubic_resize_matches_pil_byte_for_byte() -> Result<()> {
    let dir = golden().join("qwen25vl-preprocess");
    let bytes = read(&dir.join("preprocess.safetensors"))?;
    let st = SafeTensors::deserialize(&bytes)?;
    let cfg = tiny_config()?;
    let mut n = 0;
    for name in st.names() {
        let Some(case) = name.strip_prefix("resize.").and_then(|s| s.strip_suffix(".out")) else {
            continue;
        };
        let want = image(&st, name)?;
        let src = if case.starts_with("img") {
            let src = RgbImage::decode_png(&read(&golden().join(format!("qwen25vl-golden/{case}.png")))?)?;
            // The processor's own size for this image.
            let (h, w) = cfg.resized_size(src.height(), src.width())?;
            ensure!((w, h) == (want.width(), want.height()), "{case}: smart size {w}x{h}");
            src
        } else {
            image(&st, &format!("resize.{case}.src"))?
        };
        let ours = resize_bicubic(&src, want.width(), want.height());
        check_same(&format!("resize {case}"), &ours, &want)?;
        n += 1;
    }
    ensure!(n == 11, "expected 11 resize cases, found {n}");
    Ok(())
}

#[test]
fn pixel_values_and_grids_match_hf() -> Result<()> {
    let bytes = read(&golden().join("qwen25vl-golden/golden.safetensors"))?;
    let st = SafeTensors::deserialize(&bytes)?;
    let cfg = tiny_config()?;
    for name in ["img0", "img1", "img2"] {
        let img = RgbImage::decode_png(&read(&golden().join(format!("qwen25vl-golden/{name}.png")))?)?;
        let ours = preprocess(&img, &cfg)?;
        let (grid, _) = tensor(&st, &format!("{name}.grid_thw"), Dtype::I64)?;
        let grid: Vec<usize> = grid
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as usize)
            .collect();
        ensure!(grid == ours.grid_thw, "{name}: grid {:?}, HF {grid:?}", ours.grid_thw);
        let (pv, shape) = tensor(&st, &format!("{name}.pixel_values"), Dtype::F32)?;
        ensure!(
            shape == [ours.n_patches(), ours.patch_dim],
            "{name}: HF shape {shape:?}"
        );
        let pv: Vec<f32> = pv
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        ensure!(
            pv.len() == ours.pixel_values.len(),
            "{name}: {} values, HF {}",
            ours.pixel_values.len(),
            pv.len()
        );
        let max = pv
            .iter()
            .zip(&ours.pixel_values)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let same = pv
            .iter()
            .zip(&ours.pixel_values)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        eprintln!(
            "{name}: grid {grid:?}, {same}/{} values bit-identical, max |ours - HF| = {max:e}",
            pv.len()
        );
        // The same f64 rescale and f32 normalisation as numpy: bit-identical, not merely close.
        ensure!(
            same == pv.len(),
            "{name}: {} values differ (max {max:e})",
            pv.len() - same
        );
    }
    Ok(())
}

#[derive(Deserialize)]
struct SmartCase {
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
    out: serde_json::Value,
}

#[test]
fn smart_resize_matches_hf() -> Result<()> {
    let path = golden().join("qwen25vl-preprocess/smart_resize.json");
    let cases: Vec<SmartCase> = serde_json::from_slice(&read(&path)?)?;
    let mut errors = 0;
    for c in &cases {
        let ours = smart_resize(c.height, c.width, c.factor, c.min_pixels, c.max_pixels);
        let what = format!(
            "smart_resize({}, {}, {}, {}, {})",
            c.height, c.width, c.factor, c.min_pixels, c.max_pixels
        );
        match (&c.out, ours) {
            (serde_json::Value::Array(hw), Ok((h, w))) => {
                ensure!(
                    hw.len() == 2 && hw[0] == h && hw[1] == w,
                    "{what} = ({h}, {w}), HF {hw:?}"
                )
            }
            (serde_json::Value::String(msg), Err(e)) => {
                // HF's message, e.g. "... smaller than 200, got 201.0": same words, same ratio.
                let ratio = msg.rsplit(' ').next().unwrap_or_default().trim_end_matches(".0");
                let text = e.to_string();
                ensure!(
                    text.contains("aspect ratio must be smaller than 200") && text.contains(ratio),
                    "{what}: error {text:?}, HF {msg:?}"
                );
                errors += 1;
            }
            (want, got) => bail!("{what} = {got:?}, HF {want}"),
        }
    }
    ensure!(
        errors == 2 && cases.len() == 19,
        "{} cases, {errors} errors",
        cases.len()
    );
    for (h, w, f, max) in [(0, 10, 28, 100), (10, 0, 28, 100), (10, 10, 0, 100), (10, 10, 28, 0)] {
        let e = smart_resize(h, w, f, 1, max).expect_err("zero input must fail");
        ensure!(matches!(e, Error::Invalid { op: "smart_resize", .. }), "{e}");
    }
    ensure!(
        smart_resize(10, 10, 28, 0, 100).is_err(),
        "a zero-sized result must be an error"
    );
    Ok(())
}

#[test]
fn bad_png_bytes_are_a_clear_error() -> Result<()> {
    let good = read(&golden().join("qwen25vl-golden/img0.png"))?;
    for (what, bytes) in [
        ("empty", &[][..]),
        ("not a PNG", b"GIF89a not a png at all".as_slice()),
        ("truncated", &good[..good.len() / 2]),
        ("header only", &good[..40]),
    ] {
        match RgbImage::decode_png(bytes) {
            Err(e @ Error::Invalid { op: "decode PNG", .. }) => {
                ensure!(e.to_string().contains("not a valid PNG"), "{what}: {e}")
            }
            other => bail!("{what}: expected a decode error, got {other:?}"),
        }
    }
    let mut corrupt = good.clone();
    corrupt[60] ^= 0xff; // inside IDAT: the CRC no longer matches
    ensure!(RgbImage::decode_png(&corrupt).is_err(), "corrupt IDAT must fail");
    ensure!(RgbImage::new(3, 2, vec![0; 17]).is_err(), "wrong byte count must fail");
    Ok(())
}

#[test]
fn config_reads_hf_json_and_rejects_bad_input() -> Result<()> {
    let cfg = tiny_config()?;
    let want = PreprocessConfig {
        min_pixels: 3136,
        max_pixels: 12544,
        ..PreprocessConfig::default()
    };
    ensure!(cfg == want, "tiny config {cfg:?}");
    ensure!(
        PreprocessConfig::default().max_pixels == 1003520 && cfg.factor() == 28,
        "defaults"
    );

    let parse = |s: &str| serde_json::from_str::<PreprocessConfig>(s);
    ensure!(parse("{}")? == PreprocessConfig::default(), "empty config = defaults");
    let sized = parse(r#"{"size": {"shortest_edge": 100, "longest_edge": 5000}, "image_mean": 0.5}"#)?;
    ensure!(
        (sized.min_pixels, sized.max_pixels, sized.image_mean) == (100, 5000, [0.5; 3]),
        "{sized:?}"
    );
    for bad in [
        r#"{"resample": 2}"#,
        r#"{"image_std": [1, 0, 1]}"#,
        r#"{"image_mean": [0.5, 0.5]}"#,
        r#"{"patch_size": 0}"#,
    ] {
        let e = parse(bad).err().with_context(|| format!("{bad} must be rejected"))?;
        eprintln!("{bad}: {e}");
    }

    let dir = std::env::temp_dir().join(format!("kamera-preprocess-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let bad = dir.join("preprocessor_config.json");
    std::fs::write(&bad, "{\"patch_size\": \"fourteen\"}")?;
    let e = PreprocessConfig::from_file(&bad).expect_err("bad JSON");
    ensure!(
        e.to_string().contains("preprocessor_config.json"),
        "error names the file: {e}"
    );
    let e = PreprocessConfig::from_file(dir.join("missing.json")).expect_err("missing file");
    ensure!(matches!(e, Error::Io { .. }), "{e}");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn pixel_budget_and_unresized_input() -> Result<()> {
    let cfg = tiny_config()?;
    let img = RgbImage::decode_png(&read(&golden().join("qwen25vl-golden/img2.png"))?)?;
    // A screenshot budget of 28*28*4 pixels: 400x300 (w x h) becomes 56x28, two merged tokens.
    let small = preprocess(&img, &cfg.clone().with_max_pixels(28 * 28 * 4))?;
    ensure!(
        small.grid_thw == [1, 2, 4] && small.pixel_values.len() == 8 * 1176,
        "{:?}",
        small.grid_thw
    );

    let no_resize = PreprocessConfig {
        do_resize: false,
        ..cfg.clone()
    };
    let e = preprocess(&img, &no_resize).expect_err("400x300 is not a multiple of 28");
    ensure!(e.to_string().contains("multiples of 28"), "{e}");
    // 56x28 without resizing: values pass straight through rescale and normalisation.
    let flat = RgbImage::new(28, 56, vec![255; 28 * 56 * 3])?;
    let raw = PreprocessConfig {
        do_resize: false,
        do_normalize: false,
        ..cfg
    };
    let out = preprocess(&flat, &raw)?;
    ensure!(
        out.grid_thw == [1, 4, 2] && out.pixel_values.iter().all(|&v| v == 1.0),
        "{:?}",
        out.grid_thw
    );
    Ok(())
}
