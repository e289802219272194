//! Model weights, named as llama.cpp names them in GGUF: weight matrices as [`Linear`] (kept in
//! their GGUF quantisation), norms and biases as f32 candle tensors.

use candle_core::{Device, Tensor};

use crate::config::{Config, Family};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::hf::SafeDir;
use crate::quant::Linear;

/// One transformer layer's weights; linear weights are `[out, in]`.
#[derive(Debug)]
pub(crate) struct LayerWeights {
    pub attn_norm: Tensor,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub bq: Option<Tensor>,
    pub bk: Option<Tensor>,
    pub bv: Option<Tensor>,
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub wo: Linear,
    pub post_attn_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub w_gate: Linear,
    pub w_up: Linear,
    pub w_down: Linear,
    pub post_ffn_norm: Option<Tensor>,
}

/// All weights of a model.
#[derive(Debug)]
pub(crate) struct Weights {
    /// `[vocab, hidden]`.
    pub embed: Linear,
    pub layers: Vec<LayerWeights>,
    pub out_norm: Tensor,
    /// `[vocab, hidden]`; `None` when tied to `embed`.
    pub lm_head: Option<Linear>,
}

/// What the weights occupy in memory ([`crate::Model::weight_bytes`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WeightBytes {
    /// All weights, bytes.
    pub total: usize,
    /// Bytes held as quantized codes + scales, per source block type (`"Q4_1"`, ...).
    pub quantized: std::collections::BTreeMap<String, usize>,
    /// Bytes held dense: f32 (norms, biases, matrices of types without a repacking) or bf16.
    pub dense: usize,
}

impl WeightBytes {
    fn add_linear(&mut self, w: &Linear) {
        match w {
            Linear::Quant(q) => *self.quantized.entry(q.source.to_string()).or_default() += q.bytes(),
            Linear::Dense(_) | Linear::Bf16(_) => self.dense += w.bytes(),
        }
        self.total += w.bytes();
    }

    fn add_tensor(&mut self, t: Option<&Tensor>) {
        let b = t.map_or(0, |t| t.elem_count() * 4);
        self.dense += b;
        self.total += b;
    }
}

impl Weights {
    /// Sets the arithmetic of every quantized matrix's long products (and with `dense`, of the
    /// dense ones, converted: see [`Linear::set_precision`]); whether any took it.
    pub fn set_precision(&mut self, p: crate::PrefillPrecision, dense: bool) -> Result<bool> {
        let mut any = self.embed.set_precision(p, dense)?;
        if let Some(h) = &mut self.lm_head {
            any |= h.set_precision(p, dense)?;
        }
        for l in &mut self.layers {
            for w in [
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.w_gate,
                &mut l.w_up,
                &mut l.w_down,
            ] {
                any |= w.set_precision(p, dense)?;
            }
        }
        Ok(any)
    }

