//! Seeded random-weight Qwen2.5-VL checkpoints with the exact geometry of the released Instruct
//! models (the published config values: depths, widths, heads, window 112, full-attention
//! blocks, M-RoPE sections [16, 24, 24], vocabulary 151,936), in the Hugging Face layout a user
//! brings: config.json, bf16 safetensors in shards with an index, tokenizer.json (the Qwen2.5
//! tokenizer, from the GGUF the project fetches), preprocessor_config.json. No registry ships
//! pretrained Qwen2.5-VL weights, so these measure cost at real shapes: **random weights: cost,
//! not behaviour**. Weights are uniform with the standard deviation of HF's initializer (0.02),
//! norms 1, biases 0.

use std::path::Path;

use half::bf16;
use rand::{Rng, SeedableRng};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// The geometries [`write_random_vl`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Geometry {
    /// Qwen2.5-VL-3B-Instruct.
    Qwen25Vl3b,
    /// Qwen2.5-VL-7B-Instruct.
    Qwen25Vl7b,
    /// A tiny model with the real vocabulary and window, for tests (not a released model).
    Tiny,
}

impl std::str::FromStr for Geometry {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Geometry, String> {
        match s {
            "qwen2.5-vl-3b" => Ok(Geometry::Qwen25Vl3b),
            "qwen2.5-vl-7b" => Ok(Geometry::Qwen25Vl7b),
            "tiny" => Ok(Geometry::Tiny),
            _ => Err(format!("{s:?}: expected qwen2.5-vl-3b, qwen2.5-vl-7b or tiny")),
        }
    }
}

/// (hidden, intermediate, layers, heads, kv heads, tied head; vision depth, width, MLP width,
/// heads, full-attention blocks).
struct Shape {
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    tie: bool,
    v_depth: usize,
    v_hidden: usize,
    v_inter: usize,
    v_heads: usize,
    fullatt: Vec<usize>,
}

const VOCAB: usize = 151_936;
const STD: f32 = 0.02;
/// Bytes per shard (the released checkpoints use about 4 GB; smaller shards write sooner).
const SHARD_BYTES: usize = 2 << 30;

fn shape(g: Geometry) -> Shape {
    let vision = |v_depth, fullatt| (v_depth, 1280, 3420, 16, fullatt);
    let (v_depth, v_hidden, v_inter, v_heads, fullatt) = vision(32, vec![7, 15, 23, 31]);
    match g {
        Geometry::Qwen25Vl3b => Shape {
            hidden: 2048,
            inter: 11008,
            layers: 36,
            heads: 16,
            kv_heads: 2,
            tie: true,
            v_depth,
            v_hidden,
            v_inter,
            v_heads,
            fullatt,
        },
        Geometry::Qwen25Vl7b => Shape {
            hidden: 3584,
            inter: 18944,
            layers: 28,
            heads: 28,
            kv_heads: 4,
            tie: false,
            v_depth,
            v_hidden,
            v_inter,
            v_heads,
            fullatt,
        },
        // Head dim 128 as the released models (M-RoPE sections [16, 24, 24] need it).
        Geometry::Tiny => Shape {
            hidden: 256,
            inter: 512,
            layers: 2,
            heads: 2,
            kv_heads: 1,
            tie: true,
            v_depth: 2,
            v_hidden: 128,
            v_inter: 256,
            v_heads: 2,
            fullatt: vec![1],
        },
    }
}

