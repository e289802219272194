//! DeepSeek-V2 weights from a Hugging Face directory, in f32 whatever they are stored in, under
//! the released checkpoints' names (`model.layers.{l}.self_attn.kv_a_proj_with_mqa.weight`,
//! `mlp.experts.{e}.gate_proj.weight`, ...), which transformers 5.x also writes.

use candle_core::Tensor;

use super::config::MlaConfig;
use crate::error::{CandleCtx, Result};
use crate::hf::SafeDir;

/// How queries are projected.
#[derive(Debug)]
pub(crate) enum QProj {
    /// `q_a_proj` (hidden -> q_lora_rank), its RMSNorm, `q_b_proj` (-> heads · qk_head).
    LowRank {
        a: Tensor,
        a_bias: Option<Tensor>,
        norm: Tensor,
        b: Tensor,
    },
    /// `q_proj` (hidden -> heads · qk_head).
    Full(Tensor),
}

/// A SwiGLU MLP: `down(silu(gate x) · up x)`.
#[derive(Debug)]
pub(crate) struct Mlp {
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

/// A mixture-of-experts MLP: router, routed experts, shared experts (one wide MLP).
#[derive(Debug)]
pub(crate) struct Moe {
    /// `[n_routed, hidden]`.
    pub router: Tensor,
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
}

#[derive(Debug)]
pub(crate) enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

#[derive(Debug)]
pub(crate) struct MlaLayer {
    pub attn_norm: Tensor,
    pub q: QProj,
    /// `[kv_lora_rank + qk_rope, hidden]`: the latent and k_pe of each token.
    pub kv_a: Tensor,
    pub kv_a_bias: Option<Tensor>,
    pub kv_a_norm: Tensor,
    /// `[heads · (qk_nope + v_head), kv_lora_rank]`: per head k_nope then v from the latent.
    pub kv_b: Tensor,
    /// kv_b's k_nope rows per head, `[heads, qk_nope, kv_lora_rank]` (the absorbed form's W_UK).
    pub w_uk: Tensor,
    /// kv_b's v rows per head, transposed: `[heads, kv_lora_rank, v_head]` (W_UVᵀ).
    pub w_uv_t: Tensor,
    pub o: Tensor,
    pub o_bias: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub ffn: Ffn,
}

#[derive(Debug)]
pub(crate) struct MlaWeights {
    pub embed: Tensor,
    pub layers: Vec<MlaLayer>,
    pub out_norm: Tensor,
    pub lm_head: Tensor,
}

fn mlp(st: &SafeDir, p: &str, hidden: usize, inter: usize) -> Result<Mlp> {
    Ok(Mlp {
        gate: st.f32(&format!("{p}.gate_proj.weight"), &[inter, hidden])?,
        up: st.f32(&format!("{p}.up_proj.weight"), &[inter, hidden])?,
        down: st.f32(&format!("{p}.down_proj.weight"), &[hidden, inter])?,
    })
}

impl Mlp {
    fn elem_count(&self) -> usize {
        self.gate.elem_count() + self.up.elem_count() + self.down.elem_count()
    }
}

impl MlaWeights {
    /// Values of every weight as held (kv_b's per-head copies included).
    pub fn elem_count(&self) -> usize {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, Tensor::elem_count);
        let layer = |l: &MlaLayer| {
            let q = match &l.q {
                QProj::LowRank { a, a_bias, norm, b } => {
                    a.elem_count() + opt(a_bias) + norm.elem_count() + b.elem_count()
                }
                QProj::Full(q) => q.elem_count(),
            };
            let ffn = match &l.ffn {
                Ffn::Dense(m) => m.elem_count(),
                Ffn::Moe(m) => {
                    m.router.elem_count()
                        + m.experts.iter().map(Mlp::elem_count).sum::<usize>()
                        + m.shared.as_ref().map_or(0, Mlp::elem_count)
                }
            };
            let t = [
                &l.attn_norm,
                &l.kv_a,
                &l.kv_a_norm,
                &l.kv_b,
                &l.w_uk,
                &l.w_uv_t,
                &l.o,
                &l.ffn_norm,
            ];
            q + ffn + opt(&l.kv_a_bias) + opt(&l.o_bias) + t.iter().map(|t| t.elem_count()).sum::<usize>()
        };
        let head = if self.lm_head.id() == self.embed.id() {
            0
        } else {
            self.lm_head.elem_count()
        };
        self.embed.elem_count() + self.out_norm.elem_count() + head + self.layers.iter().map(layer).sum::<usize>()
    }

