//! DeepSeek-V2's config.json (DeepSeek-V2 paper, arXiv:2405.04434, sections 2.1 and 2.2): MLA
//! ranks and head dims, DeepSeekMoE routing, rotary base and YaRN scaling. Both layouts of the
//! rotary parameters are read: the released checkpoints' `rope_theta` + `rope_scaling` {`type`}
//! and transformers 5.x's `rope_parameters` {`rope_type`, `rope_theta`}. A value that changes the
//! math is an error when missing, never a default, except where HF itself defaults it (YaRN's
//! beta_fast 32, beta_slow 1, truncate, mscale).

use std::path::Path;

use kamera_ops::{KvLayout, PairLayout, RopeScaling, RopeSpec};
use serde_json::Value;

use crate::config::{Activation, Config, Family};
use crate::error::{Error, Result};
use crate::hf::{f64_field, read_json, usize_field};

/// How the router picks each token's experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopK {
    /// The top k softmax scores.
    Greedy,
    /// The top k among the experts of the `topk_group` groups (of `n_group`) whose best expert
    /// scores highest (DeepSeek-V2's device-limited routing).
    GroupLimited { n_group: usize, topk_group: usize },
}

/// The mixture-of-experts layers' shape and routing.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub n_routed: usize,
    pub n_shared: usize,
    pub top_k: usize,
    /// Hidden width of one expert (a shared expert block is `n_shared` times it).
    pub intermediate: usize,
    pub topk: TopK,
    /// Routed weights are renormalised to sum to 1 (original DeepSeek code; else they are
    /// multiplied by `routed_scaling_factor`).
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    /// Layers before this one are dense.
    pub first_k_dense: usize,
    /// Layers `l >= first_k_dense` with `l % layer_freq == 0` are MoE.
    pub layer_freq: usize,
}

/// Everything the DeepSeek-V2 runner needs to know.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaConfig {
    pub n_layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub vocab: usize,
    /// Dense MLP width.
    pub intermediate: usize,
    pub rms_eps: f64,
    /// `None`: queries come from `q_proj` directly.
    pub q_lora_rank: Option<usize>,
    /// Width of the cached latent c_KV.
    pub kv_lora_rank: usize,
    pub qk_nope: usize,
    /// Width of the decoupled rotary key shared by all heads (the cached k_rope).
    pub qk_rope: usize,
    pub v_head: usize,
    pub attention_bias: bool,
    pub tie_embeddings: bool,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// YaRN's attention factor: multiplies the rotated q_pe and k_pe (HF scales cos and sin).
    pub rope_mscale: f64,
    /// Softmax scale of the scores: 1/sqrt(qk_nope + qk_rope), times YaRN's mscale(mscale_all_dim)².
    pub attn_scale: f64,
    pub moe: Option<MoeConfig>,
}

