//! Model weights as dense f32 candle tensors, named as llama.cpp names them in GGUF.

use candle_core::{Device, Tensor};

use crate::config::{Config, Family};
use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// One transformer layer's weights; linear weights are `[out, in]`. Q, K and V (and their biases)
/// are views of one stacked matrix, gate and up of another, so each pair or triple is one product.
#[derive(Debug)]
pub(crate) struct LayerWeights {
    /// `[q_dim + 2·kv_dim, hidden]`: wq, wk, wv stacked (they are views of it).
    pub wqkv: Tensor,
    /// bq, bk, bv stacked, when the family has QKV biases.
    pub bqkv: Option<Tensor>,
    /// `[2·ffn, hidden]`: w_gate then w_up (views of it).
    pub w_gate_up: Tensor,
    pub attn_norm: Tensor,
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    pub bq: Option<Tensor>,
    pub bk: Option<Tensor>,
    pub bv: Option<Tensor>,
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub wo: Tensor,
    pub post_attn_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub w_gate: Tensor,
    pub w_up: Tensor,
    pub w_down: Tensor,
    pub post_ffn_norm: Option<Tensor>,
}

/// All weights of a model.
#[derive(Debug)]
pub(crate) struct Weights {
    /// `[vocab, hidden]`.
    pub embed: Tensor,
    pub layers: Vec<LayerWeights>,
    pub out_norm: Tensor,
    /// `[vocab, hidden]`; `None` when tied to `embed`.
    pub lm_head: Option<Tensor>,
}

impl Weights {
    pub fn load(g: &Gguf, cfg: &Config, dev: &Device) -> Result<Weights> {
        let t = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let x = g.tensor_f32(name, dev)?;
            if x.dims() != shape {
                return Err(Error::Gguf {
                    path: g.path().to_path_buf(),
                    detail: format!("tensor {name}: expected shape {shape:?}, got {:?}", x.dims()),
                });
            }
            Ok(x)
        };
        let opt = |name: &str, shape: &[usize], want: bool| -> Result<Option<Tensor>> {
            if want { t(name, shape).map(Some) } else { Ok(None) }
        };
        let (h, f, hd) = (cfg.hidden, cfg.ffn, cfg.head_dim);
        let (qd, kvd) = (cfg.heads * hd, cfg.kv_dim());
        let gemma = cfg.family == Family::Gemma3;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let stack = |parts: &[&Tensor]| {
            Tensor::cat(parts, 0).map_err(|e| Error::Gguf {
                path: g.path().to_path_buf(),
                detail: format!("stacking weights: {e}"),
            })
        };
        let view = |t: &Tensor, at: usize, len: usize| {
            t.narrow(0, at, len).map_err(|e| Error::Gguf {
                path: g.path().to_path_buf(),
                detail: format!("weight view: {e}"),
            })
        };
        for l in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            let wqkv = stack(&[
                &t(&n("attn_q.weight"), &[qd, h])?,
                &t(&n("attn_k.weight"), &[kvd, h])?,
                &t(&n("attn_v.weight"), &[kvd, h])?,
            ])?;
            let bqkv = match (
                opt(&n("attn_q.bias"), &[qd], cfg.qkv_bias)?,
                opt(&n("attn_k.bias"), &[kvd], cfg.qkv_bias)?,
                opt(&n("attn_v.bias"), &[kvd], cfg.qkv_bias)?,
            ) {
                (Some(q), Some(k), Some(v)) => Some(stack(&[&q, &k, &v])?),
                _ => None,
            };
            let w_gate_up = stack(&[&t(&n("ffn_gate.weight"), &[f, h])?, &t(&n("ffn_up.weight"), &[f, h])?])?;
            layers.push(LayerWeights {
                wq: view(&wqkv, 0, qd)?,
                wk: view(&wqkv, qd, kvd)?,
                wv: view(&wqkv, qd + kvd, kvd)?,
                bq: bqkv.as_ref().map(|b| view(b, 0, qd)).transpose()?,
                bk: bqkv.as_ref().map(|b| view(b, qd, kvd)).transpose()?,
                bv: bqkv.as_ref().map(|b| view(b, qd + kvd, kvd)).transpose()?,
                w_gate: view(&w_gate_up, 0, f)?,
                w_up: view(&w_gate_up, f, f)?,
                wqkv,
                bqkv,
                w_gate_up,
                attn_norm: t(&n("attn_norm.weight"), &[h])?,
                q_norm: opt(&n("attn_q_norm.weight"), &[hd], cfg.qk_norm)?,
                k_norm: opt(&n("attn_k_norm.weight"), &[hd], cfg.qk_norm)?,
                wo: t(&n("attn_output.weight"), &[h, qd])?,
                post_attn_norm: opt(&n("post_attention_norm.weight"), &[h], gemma)?,
                ffn_norm: t(&n("ffn_norm.weight"), &[h])?,
                w_down: t(&n("ffn_down.weight"), &[h, f])?,
                post_ffn_norm: opt(&n("post_ffw_norm.weight"), &[h], gemma)?,
            });
        }
        let embed = t("token_embd.weight", &[cfg.vocab, h])?;
        let lm_head = if g.has_tensor("output.weight") {
            Some(t("output.weight", &[cfg.vocab, h])?)
        } else {
            None
        };
        Ok(Weights {
            embed,
            layers,
            out_norm: t("output_norm.weight", &[h])?,
            lm_head,
        })
    }
}
