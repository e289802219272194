//! `kamera models random-vl`: a seeded random-weight Qwen2.5-VL of a given geometry (here the
//! tiny one, with the real vocabulary, window and M-RoPE sections) loads through the same path
//! as a checkpoint a user brings; its tokenizer (from the Qwen2.5 GGUF, fetched) encodes as the
//! GGUF's does; a screenshot-sized image runs through the tower with finite outputs; the same
//! seed writes the same weights.

use anyhow::Result;
use kamera_model::vision::RgbImage;
use kamera_model::vl::{Geometry, write_random_vl};
use kamera_model::{Gguf, Model, ModelName, Tokenizer};

mod common;

#[test]
fn a_random_vl_loads_tokenizes_as_the_gguf_and_encodes_an_image() -> Result<()> {
    let gguf = common::path(ModelName::Qwen25_05b)?;
    let dir = tempfile::tempdir()?;
    let mut calls = 0;
    write_random_vl(Geometry::Tiny, dir.path(), 7, &gguf, &mut |done, total| {
        calls += 1;
        assert!(done <= total);
    })?;
    assert!(calls > 10, "progress after each tensor");
    let readme = std::fs::read_to_string(dir.path().join("README.md"))?;
    assert!(readme.contains("Random weights: cost, not behaviour"), "{readme}");
    let m = Model::load(dir.path())?;
    let c = m.config();
    assert_eq!((c.n_layers, c.hidden, c.vocab), (2, 256, 151_936));
    let v = m.vision().expect("a vision-language model");
    assert_eq!(v.tokens().image, 151_655);

    let theirs = Tokenizer::from_gguf(&Gguf::open(&gguf)?)?;
    for text in [
        "<|im_start|>user\nWhat is the order status of A-1042?<|im_end|>\n",
        "Ünïcödé  tabs\tand 12345 digits, émojis 🙂 and <|vision_start|><|image_pad|><|vision_end|>",
    ] {
        assert_eq!(m.tokenizer().encode(text)?, theirs.encode(text)?, "{text}");
    }

    let (w, h) = (320, 180);
    let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
    let (patches, out) = v.encode_image(&RgbImage::new(w, h, pixels)?, None)?;
    let [_, gh, gw] = patches.grid_thw;
    assert_eq!(out.embeds.len(), (gh * gw / 4) * 256, "merged tokens x the text width");
    assert!(out.embeds.iter().all(|x| x.is_finite()));

    let again = tempfile::tempdir()?;
    write_random_vl(Geometry::Tiny, again.path(), 7, &gguf, &mut |_, _| {})?;
    let shard = "model-00001-of-00001.safetensors";
    assert_eq!(
        std::fs::read(dir.path().join(shard))?,
        std::fs::read(again.path().join(shard))?,
        "the seed decides the weights"
    );
    Ok(())
}