impl MlaConfig {
    /// Reads `config.json` of a DeepSeek-V2 checkpoint.
    pub fn from_file(path: &Path) -> Result<MlaConfig> {
        let v = read_json(path)?;
        let arch = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if arch != "deepseek_v2" {
            return Err(invalid(path, format!("model_type {arch:?} (expected \"deepseek_v2\")")));
        }
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            return Err(invalid(path, format!("hidden_act {act:?} (only silu)")));
        }
        if let Some(f) = v.get("scoring_func").and_then(Value::as_str)
            && f != "softmax"
        {
            return Err(invalid(
                path,
                format!("scoring_func {f:?} (only softmax, DeepSeek-V2's)"),
            ));
        }
        let u = |k: &str| usize_field(&v, k, path);
        let opt_usize = |k: &str| v.get(k).and_then(Value::as_u64).map(|x| x as usize);
        let (qk_nope, qk_rope) = (u("qk_nope_head_dim")?, u("qk_rope_head_dim")?);
        let (rope_theta, rope_scaling, rope_mscale, all_dim_mscale) = rope(&v, path)?;
        let n_layers = u("num_hidden_layers")?;
        let cfg = MlaConfig {
            n_layers,
            hidden: u("hidden_size")?,
            heads: u("num_attention_heads")?,
            vocab: u("vocab_size")?,
            intermediate: u("intermediate_size")?,
            rms_eps: f64_field(&[&v], "rms_norm_eps", path)?,
            q_lora_rank: opt_usize("q_lora_rank"),
            kv_lora_rank: u("kv_lora_rank")?,
            qk_nope,
            qk_rope,
            v_head: u("v_head_dim")?,
            attention_bias: v.get("attention_bias").and_then(Value::as_bool).unwrap_or(false),
            tie_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            rope_theta,
            rope_scaling,
            rope_mscale,
            attn_scale: all_dim_mscale * all_dim_mscale / ((qk_nope + qk_rope) as f64).sqrt(),
            moe: moe(&v, path)?,
        };
        if cfg.heads == 0 || cfg.kv_lora_rank == 0 || cfg.qk_rope == 0 || cfg.qk_rope % 2 != 0 || n_layers == 0 {
            return Err(invalid(
                path,
                "heads, layers, kv_lora_rank and an even qk_rope_head_dim must be > 0".into(),
            ));
        }
        Ok(cfg)
    }

    /// Whether layer `l` is a mixture of experts.
    pub fn is_moe(&self, l: usize) -> bool {
        // The original code's rule (transformers 5.25 reads only first_k_dense_replace, the same
        // for every released config: moe_layer_freq 1).
        self.moe
            .as_ref()
            .is_some_and(|m| m.n_routed > 0 && l >= m.first_k_dense && l % m.layer_freq.max(1) == 0)
    }

    /// Width of one head's query and key: the position-free part and the rotary part.
    pub fn qk_head(&self) -> usize {
        self.qk_nope + self.qk_rope
    }

    /// The cache layout: per token and layer, k_rope (K channel) and the latent c_KV (V channel).
    pub fn kv_layout(&self) -> KvLayout {
        KvLayout::mla(self.n_layers, self.heads, self.kv_lora_rank, self.qk_rope)
    }

    /// The rotation of q_pe and k_pe: interleaved pairs (2i, 2i+1), as transformers' DeepSeek-V2
    /// rotates them (complex multiplication) and keeps them in its cache.
    pub fn rope(&self) -> RopeSpec {
        RopeSpec::new(self.qk_rope, self.rope_theta, PairLayout::Interleaved).with_scaling(self.rope_scaling.clone())
    }
}

impl MlaConfig {
    /// The shared [`Config`] of a `Model` that runs this one: the rotary part as its head
    /// (`head_dim` = qk_rope, one KV head) and the latent in `mla_latent`, so its KV layout is
    /// MLA's. What only MLA has (ranks, experts, YaRN) stays here.
    pub(crate) fn text_config(&self) -> Config {
        Config {
            family: Family::DeepseekV2,
            n_layers: self.n_layers,
            hidden: self.hidden,
            ffn: self.intermediate,
            heads: self.heads,
            kv_heads: 1,
            head_dim: self.qk_rope,
            vocab: self.vocab,
            rms_eps: self.rms_eps,
            rope_bases: vec![self.rope_theta; self.n_layers],
            rope_layout: PairLayout::Interleaved,
            sliding_window: None,
            local_layers: vec![false; self.n_layers],
            qkv_bias: self.attention_bias,
            qk_norm: false,
            post_norms: false,
            embed_scale: None,
            activation: Activation::Silu,
            attn_scale: self.attn_scale,
            mrope_sections: None,
            mla_latent: Some(self.kv_lora_rank),
        }
    }
}

fn invalid(path: &Path, detail: String) -> Error {
    Error::Invalid {
        op: "MlaConfig::from_file",
        detail: format!("{}: {detail}", path.display()),
    }
}

/// YaRN's magnitude scale, `0.1 · m · ln(factor) + 1` (1 when factor <= 1).
fn yarn_mscale(factor: f64, m: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * m * factor.ln() + 1.0
    }
}

