//! Model configuration read from GGUF metadata: one struct whose flags select the family
//! differences (QKV bias, QK-norm, sandwich norms, sliding window, embedding scale).

use kamera_ops::{KvLayout, PairLayout, RopeSpec};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// Supported architecture families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Family {
    Llama,
    Qwen2,
    Gemma3,
    /// DeepSeek-V2 (MLA, mixture of experts): run by [`crate::mla::MlaModel`] inside `Model`.
    DeepseekV2,
}

/// MLP activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
}

/// Everything the shared block needs to know about a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub family: Family,
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rms_eps: f64,
    /// RoPE base per layer.
    pub rope_bases: Vec<f64>,
    #[serde(serialize_with = "ser_layout")]
    pub rope_layout: PairLayout,
    /// Sliding-window size on the layers marked local (`local_layers[l]`).
    pub sliding_window: Option<usize>,
    pub local_layers: Vec<bool>,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// Norms after attention and after the MLP (Gemma's sandwich).
    pub post_norms: bool,
    /// Multiply token embeddings by this (Gemma: sqrt(hidden)).
    pub embed_scale: Option<f32>,
    pub activation: Activation,
    /// Softmax scale of attention scores.
    pub attn_scale: f64,
    /// M-RoPE (Qwen2.5-VL): rotary pairs reading the temporal, height and width position ids.
    /// Not serialised when absent, so text models keep their fingerprints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mrope_sections: Option<[usize; 3]>,
    /// MLA (DeepSeek-V2): width of the cached latent c_KV; `head_dim` is then the decoupled
    /// k_rope's and `kv_heads` 1. Not serialised when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mla_latent: Option<usize>,
}

impl Config {
    /// Read the configuration of a supported GGUF.
    // Long: reads and checks every configuration key of the supported architectures.
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let arch = g.str("general.architecture")?.to_string();
        let family = match arch.as_str() {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "gemma3" => Family::Gemma3,
            _ => {
                return Err(Error::UnsupportedArch {
                    path: g.path().to_path_buf(),
                    arch,
                });
            }
        };
        let k = |s: &str| format!("{arch}.{s}");
        let n_layers = g.usize(&k("block_count"))?;
        // Every layer has tensors in the file: a bound on the per-layer tables built below
        // (a fuzzed block_count of 2^40 once allocated until the process was killed).
        let tensors = g.tensor_names().len();
        if n_layers == 0 || n_layers > tensors {
            return Err(Error::Gguf {
                path: g.path().to_path_buf(),
                detail: format!("block_count {n_layers}: expected 1 to {tensors} (the file's tensor count)"),
            });
        }
        let hidden = g.usize(&k("embedding_length"))?;
        let ffn = g.usize(&k("feed_forward_length"))?;
        let heads = g.usize(&k("attention.head_count"))?;
        let kv_heads = if g.has_meta(&k("attention.head_count_kv")) {
            g.usize(&k("attention.head_count_kv"))?
        } else {
            heads
        };
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::Gguf {
                path: g.path().to_path_buf(),
                detail: format!("head_count {heads} is not a multiple of head_count_kv {kv_heads}"),
            });
        }
        let head_dim = if g.has_meta(&k("attention.key_length")) {
            g.usize(&k("attention.key_length"))?
        } else {
            hidden / heads
        };
        let vocab = g.strings("tokenizer.ggml.tokens")?.len();
        let rms_eps = g.f64(&k("attention.layer_norm_rms_epsilon"))?;
        let base = g.f64(&k("rope.freq_base")).unwrap_or(10_000.0);
        if g.has_meta(&k("rope.scaling.type")) || g.has_meta(&k("rope.scaling.factor")) {
            let kind = g.str(&k("rope.scaling.type")).unwrap_or("linear");
            let factor = g.f64(&k("rope.scaling.factor")).unwrap_or(1.0);
            if factor != 1.0 && kind != "none" {
                return Err(Error::Gguf {
                    path: g.path().to_path_buf(),
                    detail: format!("RoPE scaling {kind} x{factor} is not supported yet"),
                });
            }
        }
        if g.has_meta(&k("rope.dimension_count")) && g.usize(&k("rope.dimension_count"))? != head_dim {
            return Err(Error::Gguf {
                path: g.path().to_path_buf(),
                detail: "partial rotary is not supported yet".into(),
            });
        }
        let mut cfg = Config {
            family,
            n_layers,
            hidden,
            ffn,
            heads,
            kv_heads,
            head_dim,
            vocab,
            rms_eps,
            rope_bases: vec![base; n_layers],
            rope_layout: PairLayout::HalfSplit,
            sliding_window: None,
            local_layers: vec![false; n_layers],
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            embed_scale: None,
            activation: Activation::Silu,
            attn_scale: 1.0 / (head_dim as f64).sqrt(),
            mrope_sections: None,
            mla_latent: None,
        };
        match family {
            // llama.cpp's converter permutes llama Q/K so that rotary pairs are interleaved.
            Family::Llama => cfg.rope_layout = PairLayout::Interleaved,
            Family::Qwen2 => cfg.qkv_bias = true,
            Family::Gemma3 => {
                cfg.qk_norm = true;
                cfg.post_norms = true;
                cfg.embed_scale = Some((hidden as f32).sqrt());
                cfg.activation = Activation::GeluTanh;
                cfg.sliding_window = Some(g.usize(&k("attention.sliding_window"))?);
                // Every sixth layer is global (base from metadata); the rest are local, base 1e4.
                for l in 0..n_layers {
                    let local = (l + 1) % 6 != 0;
                    cfg.local_layers[l] = local;
                    if local {
                        cfg.rope_bases[l] = 10_000.0;
                    }
                }
            }
            // Not a GGUF architecture here (the arch match above never yields it).
            Family::DeepseekV2 => {}
        }
        Ok(cfg)
    }

    /// KV layout of the chunks this model produces.
    pub fn kv_layout(&self) -> KvLayout {
        match self.mla_latent {
            Some(latent) => KvLayout::mla(self.n_layers, self.heads, latent, self.head_dim),
            None => KvLayout::gqa(self.n_layers, self.heads, self.kv_heads, self.head_dim),
        }
    }

    /// RoPE of this model (one base per layer). DeepSeek-V2's YaRN scaling is not in `Config`:
    /// its rotation is [`crate::Model::rope`].
    pub fn rope(&self) -> RopeSpec {
        let spec = RopeSpec::new(self.head_dim, self.rope_bases[0], self.rope_layout)
            .with_layer_bases(self.rope_bases.clone());
        match self.mrope_sections {
            Some(s) => spec.with_mrope(s),
            None => spec,
        }
    }

    /// Features of one token's keys (= values) in one layer.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

fn ser_layout<S: serde::Serializer>(l: &PairLayout, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(match l {
        PairLayout::Interleaved => "interleaved",
        PairLayout::HalfSplit => "half_split",
    })
}
