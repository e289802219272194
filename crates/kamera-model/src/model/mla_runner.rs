//! A DeepSeek-V2 directory as a [`Model`]: the MLA runner ([`crate::mla::MlaModel`]) does every
//! layer; `Model` keeps its tokenizer, its shared [`crate::Config`] (the rotary part as the head,
//! the latent in `mla_latent`), the MLA KV layout and the runner's rope (YaRN included), so the
//! paths that only prefill, extend, relocate and patch (contexts, the store, the scheduler, the
//! eval methods that reuse KV) take it as they take any model. What reads per-layer GQA weights
//! (selective recompute, probes, the CUDA decoder) refuses it with an error.

use std::path::Path;

use super::{Input, Model, Prefill};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::mla::MlaModel;
use crate::tokenizer::Tokenizer;

impl Model {
    /// config.json + safetensors + tokenizer.json of a DeepSeek-V2 checkpoint.
    pub(super) fn load_mla(dir: &Path) -> Result<Model> {
        let mla = MlaModel::load(dir)?;
        let tokenizer = Tokenizer::from_hf_json(&dir.join("tokenizer.json"))?;
        let cfg = mla.config().text_config();
        let cfg_json = serde_json::to_string(&cfg).unwrap_or_default();
        // The runner's fingerprint already hashes the weights and its whole configuration.
        let sha = mla.fingerprint().to_string();
        let mut model = Model::assemble(cfg, mla.shared_weights(), tokenizer, &sha, &cfg_json, None)?;
        model.rope = mla.rope().clone();
        model.mla = Some(mla);
        Ok(model)
    }

    /// The MLA runner, when this model is one (`rotary`: 3-D positions were asked for, which
    /// MLA has not); `None` for the GQA families.
    pub(super) fn mla_for(&self, op: &'static str, rotary: bool) -> Result<Option<&MlaModel>> {
        match &self.mla {
            Some(_) if rotary => Err(Error::Invalid {
                op,
                detail: "3-D rotary positions need an M-RoPE model (Qwen2.5-VL), not DeepSeek-V2".into(),
            }),
            m => Ok(m.as_ref()),
        }
    }

    /// The MLA runner of a DeepSeek-V2 model.
    pub fn mla(&self) -> Option<&MlaModel> {
        self.mla.as_ref()
    }

    /// An error naming `op` for a DeepSeek-V2 model: what reads per-layer GQA weights.
    pub(crate) fn require_gqa(&self, op: &'static str) -> Result<()> {
        match self.mla {
            Some(_) => Err(Error::Invalid {
                op,
                detail: "not available for a DeepSeek-V2 (MLA) model".into(),
            }),
            None => Ok(()),
        }
    }
}

impl MlaModel {
    /// [`MlaModel::extend`] for tokens or embeddings.
    pub(crate) fn extend_input(&self, input: Input<'_>, context: &mut Context) -> Result<Prefill> {
        let out = crate::team::on_pool(|| self.forward(input, context.end(), context, Default::default()))?;
        context.push(&out.chunk)?;
        Ok(out)
    }
}
