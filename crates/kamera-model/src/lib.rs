//! kamera-model: real pretrained transformers (llama, qwen2, gemma3 GGUF; Qwen2.5-VL and
//! DeepSeek-V2 (MLA, [`mla`]) from Hugging Face directories) on candle, CPU, with
//! the per-layer KV of every chunk readable and writable in kamera-ops layout.
//!
//! ```no_run
//! use kamera_model::{Model, ModelName, fetch, default_home};
//! let path = fetch(ModelName::Smollm2_135m, &default_home())?;
//! let model = Model::load(&path)?;
//! let ids = model.tokenizer().encode("The capital of France is")?;
//! let out = model.prefill(&ids, 0, &model.empty_context())?;
//! println!("next: {}", kamera_model::argmax(&out.logits));
//! # Ok::<(), kamera_model::Error>(())
//! ```

mod activation;
mod attention;
#[cfg(target_arch = "x86_64")]
mod attention_bf16;
mod block;
mod bpe;
mod config;
mod context;
mod decode;
#[cfg(feature = "cuda")]
mod device;
mod error;
mod fetch;
mod generate;
mod gguf;
mod golden;
mod hf;
mod hf_tokenizer;
mod lanes;
mod merge;
pub mod mla;
mod model;
mod probe;
mod quant;
mod selective;
mod spm;
mod team;
mod tokenizer;
pub mod vision;
pub mod vl;
mod weights;

pub use config::{Activation, Config, Family};
pub use context::Context;
pub use error::{Error, Result};
pub use fetch::{CacheState, ModelName, cache_state, default_home, fetch, fetch_with, model_path, sha256_file};
pub use generate::{Sampling, argmax};
pub use gguf::Gguf;
pub use golden::{Golden, GoldenCase, GoldenScore, bucketed_kl};
pub use hf::SafeDir;
pub use kamera_ops::{ChunkKv, KvLayout, PairLayout, Patch, Placement, RopeSpec};
pub use model::{Input, Model, PREFILL_SLICE, Prefill, PrefillOptions};
pub use probe::{LayerProbe, Probe};
pub use quant::{DecodePrecision, PrefillPrecision};
pub use selective::{Selection, Selective};
pub use team::{TeamStats, decode_team_stats};
pub use tokenizer::Tokenizer;
pub use weights::WeightBytes;

/// `kamera_ops::relocate` with this crate's error type.
pub fn kamera_ops_relocate(chunk: &ChunkKv, rope: &RopeSpec, to: i64) -> Result<ChunkKv> {
    kamera_ops::relocate(chunk, rope, to).map_err(|source| Error::Ops { op: "relocate", source })
}
