//! DeepSeek-V2 (multi-head latent attention, DeepSeekMoE; arXiv:2405.04434) from a Hugging Face
//! directory, with its KV held as MLA holds it: per token and layer the normed latent c_KV and
//! the rotated decoupled key k_rope, never expanded K/V. A chunk's KV is a kamera-ops [`ChunkKv`]
//! of [`KvLayout::mla`] (K channel: k_rope, V channel: c_KV), so relocation turns k_rope only and
//! copies the latent byte for byte (KAMERA.md, "Attention families"), and a [`Context`] built
//! from such chunks is what a prefill attends to.
//!
//! ```no_run
//! use kamera_model::mla::MlaModel;
//! let model = MlaModel::load(std::path::Path::new("deepseek-v2-lite"))?;
//! let out = model.prefill(&[1, 2, 3], 0, &model.empty_context())?;
//! println!("next: {}", kamera_model::argmax(&out.logits));
//! # Ok::<(), kamera_model::Error>(())
//! ```

use std::path::Path;

use candle_core::{Device, Tensor};
use kamera_ops::{ChunkKv, KvLayout, LayerKv, RopeSpec};
use sha2::{Digest, Sha256};

mod attention;
mod config;
mod layer;
mod weights;

pub use config::{MlaConfig, MoeConfig, TopK};

use crate::block::{dense_linear, norm};
use crate::context::{Context, tensor_to_mat};
use crate::error::{CandleCtx, Error, OpsCtx, Result};
use crate::hf::SafeDir;
use crate::model::{Input, Prefill, PrefillOptions};
use weights::MlaWeights;

/// Whether `config.json` names a DeepSeek-V2 checkpoint.
pub(crate) fn is_deepseek_v2(config: &Path) -> Result<bool> {
    let v = crate::hf::read_json(config)?;
    Ok(v.get("model_type").and_then(serde_json::Value::as_str) == Some("deepseek_v2"))
}

/// A loaded DeepSeek-V2-architecture model (f32, CPU).
#[derive(Debug)]
pub struct MlaModel {
    cfg: MlaConfig,
    weights: MlaWeights,
    rope: RopeSpec,
    layout: KvLayout,
    fingerprint: String,
}

impl MlaModel {
    /// Loads `config.json` and the safetensors (single file or sharded with an index) of `dir`.
    pub fn load(dir: &Path) -> Result<MlaModel> {
        let cfg = MlaConfig::from_file(&dir.join("config.json"))?;
        let st = SafeDir::open(dir)?;
        let weights = MlaWeights::load(&st, &cfg)?;
        let rope = cfg.rope();
        rope.validate().ops("MlaModel::load rope")?;
        let layout = cfg.kv_layout();
        layout.validate().ops("MlaModel::load layout")?;
        let digest = Sha256::new()
            .chain_update(st.sha256()?)
            .chain_update(format!("{cfg:?}"))
            .finalize();
        let fingerprint = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        tracing::debug!(layers = cfg.n_layers, "loaded DeepSeek-V2 {}", dir.display());
        Ok(MlaModel {
            cfg,
            weights,
            rope,
            layout,
            fingerprint,
        })
    }

    pub fn config(&self) -> &MlaConfig {
        &self.cfg
    }
    /// The MLA layout of every chunk this model produces.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }
    /// The rotation of k_rope (what relocation applies).
    pub fn rope(&self) -> &RopeSpec {
        &self.rope
    }
    /// Hash of the weights and the configuration (hex, 128 bits): the store's key.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
    /// An empty context starting at position 0.
    pub fn empty_context(&self) -> Context {
        Context::empty(self.layout, 0)
    }

    /// Prefill `tokens` at `start_pos..` after `context`; logits at the last position.
    pub fn prefill(&self, tokens: &[u32], start_pos: i64, context: &Context) -> Result<Prefill> {
        self.prefill_with(tokens, start_pos, context, PrefillOptions::default())
    }

    /// Prefill `tokens` at `start_pos..` after `context` (which, when not empty, must end at
    /// `start_pos`); the chunk returned holds the new tokens' k_rope and latent per layer.
    pub fn prefill_with(
        &self,
        tokens: &[u32],
        start_pos: i64,
        context: &Context,
        opts: PrefillOptions,
    ) -> Result<Prefill> {
        crate::team::on_pool(|| self.forward(Input::Tokens(tokens), start_pos, context, opts))
    }

    /// Appends `tokens` to `context` at its next positions (a decode step, a question) and
    /// returns the logits at the last one and the new tokens' KV. On error the context is left
    /// as it was.
    pub fn extend(&self, tokens: &[u32], context: &mut Context) -> Result<Prefill> {
        let out = self.prefill(tokens, context.end(), context)?;
        context.push(&out.chunk)?;
        Ok(out)
    }

