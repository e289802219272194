//! Qwen2.5-VL's config.json: the Qwen2 text model (fields at the top level, as the released
//! checkpoints have them, or under `text_config`, as newer transformers write), the vision tower,
//! and the vision token ids. Both layouts of the rotary parameters are read: transformers 4.x's
//! `rope_scaling` {`mrope_section`} beside `rope_theta`, and 5.x's `rope_parameters`
//! {`mrope_section`, `rope_theta`, `rope_type`}. A value that changes the math (the rotary base,
//! the norm's epsilon, the sections) is an error when missing, never a default; fields this
//! runner does not read are logged at debug level.

use std::path::Path;

use serde_json::Value;

use crate::config::{Activation, Config, Family};
use crate::error::{Error, Result};
use crate::hf::{f64_field, read_json, usize_field};
use kamera_ops::PairLayout;

/// The vision tower's shape.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct VisionConfig {
    pub depth: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    /// Window attention span in pixels (windows of `window_size / merge_size / patch_size` merged
    /// tokens a side).
    pub window_size: usize,
    /// Blocks with full attention; the others attend within their window.
    pub fullatt_blocks: Vec<usize>,
    /// Width of the merged image tokens (= the text model's hidden size).
    pub out_hidden: usize,
    pub tokens_per_second: usize,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
    /// Values of one flattened patch: channels x temporal x patch x patch.
    pub fn patch_values(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
    /// Merged tokens a side of one attention window.
    pub fn window_tokens(&self) -> usize {
        (self.window_size / self.merge_size / self.patch_size).max(1)
    }
}

/// Token ids that frame and fill an image in the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct VisionTokens {
    pub image: u32,
    pub video: u32,
    pub vision_start: u32,
    pub vision_end: u32,
}

/// A parsed Qwen2.5-VL config.json.
#[derive(Debug, Clone)]
pub struct VlConfig {
    pub text: Config,
    pub vision: VisionConfig,
    pub tokens: VisionTokens,
    pub tie_embeddings: bool,
}

fn invalid(file: &Path, detail: String) -> Error {
    Error::Invalid {
        op: "read config.json",
        detail: format!("{}: {detail}", file.display()),
    }
}

impl VlConfig {
    pub fn from_file(file: &Path) -> Result<VlConfig> {
        let v = read_json(file)?;
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type != "qwen2_5_vl" {
            return Err(invalid(
                file,
                format!("model_type {model_type:?} is not supported (supported: \"qwen2_5_vl\")"),
            ));
        }
        let t = v
            .get("text_config")
            .filter(|t| t.get("hidden_size").is_some())
            .unwrap_or(&v);
        let vis = v
            .get("vision_config")
            .ok_or_else(|| invalid(file, "no \"vision_config\"".into()))?;
        let text = text_config(t, &v, file)?;
        let vision = vision_config(vis, file)?;
        if vision.out_hidden != text.hidden {
            return Err(invalid(
                file,
                format!(
                    "vision out_hidden_size {} != text hidden_size {}",
                    vision.out_hidden, text.hidden
                ),
            ));
        }
        let id = |k: &str| -> Result<u32> { usize_field(&v, k, file).map(|x| x as u32) };
        let tokens = VisionTokens {
            image: id("image_token_id")?,
            video: id("video_token_id")?,
            vision_start: id("vision_start_token_id")?,
            vision_end: id("vision_end_token_id")?,
        };
        if [tokens.image, tokens.video, tokens.vision_start, tokens.vision_end]
            .iter()
            .any(|&x| x as usize >= text.vocab)
        {
            return Err(invalid(
                file,
                format!("vision token ids {tokens:?} outside the vocabulary of {}", text.vocab),
            ));
        }
        let tie = |x: &Value| x.get("tie_word_embeddings").and_then(Value::as_bool);
        let tie_embeddings = tie(t).or_else(|| tie(&v)).unwrap_or(false);
        Ok(VlConfig {
            text,
            vision,
            tokens,
            tie_embeddings,
        })
    }
}

/// The text model of `t` (`text_config`, or the top level `top` of a flat config).
fn text_config(t: &Value, top: &Value, file: &Path) -> Result<Config> {
    let u = |k: &str| usize_field(t, k, file);
    let (hidden, heads, n_layers) = (u("hidden_size")?, u("num_attention_heads")?, u("num_hidden_layers")?);
    let kv_heads = u("num_key_value_heads").unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 || hidden % heads != 0 {
        return Err(invalid(
            file,
            format!("heads {heads} / kv heads {kv_heads} / hidden {hidden} do not divide"),
        ));
    }
    let head_dim = hidden / heads;
    if t.get("hidden_act").and_then(Value::as_str).is_some_and(|a| a != "silu") {
        return Err(invalid(file, "text hidden_act must be \"silu\"".into()));
    }
    if t.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
        return Err(invalid(file, "use_sliding_window = true is not supported".into()));
    }
    let (sections, base) = rope(t, top, file)?;
    let [st, sh, sw] = sections;
    if st + sh + sw != head_dim / 2 {
        return Err(invalid(
            file,
            format!("mrope_section {sections:?} must sum to head_dim / 2 = {}", head_dim / 2),
        ));
    }
    let rms_eps = f64_field(&[t, top], "rms_norm_eps", file)?;
    unread("text_config", t, TEXT_FIELDS);
    Ok(Config {
        family: Family::Qwen2,
        n_layers,
        hidden,
        ffn: u("intermediate_size")?,
        heads,
        kv_heads,
        head_dim,
        vocab: u("vocab_size")?,
        rms_eps,
        rope_bases: vec![base; n_layers],
        rope_layout: PairLayout::HalfSplit,
        sliding_window: None,
        local_layers: vec![false; n_layers],
        qkv_bias: true,
        qk_norm: false,
        post_norms: false,
        embed_scale: None,
        activation: Activation::Silu,
        attn_scale: 1.0 / (head_dim as f64).sqrt(),
        mrope_sections: Some([st, sh, sw]),
        mla_latent: None,
    })
}

