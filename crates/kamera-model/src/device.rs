//! Hands a loaded model to kamera-gpu's device transformer: its shape and flags (`ModelSpec`)
//! and its weights (dequantized f32 on the host; the device keeps them in bf16).

use kamera_gpu::{DeviceModel, HostLayer, HostWeights, ModelSpec};

use crate::config::Activation;
use crate::error::{CandleCtx, Error, Result};
use crate::model::Model;
use crate::quant::Linear;

fn host(t: &candle_core::Tensor) -> Result<Vec<f32>> {
    t.flatten_all()
        .ctx("Model::host_weights")?
        .to_vec1::<f32>()
        .ctx("Model::host_weights")
}

fn host_opt(t: Option<&candle_core::Tensor>) -> Result<Option<Vec<f32>>> {
    t.map(host).transpose()
}

impl Model {
    /// This model's shape and family flags as the device transformer takes them.
    pub fn device_spec(&self) -> ModelSpec {
        let c = self.config();
        ModelSpec {
            layers: c.n_layers,
            hidden: c.hidden,
            ffn: c.ffn,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            vocab: c.vocab,
            rms_eps: c.rms_eps as f32,
            rope: self.rope().clone(),
            windows: (0..c.n_layers)
                .map(|l| if c.local_layers[l] { c.sliding_window } else { None })
                .collect(),
            qkv_bias: c.qkv_bias,
            qk_norm: c.qk_norm,
            post_norms: c.post_norms,
            embed_scale: c.embed_scale.unwrap_or(1.0),
            gelu: c.activation == Activation::GeluTanh,
            attn_scale: c.attn_scale as f32,
        }
    }

    /// A host copy of every weight (f32), for the device transformer.
    pub fn host_weights(&self) -> Result<HostWeights> {
        self.require_gqa("Model::host_weights")?;
        let w = self.weights();
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(HostLayer {
                    attn_norm: host(&l.attn_norm)?,
                    wq: l.wq.to_f32()?,
                    wk: l.wk.to_f32()?,
                    wv: l.wv.to_f32()?,
                    bias: match (&l.bq, &l.bk, &l.bv) {
                        (Some(q), Some(k), Some(v)) => Some([host(q)?, host(k)?, host(v)?]),
                        _ => None,
                    },
                    qk_norm: match (&l.q_norm, &l.k_norm) {
                        (Some(q), Some(k)) => Some([host(q)?, host(k)?]),
                        _ => None,
                    },
                    wo: l.wo.to_f32()?,
                    post_attn_norm: host_opt(l.post_attn_norm.as_ref())?,
                    ffn_norm: host(&l.ffn_norm)?,
                    w_gate: l.w_gate.to_f32()?,
                    w_up: l.w_up.to_f32()?,
                    w_down: l.w_down.to_f32()?,
                    post_ffn_norm: host_opt(l.post_ffn_norm.as_ref())?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(HostWeights {
            embed: w.embed.to_f32()?,
            layers,
            out_norm: host(&w.out_norm)?,
            lm_head: w.lm_head.as_ref().map(Linear::to_f32).transpose()?,
        })
    }

    /// This model on CUDA device `ordinal` (bf16 weights and KV on the device). A clear error
    /// without the `cuda` feature of kamera-gpu, a driver, NVRTC or cuBLAS.
    pub fn to_device(&self, ordinal: usize) -> Result<DeviceModel> {
        DeviceModel::new(ordinal, self.device_spec(), &self.host_weights()?).map_err(|error| Error::Gpu {
            op: "Model::to_device",
            error,
        })
    }
}
