//! One DeepSeek-V2 layer (arXiv:2405.04434, eqs. 37-47 for MLA, 20-23 for DeepSeekMoE), as
//! transformers' `DeepseekV2Attention` / `DeepseekV2Moe` compute it:
//!
//! - c_Q = RMSNorm(W_DQ h) (or no compression), [q_nope, q_pe] = W_UQ c_Q per head;
//! - [c_KV, k_pe] = W_DKV h; c_KV = RMSNorm(c_KV) is cached, k_pe rotated (interleaved pairs,
//!   times YaRN's attention factor, shared by all heads) is cached beside it;
//! - [k_nope, v] = W_UKV c_KV per head over every cached token; k = [k_nope, k_pe];
//! - softmax(q·k · scale) v, o_proj; then a dense SwiGLU MLP or the MoE: softmax router, top-k
//!   (greedy or group-limited), routed experts weighted by their score × routed_scaling_factor,
//!   plus the shared experts.
//!
//! The two small RMSNorms (q_a_layernorm, kv_a_layernorm) use eps 1e-6, not rms_norm_eps: HF
//! and the original code construct them without it.

use candle_core::Tensor;
use kamera_ops::RopeSpec;

use super::config::{MlaConfig, MoeConfig, TopK};
use super::weights::{Ffn, MlaLayer, Mlp, Moe, QProj};
use crate::block::{dense_linear, norm};
use crate::error::{CandleCtx, OpsCtx, Result};

const OP: &str = "mla layer";
/// eps of q_a_layernorm and kv_a_layernorm (their constructor's default).
const LORA_NORM_EPS: f64 = 1e-6;

/// The new tokens' outputs of one layer.
pub(crate) struct LayerOut {
    pub x: Tensor,
    /// `[n, qk_rope]`, rotated to the tokens' positions and scaled by YaRN's attention factor.
    pub k_rope: Tensor,
    /// `[n, kv_lora_rank]`, after kv_a_layernorm.
    pub latent: Tensor,
}

/// Rotates `x` (`[n, heads·rope]`) by the tables `cs` and scales it by `mscale`.
fn rotate(spec: &RopeSpec, x: &Tensor, heads: usize, cs: &(Vec<f32>, Vec<f32>), mscale: f64) -> Result<Tensor> {
    let dims = x.dims2().ctx(OP)?;
    let mut v = x.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?;
    spec.apply_cos_sin(&mut v, heads, dims.0, &cs.0, &cs.1)
        .ops("mla rope")?;
    let t = Tensor::from_vec(v, dims, x.device()).ctx(OP)?;
    if mscale == 1.0 { Ok(t) } else { (t * mscale).ctx(OP) }
}

/// Queries `[n, heads, qk_head]` (q_pe rotated), the latent `[n, lat]` and k_rope `[n, rope]`.
fn project(
    cfg: &MlaConfig,
    w: &MlaLayer,
    spec: &RopeSpec,
    h: &Tensor,
    cs: &(Vec<f32>, Vec<f32>),
) -> Result<(Tensor, Tensor, Tensor)> {
    let n = h.dim(0).ctx(OP)?;
    let (heads, nope, rope) = (cfg.heads, cfg.qk_nope, cfg.qk_rope);
    let q = match &w.q {
        QProj::LowRank { a, a_bias, norm: qn, b } => {
            let c = norm(&dense_linear(h, a, a_bias.as_ref())?, qn, LORA_NORM_EPS)?;
            dense_linear(&c, b, None)?
        }
        QProj::Full(q) => dense_linear(h, q, None)?,
    };
    let q = q.reshape((n, heads, nope + rope)).ctx(OP)?;
    let q_pe = q
        .narrow(2, nope, rope)
        .ctx(OP)?
        .contiguous()
        .ctx(OP)?
        .reshape((n, heads * rope))
        .ctx(OP)?;
    let q_pe = rotate(spec, &q_pe, heads, cs, cfg.rope_mscale)?
        .reshape((n, heads, rope))
        .ctx(OP)?;
    let q = Tensor::cat(&[&q.narrow(2, 0, nope).ctx(OP)?, &q_pe], 2).ctx(OP)?;
    let kv = dense_linear(h, &w.kv_a, w.kv_a_bias.as_ref())?;
    let lat = cfg.kv_lora_rank;
    let latent = norm(&kv.narrow(1, 0, lat).ctx(OP)?, &w.kv_a_norm, LORA_NORM_EPS)?;
    let k_pe = kv.narrow(1, lat, rope).ctx(OP)?.contiguous().ctx(OP)?;
    let k_rope = rotate(spec, &k_pe, 1, cs, cfg.rope_mscale)?;
    Ok((q, latent, k_rope))
}