    pub fn bytes(&self) -> WeightBytes {
        let mut b = WeightBytes::default();
        b.add_linear(&self.embed);
        if let Some(h) = &self.lm_head {
            b.add_linear(h);
        }
        b.add_tensor(Some(&self.out_norm));
        for l in &self.layers {
            for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                b.add_linear(w);
            }
            for t in [
                Some(&l.attn_norm),
                l.bq.as_ref(),
                l.bk.as_ref(),
                l.bv.as_ref(),
                l.q_norm.as_ref(),
                l.k_norm.as_ref(),
            ] {
                b.add_tensor(t);
            }
            for t in [l.post_attn_norm.as_ref(), Some(&l.ffn_norm), l.post_ffn_norm.as_ref()] {
                b.add_tensor(t);
            }
        }
        b
    }

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
        let lin = |name: &str, rows: usize, cols: usize| g.linear(name, [rows, cols], dev);
        let opt = |name: &str, shape: &[usize], want: bool| -> Result<Option<Tensor>> {
            if want { t(name, shape).map(Some) } else { Ok(None) }
        };
        let (h, f, hd) = (cfg.hidden, cfg.ffn, cfg.head_dim);
        let (qd, kvd) = (cfg.heads * hd, cfg.kv_dim());
        let gemma = cfg.family == Family::Gemma3;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            layers.push(LayerWeights {
                attn_norm: t(&n("attn_norm.weight"), &[h])?,
                wq: lin(&n("attn_q.weight"), qd, h)?,
                wk: lin(&n("attn_k.weight"), kvd, h)?,
                wv: lin(&n("attn_v.weight"), kvd, h)?,
                bq: opt(&n("attn_q.bias"), &[qd], cfg.qkv_bias)?,
                bk: opt(&n("attn_k.bias"), &[kvd], cfg.qkv_bias)?,
                bv: opt(&n("attn_v.bias"), &[kvd], cfg.qkv_bias)?,
                q_norm: opt(&n("attn_q_norm.weight"), &[hd], cfg.qk_norm)?,
                k_norm: opt(&n("attn_k_norm.weight"), &[hd], cfg.qk_norm)?,
                wo: lin(&n("attn_output.weight"), h, qd)?,
                post_attn_norm: opt(&n("post_attention_norm.weight"), &[h], gemma)?,
                ffn_norm: t(&n("ffn_norm.weight"), &[h])?,
                w_gate: lin(&n("ffn_gate.weight"), f, h)?,
                w_up: lin(&n("ffn_up.weight"), f, h)?,
                w_down: lin(&n("ffn_down.weight"), h, f)?,
                post_ffn_norm: opt(&n("post_ffw_norm.weight"), &[h], gemma)?,
            });
        }
        let embed = lin("token_embd.weight", cfg.vocab, h)?;
        let lm_head = if g.has_tensor("output.weight") {
            Some(lin("output.weight", cfg.vocab, h)?)
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

    /// A Qwen2-style text model from Hugging Face safetensors, tensor names under `prefix`
    /// (`model.` in released checkpoints, `model.language_model.` in newer saves), its matrices
    /// held for `precision` one at a time (bf16: never the whole model in f32).
    pub fn from_safetensors(
        st: &SafeDir,
        prefix: &str,
        cfg: &Config,
        tied: bool,
        precision: crate::PrefillPrecision,
    ) -> Result<Weights> {
        let t = |name: &str, shape: &[usize]| st.f32(&format!("{prefix}{name}"), shape);
        let lin = |name: &str, shape: &[usize]| st.linear(&format!("{prefix}{name}"), shape, precision);
        let (h, f, hd) = (cfg.hidden, cfg.ffn, cfg.head_dim);
        let (qd, kvd) = (cfg.heads * hd, cfg.kv_dim());
        let layers = (0..cfg.n_layers)
            .map(|l| {
                let n = |s: &str| format!("layers.{l}.{s}");
                Ok(LayerWeights {
                    attn_norm: t(&n("input_layernorm.weight"), &[h])?,
                    wq: lin(&n("self_attn.q_proj.weight"), &[qd, h])?,
                    wk: lin(&n("self_attn.k_proj.weight"), &[kvd, h])?,
                    wv: lin(&n("self_attn.v_proj.weight"), &[kvd, h])?,
                    bq: Some(t(&n("self_attn.q_proj.bias"), &[qd])?),
                    bk: Some(t(&n("self_attn.k_proj.bias"), &[kvd])?),
                    bv: Some(t(&n("self_attn.v_proj.bias"), &[kvd])?),
                    q_norm: None,
                    k_norm: None,
                    wo: lin(&n("self_attn.o_proj.weight"), &[h, qd])?,
                    post_attn_norm: None,
                    ffn_norm: t(&n("post_attention_layernorm.weight"), &[h])?,
                    w_gate: lin(&n("mlp.gate_proj.weight"), &[f, h])?,
                    w_up: lin(&n("mlp.up_proj.weight"), &[f, h])?,
                    w_down: lin(&n("mlp.down_proj.weight"), &[h, f])?,
                    post_ffn_norm: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if tied {
            None
        } else {
            Some(st.linear("lm_head.weight", &[cfg.vocab, h], precision)?)
        };
        Ok(Weights {
            embed: lin("embed_tokens.weight", &[cfg.vocab, h])?,
            layers,
            out_norm: t("norm.weight", &[h])?,
            lm_head,
        })
    }
}