/// The tensors of the checkpoint, in write order: (name, shape, fill).
fn tensors(s: &Shape) -> Vec<(String, Vec<usize>, Fill)> {
    let (h, hd) = (s.hidden, s.hidden / s.heads);
    let kv = s.kv_heads * hd;
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![VOCAB, h], Fill::Random)];
    for l in 0..s.layers {
        let p = format!("model.layers.{l}.");
        let mut add = |n: &str, shape: Vec<usize>, f| t.push((format!("{p}{n}"), shape, f));
        add("input_layernorm.weight", vec![h], Fill::One);
        add("post_attention_layernorm.weight", vec![h], Fill::One);
        add("self_attn.q_proj.weight", vec![h, h], Fill::Random);
        add("self_attn.q_proj.bias", vec![h], Fill::Zero);
        add("self_attn.k_proj.weight", vec![kv, h], Fill::Random);
        add("self_attn.k_proj.bias", vec![kv], Fill::Zero);
        add("self_attn.v_proj.weight", vec![kv, h], Fill::Random);
        add("self_attn.v_proj.bias", vec![kv], Fill::Zero);
        add("self_attn.o_proj.weight", vec![h, h], Fill::Random);
        add("mlp.gate_proj.weight", vec![s.inter, h], Fill::Random);
        add("mlp.up_proj.weight", vec![s.inter, h], Fill::Random);
        add("mlp.down_proj.weight", vec![h, s.inter], Fill::Random);
    }
    t.push(("model.norm.weight".into(), vec![h], Fill::One));
    if !s.tie {
        t.push(("lm_head.weight".into(), vec![VOCAB, h], Fill::Random));
    }
    let (vh, vi) = (s.v_hidden, s.v_inter);
    t.push((
        "visual.patch_embed.proj.weight".into(),
        vec![vh, 3, 2, 14, 14],
        Fill::Random,
    ));
    for b in 0..s.v_depth {
        let p = format!("visual.blocks.{b}.");
        let mut add = |n: &str, shape: Vec<usize>, f| t.push((format!("{p}{n}"), shape, f));
        add("norm1.weight", vec![vh], Fill::One);
        add("norm2.weight", vec![vh], Fill::One);
        add("attn.qkv.weight", vec![3 * vh, vh], Fill::Random);
        add("attn.qkv.bias", vec![3 * vh], Fill::Zero);
        add("attn.proj.weight", vec![vh, vh], Fill::Random);
        add("attn.proj.bias", vec![vh], Fill::Zero);
        for m in ["gate_proj", "up_proj"] {
            add(&format!("mlp.{m}.weight"), vec![vi, vh], Fill::Random);
            add(&format!("mlp.{m}.bias"), vec![vi], Fill::Zero);
        }
        add("mlp.down_proj.weight", vec![vh, vi], Fill::Random);
        add("mlp.down_proj.bias", vec![vh], Fill::Zero);
    }
    let merged = vh * 4;
    t.push(("visual.merger.ln_q.weight".into(), vec![vh], Fill::One));
    t.push(("visual.merger.mlp.0.weight".into(), vec![merged, merged], Fill::Random));
    t.push(("visual.merger.mlp.0.bias".into(), vec![merged], Fill::Zero));
    t.push(("visual.merger.mlp.2.weight".into(), vec![h, merged], Fill::Random));
    t.push(("visual.merger.mlp.2.bias".into(), vec![h], Fill::Zero));
    t
}

#[derive(Clone, Copy)]
enum Fill {
    Random,
    One,
    Zero,
}

fn bytes(n: usize, fill: Fill, rng: &mut rand::rngs::StdRng) -> Vec<u8> {
    // Uniform on [-a, a] has standard deviation a / sqrt(3).
    let a = STD * 3f32.sqrt();
    let mut out = Vec::with_capacity(n * 2);
    for _ in 0..n {
        let x = match fill {
            Fill::Random => rng.random_range(-a..a),
            Fill::One => 1.0,
            Fill::Zero => 0.0,
        };
        out.extend_from_slice(&bf16::from_f32(x).to_le_bytes());
    }
    out
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::Invalid {
        op: "random-vl",
        detail: format!("{}: {e}", path.display()),
    }
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap_or_default() + "\n").map_err(io(path))
}