/// (theta, scaling, the cos/sin attention factor, the softmax scale's mscale) from either layout.
fn rope(v: &Value, path: &Path) -> Result<(f64, RopeScaling, f64, f64)> {
    let params = v.get("rope_parameters").filter(|p| p.is_object());
    let scaling = params.or_else(|| v.get("rope_scaling").filter(|p| p.is_object()));
    let theta = match params {
        Some(p) => f64_field(&[p, v], "rope_theta", path)?,
        None => f64_field(&[v], "rope_theta", path)?,
    };
    let Some(s) = scaling else {
        return Ok((theta, RopeScaling::None, 1.0, 1.0));
    };
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => return Ok((theta, RopeScaling::None, 1.0, 1.0)),
        "yarn" => {}
        other => {
            return Err(invalid(
                path,
                format!("rope scaling {other:?} (supported: default, yarn)"),
            ));
        }
    }
    let get = |k: &str| s.get(k).and_then(Value::as_f64);
    let factor = f64_field(&[s], "factor", path)?;
    let orig = f64_field(&[s], "original_max_position_embeddings", path)?;
    let (mscale, all_dim) = (get("mscale").unwrap_or(0.0), get("mscale_all_dim").unwrap_or(0.0));
    // HF `_compute_yarn_parameters`: the explicit factor, else the mscale ratio, else mscale(1).
    let attention = get("attention_factor").unwrap_or(if mscale != 0.0 && all_dim != 0.0 {
        yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim)
    } else {
        yarn_mscale(factor, 1.0)
    });
    // HF `yarn_apply_mscale`: the softmax scale also takes mscale(mscale_all_dim)², when set.
    let softmax = if all_dim != 0.0 {
        yarn_mscale(factor, all_dim)
    } else {
        1.0
    };
    let scaling = RopeScaling::Yarn {
        factor,
        original_max_position: orig,
        beta_fast: get("beta_fast").filter(|b| *b != 0.0).unwrap_or(32.0),
        beta_slow: get("beta_slow").filter(|b| *b != 0.0).unwrap_or(1.0),
        truncate: s.get("truncate").and_then(Value::as_bool).unwrap_or(true),
    };
    Ok((theta, scaling, attention, softmax))
}

fn moe(v: &Value, path: &Path) -> Result<Option<MoeConfig>> {
    let n_routed = v.get("n_routed_experts").and_then(Value::as_u64).unwrap_or(0) as usize;
    if n_routed == 0 {
        return Ok(None);
    }
    let u = |k: &str| usize_field(v, k, path);
    let topk = match v.get("topk_method").and_then(Value::as_str).unwrap_or("greedy") {
        "greedy" => TopK::Greedy,
        "group_limited_greedy" => TopK::GroupLimited {
            n_group: u("n_group")?,
            topk_group: u("topk_group")?,
        },
        other => {
            return Err(invalid(
                path,
                format!("topk_method {other:?} (greedy, group_limited_greedy)"),
            ));
        }
    };
    if let TopK::GroupLimited { n_group, topk_group } = topk
        && (n_group == 0 || n_routed % n_group != 0 || topk_group == 0 || topk_group > n_group)
    {
        return Err(invalid(
            path,
            format!("{n_routed} experts in {n_group} groups, top {topk_group} groups"),
        ));
    }
    let top_k = u("num_experts_per_tok")?;
    if top_k == 0 || top_k > n_routed {
        return Err(invalid(
            path,
            format!("num_experts_per_tok {top_k} of {n_routed} experts"),
        ));
    }
    Ok(Some(MoeConfig {
        n_routed,
        n_shared: v.get("n_shared_experts").and_then(Value::as_u64).unwrap_or(0) as usize,
        top_k,
        intermediate: u("moe_intermediate_size")?,
        topk,
        norm_topk_prob: v.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(false),
        routed_scaling_factor: f64_field(&[v], "routed_scaling_factor", path).unwrap_or(1.0),
        first_k_dense: v.get("first_k_dense_replace").and_then(Value::as_u64).unwrap_or(0) as usize,
        layer_freq: v.get("moe_layer_freq").and_then(Value::as_u64).unwrap_or(1) as usize,
    }))
}