    pub fn load(st: &SafeDir, cfg: &MlaConfig) -> Result<MlaWeights> {
        let (h, v) = (cfg.hidden, cfg.vocab);
        let embed = st.f32("model.embed_tokens.weight", &[v, h])?;
        let lm_head = if cfg.tie_embeddings {
            embed.clone()
        } else {
            st.f32("lm_head.weight", &[v, h])?
        };
        let layers = (0..cfg.n_layers).map(|l| layer(st, cfg, l)).collect::<Result<_>>()?;
        Ok(MlaWeights {
            embed,
            layers,
            out_norm: st.f32("model.norm.weight", &[h])?,
            lm_head,
        })
    }
}

fn layer(st: &SafeDir, cfg: &MlaConfig, l: usize) -> Result<MlaLayer> {
    let p = format!("model.layers.{l}");
    let a = format!("{p}.self_attn");
    let h = cfg.hidden;
    let qk = cfg.heads * cfg.qk_head();
    let bias = |name: &str, n: usize| -> Result<Option<Tensor>> {
        if cfg.attention_bias {
            st.f32(&format!("{a}.{name}.bias"), &[n]).map(Some)
        } else {
            Ok(None)
        }
    };
    let q = match cfg.q_lora_rank {
        Some(r) => QProj::LowRank {
            a: st.f32(&format!("{a}.q_a_proj.weight"), &[r, h])?,
            a_bias: bias("q_a_proj", r)?,
            norm: st.f32(&format!("{a}.q_a_layernorm.weight"), &[r])?,
            b: st.f32(&format!("{a}.q_b_proj.weight"), &[qk, r])?,
        },
        None => QProj::Full(st.f32(&format!("{a}.q_proj.weight"), &[qk, h])?),
    };
    let (lat, rope) = (cfg.kv_lora_rank, cfg.qk_rope);
    let ffn = if cfg.is_moe(l) {
        let m = cfg.moe.as_ref().expect("is_moe implies a MoE config");
        let experts = (0..m.n_routed)
            .map(|e| mlp(st, &format!("{p}.mlp.experts.{e}"), h, m.intermediate))
            .collect::<Result<_>>()?;
        let shared = (m.n_shared > 0)
            .then(|| mlp(st, &format!("{p}.mlp.shared_experts"), h, m.intermediate * m.n_shared))
            .transpose()?;
        Ffn::Moe(Moe {
            router: st.f32(&format!("{p}.mlp.gate.weight"), &[m.n_routed, h])?,
            experts,
            shared,
        })
    } else {
        Ffn::Dense(mlp(st, &format!("{p}.mlp"), h, cfg.intermediate)?)
    };
    let kv_b = st.f32(
        &format!("{a}.kv_b_proj.weight"),
        &[cfg.heads * (cfg.qk_nope + cfg.v_head), lat],
    )?;
    let per_head = kv_b
        .reshape((cfg.heads, cfg.qk_nope + cfg.v_head, lat))
        .ctx("load kv_b")?;
    let w_uk = per_head
        .narrow(1, 0, cfg.qk_nope)
        .and_then(|t| t.contiguous())
        .ctx("load kv_b")?;
    let w_uv_t = per_head
        .narrow(1, cfg.qk_nope, cfg.v_head)
        .and_then(|t| t.transpose(1, 2)?.contiguous())
        .ctx("load kv_b")?;
    Ok(MlaLayer {
        attn_norm: st.f32(&format!("{p}.input_layernorm.weight"), &[h])?,
        q,
        kv_a: st.f32(&format!("{a}.kv_a_proj_with_mqa.weight"), &[lat + rope, h])?,
        kv_a_bias: bias("kv_a_proj_with_mqa", lat + rope)?,
        kv_a_norm: st.f32(&format!("{a}.kv_a_layernorm.weight"), &[lat])?,
        kv_b,
        w_uk,
        w_uv_t,
        o: st.f32(&format!("{a}.o_proj.weight"), &[h, cfg.heads * cfg.v_head])?,
        o_bias: bias("o_proj", h)?,
        ffn_norm: st.f32(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
        ffn,
    })
}