/// Writes a seeded random-weight Qwen2.5-VL of geometry `g` into `dir` (created; files in it
/// are overwritten), its tokenizer taken from the Qwen2.5 GGUF at `tokenizer_gguf`. `progress`
/// is called with (bytes written, bytes in all) after each tensor.
pub fn write_random_vl(
    g: Geometry,
    dir: &Path,
    seed: u64,
    tokenizer_gguf: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let s = shape(g);
    write_json(&dir.join("config.json"), &config(&s))?;
    write_json(&dir.join("preprocessor_config.json"), &preprocessor())?;
    tokenizer(tokenizer_gguf, dir)?;
    let all = tensors(&s);
    let total: usize = all.iter().map(|t| t.1.iter().product::<usize>() * 2).sum();
    let mut shards: Vec<Vec<(String, Vec<usize>, Fill)>> = vec![Vec::new()];
    let mut size = 0;
    for t in all {
        let b = t.1.iter().product::<usize>() * 2;
        if size + b > SHARD_BYTES && !shards.last().is_some_and(Vec::is_empty) {
            shards.push(Vec::new());
            size = 0;
        }
        size += b;
        shards.last_mut().expect("one shard").push(t);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut map = serde_json::Map::new();
    let mut done = 0;
    let n = shards.len();
    for (i, shard) in shards.into_iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = shard
            .into_iter()
            .map(|(name, shape, fill)| {
                let b = bytes(shape.iter().product(), fill, &mut rng);
                done += b.len();
                progress(done, total);
                (name, shape, b)
            })
            .collect();
        let views = data
            .iter()
            .map(|(name, shape, b)| {
                map.insert(name.clone(), Value::String(file.clone()));
                TensorView::new(Dtype::BF16, shape.clone(), b).map(|v| (name.clone(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::Invalid {
                op: "random-vl",
                detail: e.to_string(),
            })?;
        let path = dir.join(&file);
        safetensors::serialize_to_file(views, None, &path).map_err(|e| Error::Invalid {
            op: "random-vl",
            detail: format!("{}: {e}", path.display()),
        })?;
    }
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {"total_size": total}, "weight_map": map}),
    )?;
    std::fs::write(
        dir.join("README.md"),
        format!(
            "# Random weights: cost, not behaviour\n\nA seeded (seed {seed}) random-weight checkpoint with the geometry of {g:?}, written by `kamera models random-vl`. It measures the cost of running a model of this shape; its outputs mean nothing.\n"
        ),
    )
    .map_err(io(dir))
}

fn config(s: &Shape) -> Value {
    json!({
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "torch_dtype": "bfloat16",
        "hidden_size": s.hidden,
        "intermediate_size": s.inter,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": s.tie,
        "vocab_size": VOCAB,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": 151654,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_config": {
            "depth": s.v_depth,
            "hidden_act": "silu",
            "hidden_size": s.v_hidden,
            "intermediate_size": s.v_inter,
            "num_heads": s.v_heads,
            "in_chans": 3,
            "out_hidden_size": s.hidden,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "window_size": 112,
            "fullatt_block_indexes": s.fullatt,
            "tokens_per_second": 2,
            "temporal_patch_size": 2
        }
    })
}

fn preprocessor() -> Value {
    json!({
        "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": 3136, "max_pixels": 12845056,
        "merge_size": 2, "patch_size": 14, "temporal_patch_size": 2,
        "resample": 3, "rescale_factor": 0.00392156862745098
    })
}

/// tokenizer.json and tokenizer_config.json from the Qwen2.5 GGUF's byte-level BPE.
fn tokenizer(gguf: &Path, dir: &Path) -> Result<()> {
    let g = Gguf::open(gguf)?;
    let tokens = g.strings("tokenizer.ggml.tokens")?;
    let types = g.f32s("tokenizer.ggml.token_type")?;
    let merges = g.strings("tokenizer.ggml.merges")?;
    if tokens.len() > VOCAB || types.len() != tokens.len() || !tokens.iter().any(|t| t == "<|vision_start|>") {
        return Err(Error::Invalid {
            op: "random-vl",
            detail: format!("{}: {} tokens, not a Qwen2.5 tokenizer", gguf.display(), tokens.len()),
        });
    }
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, (t, ty)) in tokens.iter().zip(&types).enumerate() {
        match *ty as i32 {
            3 | 4 => added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": *ty as i32 == 3
            })),
            _ => {
                vocab.insert(t.clone(), json!(i));
            }
        }
    }
    let split = crate::bpe::ByteBpe::QWEN2_SPLIT;
    write_json(
        &dir.join("tokenizer.json"),
        &json!({
            "version": "1.0",
            "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
            ]},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "model": {"type": "BPE", "vocab": vocab, "merges": merges, "byte_fallback": false}
        }),
    )?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    )
}