    /// The prefill itself, of tokens or ready-made embeddings; its callers run it on a pool
    /// worker ([`crate::team::on_pool`]).
    pub(crate) fn forward(
        &self,
        input: Input<'_>,
        start_pos: i64,
        context: &Context,
        opts: PrefillOptions,
    ) -> Result<Prefill> {
        const OP: &str = "MlaModel::prefill";
        if *context.layout() != self.layout {
            return Err(Error::Shape {
                op: OP,
                detail: format!(
                    "context layout {:?} != model layout {:?}",
                    context.layout(),
                    self.layout
                ),
            });
        }
        if !context.is_empty() && context.end() != start_pos {
            return Err(Error::Invalid {
                op: OP,
                detail: format!("start_pos {start_pos} != context end {}", context.end()),
            });
        }
        let mut x = self.embed(input)?;
        let n = x.dim(0).ctx(OP)?;
        if !(0..=i64::MAX / 4).contains(&start_pos) || n == 0 {
            return Err(Error::Invalid {
                op: OP,
                detail: format!("start_pos {start_pos} out of range or no tokens"),
            });
        }
        let positions: Vec<i64> = (0..n as i64).map(|i| start_pos + i).collect();
        let k_pos: Vec<i64> = (context.offset()..context.end())
            .chain(positions.iter().copied())
            .collect();
        // One angle table for every layer (one base) and for q_pe and k_pe.
        let cs = self.rope.cos_sin(0, &positions).ops(OP)?;
        let mut layers = Vec::with_capacity(self.cfg.n_layers);
        for (l, w) in self.weights.layers.iter().enumerate() {
            let past = match context.layer(l)? {
                Some((k, v)) => Some((k.squeeze(0).ctx(OP)?, v.squeeze(0).ctx(OP)?)),
                None => None,
            };
            let out = layer::layer_forward(&self.cfg, w, &self.rope, &cs, &x, &positions, past, &k_pos)?;
            layers.push(LayerKv {
                k: tensor_to_mat(&out.k_rope)?,
                v: tensor_to_mat(&out.latent)?,
            });
            x = out.x;
        }
        let (logits, all_logits) = self.logits(&x, opts)?;
        let chunk = ChunkKv::new(self.layout, start_pos, layers).ops(OP)?;
        Ok(Prefill {
            logits,
            all_logits,
            chunk,
        })
    }

    /// Token rows of the embedding table, or embeddings given as they are (`n x hidden`).
    fn embed(&self, input: Input<'_>) -> Result<Tensor> {
        const OP: &str = "MlaModel::embed";
        let hidden = self.cfg.hidden;
        match input {
            Input::Tokens(ids) => {
                let vocab = self.cfg.vocab;
                if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
                    return Err(Error::TokenOutOfRange { op: OP, id, vocab });
                }
                let ids = Tensor::from_slice(ids, ids.len(), &Device::Cpu).ctx(OP)?;
                self.weights.embed.index_select(&ids, 0).ctx(OP)
            }
            Input::Embeddings { data, n } if data.len() == n * hidden => {
                Tensor::from_slice(data, (n, hidden), &Device::Cpu).ctx(OP)
            }
            Input::Embeddings { data, n } => Err(Error::Shape {
                op: OP,
                detail: format!("embeddings: expected {n} x {hidden} values, got {}", data.len()),
            }),
        }
    }

    /// The weights a `Model` holding this one shares with its own paths (embedding, final norm,
    /// LM head; no layers: every layer runs here), as views of the same tensors.
    pub(crate) fn shared_weights(&self) -> crate::weights::Weights {
        use crate::quant::Linear;
        crate::weights::Weights {
            embed: Linear::Dense(self.weights.embed.clone()),
            layers: Vec::new(),
            out_norm: self.weights.out_norm.clone(),
            lm_head: Some(Linear::Dense(self.weights.lm_head.clone())),
        }
    }

    /// Bytes of every weight (all f32).
    pub fn weight_bytes(&self) -> usize {
        self.weights.elem_count() * 4
    }

    /// Logits at the last row of `x` (and at every row with `opts.all_logits`).
    fn logits(&self, x: &Tensor, opts: PrefillOptions) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        const OP: &str = "MlaModel::logits";
        let n = x.dim(0).ctx(OP)?;
        let rows = if opts.all_logits {
            x.clone()
        } else {
            x.narrow(0, n - 1, 1).ctx(OP)?
        };
        let h = norm(&rows, &self.weights.out_norm, self.cfg.rms_eps)?;
        let all = dense_linear(&h, &self.weights.lm_head, None)?
            .flatten_all()
            .ctx(OP)?
            .to_vec1::<f32>()
            .ctx(OP)?;
        let last = all[all.len() - self.cfg.vocab..].to_vec();
        Ok((last, opts.all_logits.then_some(all)))
    }
}