fn swiglu(m: &Mlp, h: &Tensor) -> Result<Tensor> {
    let g = dense_linear(h, &m.gate, None)?.silu().ctx(OP)?;
    let u = dense_linear(h, &m.up, None)?;
    dense_linear(&(g * u).ctx(OP)?, &m.down, None)
}

/// Per token, the chosen experts and their weights.
fn route(m: &MoeConfig, scores: &[f32]) -> Vec<(usize, f32)> {
    let mut s = scores.to_vec();
    if let TopK::GroupLimited { n_group, topk_group } = m.topk {
        let per = s.len() / n_group;
        let best: Vec<f32> = s
            .chunks(per)
            .map(|g| g.iter().copied().fold(f32::MIN, f32::max))
            .collect();
        let mut order: Vec<usize> = (0..n_group).collect();
        order.sort_by(|&a, &b| best[b].total_cmp(&best[a]));
        for &g in &order[topk_group..] {
            s[g * per..(g + 1) * per].iter_mut().for_each(|x| *x = 0.0);
        }
    }
    let mut order: Vec<usize> = (0..s.len()).collect();
    order.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
    let chosen: Vec<(usize, f32)> = order[..m.top_k].iter().map(|&e| (e, s[e])).collect();
    if m.norm_topk_prob && m.top_k > 1 {
        let sum: f32 = chosen.iter().map(|c| c.1).sum::<f32>() + 1e-20;
        chosen.into_iter().map(|(e, w)| (e, w / sum)).collect()
    } else {
        let f = m.routed_scaling_factor as f32;
        chosen.into_iter().map(|(e, w)| (e, w * f)).collect()
    }
}

fn moe(m: &MoeConfig, w: &Moe, h: &Tensor) -> Result<Tensor> {
    let probs = candle_nn::ops::softmax_last_dim(&dense_linear(h, &w.router, None)?).ctx("router")?;
    let probs = probs.to_vec2::<f32>().ctx(OP)?;
    let mut per_expert: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); m.n_routed];
    for (t, p) in probs.iter().enumerate() {
        for (e, wt) in route(m, p) {
            per_expert[e].0.push(t as u32);
            per_expert[e].1.push(wt);
        }
    }
    let mut out = h.zeros_like().ctx(OP)?;
    for (expert, (tokens, weights)) in w.experts.iter().zip(per_expert) {
        if tokens.is_empty() {
            continue;
        }
        let k = tokens.len();
        let idx = Tensor::from_vec(tokens, k, h.device()).ctx(OP)?;
        let wt = Tensor::from_vec(weights, (k, 1), h.device()).ctx(OP)?;
        let y = swiglu(expert, &h.index_select(&idx, 0).ctx(OP)?)?
            .broadcast_mul(&wt)
            .ctx(OP)?;
        out = out.index_add(&idx, &y, 0).ctx(OP)?;
    }
    match &w.shared {
        Some(s) => (out + swiglu(s, h)?).ctx(OP),
        None => Ok(out),
    }
}

/// One layer over `x: [n, hidden]` at `positions` (angle tables `cs`), attending to `past`
/// (k_rope `[t0, rope]`, latent `[t0, lat]`) then the new tokens; keys sit at `k_pos`.
// Many arguments: one layer's inputs: config, weights, RoPE and its tables, states, positions, past KV.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_forward(
    cfg: &MlaConfig,
    w: &MlaLayer,
    spec: &RopeSpec,
    cs: &(Vec<f32>, Vec<f32>),
    x: &Tensor,
    positions: &[i64],
    past: Option<(Tensor, Tensor)>,
    k_pos: &[i64],
) -> Result<LayerOut> {
    let h = norm(x, &w.attn_norm, cfg.rms_eps)?;
    let (q, latent, k_rope) = project(cfg, w, spec, &h, cs)?;
    let (lat_all, rope_all) = match past {
        Some((pk, pl)) => (
            Tensor::cat(&[&pl, &latent], 0).ctx("cat past latent")?,
            Tensor::cat(&[&pk, &k_rope], 0).ctx("cat past k_rope")?,
        ),
        None => (latent.clone(), k_rope.clone()),
    };
    let att = super::attention::attend(cfg, w, &q, &lat_all, &rope_all, positions, k_pos)?;
    let x = (x + dense_linear(&att, &w.o, w.o_bias.as_ref())?).ctx(OP)?;
    let h = norm(&x, &w.ffn_norm, cfg.rms_eps)?;
    let f = match &w.ffn {
        Ffn::Dense(m) => swiglu(m, &h)?,
        Ffn::Moe(e) => moe(cfg.moe.as_ref().expect("a MoE layer has a MoE config"), e, &h)?,
    };
    Ok(LayerOut {
        x: (x + f).ctx(OP)?,
        k_rope,
        latent,
    })
}