fn vision_config(v: &Value, file: &Path) -> Result<VisionConfig> {
    let u = |k: &str| usize_field(v, k, file);
    let act = v.get("hidden_act").and_then(Value::as_str).unwrap_or("silu");
    if act != "silu" {
        return Err(invalid(
            file,
            format!("vision hidden_act {act:?} is not supported (\"silu\")"),
        ));
    }
    let cfg = VisionConfig {
        depth: u("depth")?,
        hidden: u("hidden_size")?,
        intermediate: u("intermediate_size")?,
        heads: u("num_heads")?,
        // transformers writes `in_channels`; the released checkpoints' configs `in_chans`.
        in_channels: u("in_channels").or_else(|_| u("in_chans")).unwrap_or(3),
        patch_size: u("patch_size")?,
        temporal_patch_size: u("temporal_patch_size")?,
        merge_size: u("spatial_merge_size")?,
        window_size: u("window_size")?,
        fullatt_blocks: v
            .get("fullatt_block_indexes")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|x| x.as_u64().map(|x| x as usize)).collect())
            .ok_or_else(|| {
                invalid(
                    file,
                    "vision_config has no \"fullatt_block_indexes\" (which blocks attend fully)".into(),
                )
            })?,
        out_hidden: u("out_hidden_size")?,
        tokens_per_second: u("tokens_per_second").unwrap_or(2),
    };
    if cfg.heads == 0 || cfg.hidden % cfg.heads != 0 || cfg.head_dim() % 4 != 0 || cfg.merge_size == 0 {
        return Err(invalid(
            file,
            format!(
                "vision hidden_size {} / num_heads {} / spatial_merge_size {}: head_dim must be a multiple of 4",
                cfg.hidden, cfg.heads, cfg.merge_size
            ),
        ));
    }
    Ok(cfg)
}

/// The M-RoPE sections and rotary base, from transformers 5's `rope_parameters` or 4.x's
/// `rope_scaling` + `rope_theta` (in `t`, else at the top level): errors name what is missing.
fn rope(t: &Value, top: &Value, file: &Path) -> Result<([usize; 3], f64)> {
    let params = [t, top]
        .iter()
        .find_map(|o| o.get("rope_parameters").or_else(|| o.get("rope_scaling")))
        .filter(|p| p.is_object())
        .ok_or_else(|| {
            invalid(
                file,
                "no \"rope_parameters\" (transformers 5) or \"rope_scaling\" (transformers 4) with \"mrope_section\""
                    .into(),
            )
        })?;
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    if !matches!(kind, "default" | "mrope") {
        return Err(invalid(
            file,
            format!("rope type {kind:?} is not supported (\"default\" or \"mrope\")"),
        ));
    }
    let sections: Vec<usize> = params
        .get("mrope_section")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|x| x.as_u64().map(|x| x as usize)).collect())
        .unwrap_or_default();
    let [st, sh, sw] = sections[..] else {
        return Err(invalid(
            file,
            format!("mrope_section must list three integers, got {sections:?}"),
        ));
    };
    let base = f64_field(&[params, t, top], "rope_theta", file)?;
    if !(base.is_finite() && base > 1.0) {
        return Err(invalid(file, format!("rope_theta {base} must be a finite base > 1")));
    }
    Ok(([st, sh, sw], base))
}

/// Text-model fields this runner reads, or that do not change its math (HF bookkeeping).
const TEXT_FIELDS: &[&str] = &[
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "hidden_act",
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "tie_word_embeddings",
    "architectures",
    "attention_dropout",
    "initializer_range",
    "layer_types",
    "max_position_embeddings",
    "model_type",
    "use_cache",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "text_config",
    "vision_config",
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "vision_token_id",
];

/// Logs (debug) the fields of `obj` this runner neither reads nor knows to be bookkeeping.
fn unread(what: &str, obj: &Value, known: &[&str]) {
    if let Some(o) = obj.as_object() {
        for k in o.keys().filter(|k| !known.contains(&k.as_str())) {
            tracing::debug!(section = what, field = %k, "config field not read by this runner");
        }
    }
}
