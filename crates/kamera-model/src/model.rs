//! The runner: a loaded model that prefills tokens (or embeddings) at a start position on top of
//! a [`Context`], returning logits and the new tokens' per-layer KV as a kamera-ops chunk.

use std::path::Path;

use candle_core::{Device, Tensor};
use kamera_ops::{ChunkKv, KvLayout, LayerKv, RopeSpec};
use sha2::{Digest, Sha256};

use crate::block::{attend_and_mlp, head, layer_forward, project_qkv};
use crate::config::Config;
use crate::context::{Context, tensor_to_mat};
use crate::decode::{Step, Vectors};
use crate::error::{CandleCtx, Error, OpsCtx, Result};
use crate::gguf::Gguf;
use crate::hf::SafeDir;
use crate::tokenizer::Tokenizer;
use crate::vision::PreprocessConfig;
use crate::vl::{Tower, Vision, VlConfig};
use crate::weights::{WeightBytes, Weights};

mod mla_runner;

/// What to prefill.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// Token ids.
    Tokens(&'a [u32]),
    /// Ready-made input embeddings, `n x hidden` row-major, used as is (no embedding scale is
    /// applied: [`Model::embed_tokens`] gives token rows already scaled).
    Embeddings { data: &'a [f32], n: usize },
}

/// Prefill options.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefillOptions {
    /// Also return logits at every position (costs an LM-head matmul per token).
    pub all_logits: bool,
}

/// Tokens a long prefill runs at once (llama.cpp's default `n_ubatch`): a prefill of more tokens
/// after nothing ([`Model::prefill`] on an empty context) runs in slices of this many, each
/// written into one context and attending to the rows before it, so its activations are one
/// slice's, not the whole input's. The math is the same as one pass (each token attends to the
/// same rows); only the order of the products' sums may differ.
pub const PREFILL_SLICE: usize = 512;

/// What [`Model::extend_embedded`] returns besides writing the context.
#[derive(Clone, Copy)]
struct Keep {
    /// The last row's logits.
    logits: bool,
    /// The new rows' K/V as a chunk (a copy of what the context holds).
    chunk: bool,
}

/// Result of a prefill.
#[derive(Debug, Clone)]
pub struct Prefill {
    /// Logits at the last position (`vocab`).
    pub logits: Vec<f32>,
    /// Logits at every position (`n x vocab`, row-major) when asked for.
    pub all_logits: Option<Vec<f32>>,
    /// The new tokens' K (post-RoPE, post QK-norm) and V per layer, at `start_pos..`.
    pub chunk: ChunkKv,
}

/// A loaded model.
#[derive(Debug)]
pub struct Model {
    cfg: Config,
    weights: Weights,
    /// Norm weights and biases as plain values, for decode.
    vectors: Vectors,
    rope: RopeSpec,
    layout: KvLayout,
    tokenizer: Tokenizer,
    fingerprint: String,
    /// The fingerprint with f32 prefills (weights and configuration only).
    base_fingerprint: String,
    device: Device,
    vision: Option<Vision>,
    precision: crate::PrefillPrecision,
    /// How decode steps multiply by the quantized weights.
    decode_precision: crate::DecodePrecision,
    /// DeepSeek-V2: every layer runs in this runner (`model/mla_runner.rs`).
    mla: Option<crate::mla::MlaModel>,
}

impl Model {
    /// Load a GGUF file (weight matrices kept in their block quantisation, see `quant/`), or a
    /// Hugging Face model directory (Qwen2.5-VL: config.json, safetensors, tokenizer.json), in
    /// f32 whatever it is stored in.
    pub fn load(path: &Path) -> Result<Model> {
        if path.is_dir() {
            return Model::load_dir(path, crate::PrefillPrecision::F32);
        }
        let mut g = Gguf::open(path)?;
        let cfg = Config::from_gguf(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        let device = Device::Cpu;
        let weights = Weights::load(&g, &cfg, &device)?;
        let cfg_json = serde_json::to_string(&cfg).unwrap_or_default();
        let weights_sha = g.sha256().to_string();
        g.release();
        tracing::debug!(?cfg.family, layers = cfg.n_layers, "loaded {}", path.display());
        Model::assemble(cfg, weights, tokenizer, &weights_sha, &cfg_json, None)
    }

    /// A model from its parts; the fingerprint (the store's key) hashes the weights' sha256 and
    /// the configuration.
    fn assemble(
        cfg: Config,
        weights: Weights,
        tokenizer: Tokenizer,
        weights_sha: &str,
        cfg_json: &str,
        vision: Option<Vision>,
    ) -> Result<Model> {
        let digest = Sha256::new()
            .chain_update(weights_sha)
            .chain_update(cfg_json)
            .finalize();
        let fingerprint: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        let rope = cfg.rope();
        rope.validate().ops("Model::load rope")?;
        let layout = cfg.kv_layout();
        let vectors = Vectors::of(&weights)?;
        Ok(Model {
            cfg,
            weights,
            vectors,
            rope,
            layout,
            tokenizer,
            base_fingerprint: fingerprint.clone(),
            fingerprint,
            device: Device::Cpu,
            vision,
            precision: crate::PrefillPrecision::F32,
            decode_precision: crate::DecodePrecision::F32,
            mla: None,
        })
    }

    /// [`Model::load`] with long prefills at `precision` ([`Model::set_prefill_precision`]); a
    /// Hugging Face checkpoint's matrices are converted as they are read, so a bf16 model never
    /// sits in memory in f32.
    pub fn load_with_precision(path: &Path, precision: crate::PrefillPrecision) -> Result<Model> {
        check_precision(precision)?;
        let mut m = if path.is_dir() {
            Model::load_dir(path, precision)?
        } else {
            Model::load(path)?
        };
        m.set_prefill_precision(precision)?;
        Ok(m)
    }

    fn load_dir(dir: &Path, precision: crate::PrefillPrecision) -> Result<Model> {
        let config = dir.join("config.json");
        if crate::mla::is_deepseek_v2(&config)? {
            return Model::load_mla(dir);
        }
        let vl = VlConfig::from_file(&config)?;
        let st = SafeDir::open(dir)?;
        let text_prefix = if st.has("model.language_model.embed_tokens.weight") {
            "model.language_model."
        } else {
            "model."
        };
        let vis_prefix = if st.has("model.visual.patch_embed.proj.weight") {
            "model.visual."
        } else {
            "visual."
        };
        let cfg = vl.text.clone();
        let weights = Weights::from_safetensors(&st, text_prefix, &cfg, vl.tie_embeddings, precision)?;
        let tower = Tower::load(&st, vis_prefix, &vl.vision, precision)?;
        let tokenizer = Tokenizer::from_hf_json(&dir.join("tokenizer.json"))?;
        let pre_file = dir.join("preprocessor_config.json");
        let preprocess = if pre_file.is_file() {
            PreprocessConfig::from_file(&pre_file)?
        } else {
            PreprocessConfig::default()
        };
        let v = &vl.vision;
        if (
            preprocess.patch_size,
            preprocess.temporal_patch_size,
            preprocess.merge_size,
        ) != (v.patch_size, v.temporal_patch_size, v.merge_size)
        {
            return Err(Error::Invalid {
                op: "Model::load",
                detail: format!(
                    "{}: patch / temporal patch / merge sizes disagree with config.json's vision_config",
                    pre_file.display()
                ),
            });
        }
        let cfg_json = serde_json::to_string(&(&cfg, &vl.vision)).unwrap_or_default();
        tracing::debug!(layers = cfg.n_layers, "loaded Qwen2.5-VL {}", dir.display());
        let vision = Vision {
            tower,
            tokens: vl.tokens,
            preprocess,
        };
        Model::assemble(cfg, weights, tokenizer, &st.sha256()?, &cfg_json, Some(vision))
    }

    /// The vision tower, for a vision-language model.
    pub fn vision(&self) -> Option<&Vision> {
        self.vision.as_ref()
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn layout(&self) -> KvLayout {
        self.layout
    }
    pub fn rope(&self) -> &RopeSpec {
        &self.rope
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    /// Hash of the weights file and the configuration (hex, 128 bits): the store's key.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
    /// The fingerprint of the weights and configuration alone, whatever the prefill precision
    /// ([`Model::fingerprint`] also hashes a precision other than f32): what per-model measured
    /// properties (patch points) are keyed by.
    pub fn base_fingerprint(&self) -> &str {
        &self.base_fingerprint
    }
    /// An empty context starting at position 0.
    pub fn empty_context(&self) -> Context {
        Context::empty(self.layout, 0)
    }

    /// Prefill `tokens` at `start_pos..` after `context`; logits at the last position.
    pub fn prefill(&self, tokens: &[u32], start_pos: i64, context: &Context) -> Result<Prefill> {
        self.prefill_with(Input::Tokens(tokens), start_pos, context, PrefillOptions::default())
    }

    /// Prefill tokens or embeddings at `start_pos..` after `context` (which, when not empty,
    /// must end at `start_pos`).
    pub fn prefill_with(
        &self,
        input: Input<'_>,
        start_pos: i64,
        context: &Context,
        opts: PrefillOptions,
    ) -> Result<Prefill> {
        crate::team::on_pool(|| self.forward(input, start_pos, context, opts, None))
    }

    /// Prefill for M-RoPE models (Qwen2.5-VL): the new tokens rotate to the 3-D ids `rotary`
    /// (one per token; see [`crate::vl::rope_index`]), while attention keeps the context's token
    /// order (they continue at `context.end()`). The chunk returned starts at `rotary[0][0]`, the
    /// position relocation shifts (every section by the same δ).
    pub fn prefill_rotary(
        &self,
        input: Input<'_>,
        rotary: &[[i64; 3]],
        context: &Context,
        opts: PrefillOptions,
    ) -> Result<Prefill> {
        const OP: &str = "Model::prefill_rotary";
        if self.cfg.mrope_sections.is_none() {
            return Err(Error::Invalid {
                op: OP,
                detail: "3-D rotary positions need an M-RoPE model (Qwen2.5-VL)".into(),
            });
        }
        crate::team::on_pool(|| self.forward(input, context.end(), context, opts, Some(rotary)))
    }

    /// The prefill itself; its callers run it on a pool worker ([`crate::team::on_pool`]).
    fn forward(
        &self,
        input: Input<'_>,
        start_pos: i64,
        context: &Context,
        opts: PrefillOptions,
        mrope: Option<&[[i64; 3]]>,
    ) -> Result<Prefill> {
        const OP: &str = "Model::prefill";
        self.check_layout(OP, context)?;
        if let Some(mla) = self.mla_for(OP, mrope.is_some())? {
            return mla.forward(input, start_pos, context, opts);
        }
        if !context.is_empty() && context.end() != start_pos {
            return Err(Error::Invalid {
                op: OP,
                detail: format!("start_pos {start_pos} != context end {}", context.end()),
            });
        }
        if !(0..=i64::MAX / 4).contains(&start_pos) {
            return Err(Error::Invalid {
                op: OP,
                detail: format!("start_pos {start_pos} is negative or too large"),
            });
        }
        let mut x = self.embed(input)?;
        let n = x.dim(0).ctx(OP)?;
        if n == 0 {
            return Err(Error::Invalid {
                op: OP,
                detail: "empty input".into(),
            });
        }
        if n > PREFILL_SLICE && context.is_empty() && mrope.is_none() && !opts.all_logits {
            return self.prefill_in_slices(x, start_pos);
        }
        if mrope.is_some_and(|p| p.len() != n) {
            return Err(Error::Shape {
                op: OP,
                detail: format!("{} rotary positions for {n} tokens", mrope.map_or(0, |p| p.len())),
            });
        }
        let positions: Vec<i64> = (0..n as i64).map(|i| start_pos + i).collect();
        let k_pos: Vec<i64> = (context.offset()..context.end())
            .chain(positions.iter().copied())
            .collect();
        let mut layers = Vec::with_capacity(self.cfg.n_layers);
        for (l, w) in self.weights.layers.iter().enumerate() {
            let window = self.window(l);
            let out = layer_forward(
                &self.cfg,
                w,
                l,
                &self.rope,
                &x,
                &positions,
                context.layer(l)?,
                &k_pos,
                window,
                mrope,
            )?;
            layers.push(LayerKv {
                k: tensor_to_mat(&out.k)?,
                v: tensor_to_mat(&out.v)?,
            });
            x = out.x;
        }
        let (logits, all_logits) = self.logits(&x, opts)?;
        let chunk_start = mrope.and_then(|p| p.first()).map_or(start_pos, |p| p[0]);
        let chunk = ChunkKv::new(self.layout, chunk_start, layers).ops(OP)?;
        Ok(Prefill {
            logits,
            all_logits,
            chunk,
        })
    }

    /// Appends `tokens` to `context` in place (its next positions) and returns the logits at the
    /// last one and the new tokens' K/V: what [`Model::prefill`] then [`Context::push`] do, but
    /// the new rows are written into the context's buffers once instead of the whole context
    /// being copied every step (decode loops). On error the context is left as it was.
    pub fn extend(&self, tokens: &[u32], context: &mut Context) -> Result<Prefill> {
        self.extend_with(Input::Tokens(tokens), None, context)
    }

    /// [`Model::extend`] for M-RoPE models with explicit 3-D rotary ids (an image's tokens: see
    /// [`crate::vl::image_positions`]); the chunk returned starts at `rotary[0][0]`. Text after it
    /// must then rotate from the image's span: push image chunks with
    /// [`Context::push_spanned`] (this call records only rows).
    pub fn extend_rotary(&self, input: Input<'_>, rotary: &[[i64; 3]], context: &mut Context) -> Result<Prefill> {
        if self.cfg.mrope_sections.is_none() {
            return Err(Error::Invalid {
                op: "Model::extend_rotary",
                detail: "3-D rotary positions need an M-RoPE model (Qwen2.5-VL)".into(),
            });
        }
        self.extend_with(input, Some(rotary), context)
    }

    /// Appends one image chunk (`<|vision_start|>`, its merged tokens, `<|vision_end|>`) of patch
    /// grid `grid` to `context` at its rotary end: the tower's output `embeds` spliced into the
    /// chunk's token embeddings, prefilled at the image's 3-D rotary ids, its span recorded so
    /// what follows rotates from its end.
    pub fn extend_image(&self, grid: crate::vl::Grid, embeds: &[f32], context: &mut Context) -> Result<Prefill> {
        let vision = self.vision().ok_or_else(|| Error::Invalid {
            op: "Model::extend_image",
            detail: "an image chunk needs a vision-language model".into(),
        })?;
        let tokens = vision.chunk_tokens(grid);
        let n = tokens.len();
        let x = vision.splice(&tokens, self.embed_tokens(&tokens)?, &[embeds])?;
        let rot = vision.chunk_positions(grid, context.rotary_end());
        let out = self.extend_rotary(Input::Embeddings { data: &x, n }, &rot, context)?;
        context.mark_span(n, vision.chunk_span(grid))?;
        Ok(out)
    }

    fn extend_with(&self, input: Input<'_>, rotary: Option<&[[i64; 3]]>, context: &mut Context) -> Result<Prefill> {
        const OP: &str = "Model::extend";
        self.check_layout(OP, context)?;
        if let Some(mla) = self.mla_for(OP, rotary.is_some())? {
            return mla.extend_input(input, context);
        }
        if rotary.is_none()
            && let Some(row) = self.single_row(input)?
        {
            return self.decode_one(row, context);
        }
        crate::team::on_pool(|| self.extend_rows(input, rotary, context))
    }

    /// [`Model::forward`] of more than [`PREFILL_SLICE`] embedded rows `x` after nothing, at
    /// `start..`: the slices extend one context in turn, which then becomes the chunk.
    fn prefill_in_slices(&self, x: Tensor, start: i64) -> Result<Prefill> {
        const OP: &str = "Model::prefill";
        let n = x.dim(0).ctx(OP)?;
        let mut context = Context::empty(self.layout, start);
        context.reserve(n)?;
        let mut logits = Vec::new();
        for s in (0..n).step_by(PREFILL_SLICE) {
            let m = PREFILL_SLICE.min(n - s);
            let last = s + m == n;
            let slice = x.narrow(0, s, m).ctx(OP)?;
            let (l, _) = self.extend_embedded(
                slice,
                None,
                &mut context,
                Keep {
                    logits: last,
                    chunk: false,
                },
            )?;
            logits = l;
        }
        Ok(Prefill {
            logits,
            all_logits: None,
            chunk: context.into_chunk()?,
        })
    }

    /// [`Model::extend_with`] for more than one row, on a pool worker.
    fn extend_rows(&self, input: Input<'_>, rotary: Option<&[[i64; 3]]>, context: &mut Context) -> Result<Prefill> {
        let x = self.embed(input)?;
        let (logits, chunk) = self.extend_embedded(
            x,
            rotary,
            context,
            Keep {
                logits: true,
                chunk: true,
            },
        )?;
        Ok(Prefill {
            logits,
            all_logits: None,
            chunk: chunk.expect("kept"),
        })
    }

    /// Appends embedded rows `x` to `context` in place; returns the last row's logits and the
    /// new rows' K/V as a chunk, each where `keep` asks for it (empty otherwise).
    fn extend_embedded(
        &self,
        mut x: Tensor,
        rotary: Option<&[[i64; 3]]>,
        context: &mut Context,
        keep: Keep,
    ) -> Result<(Vec<f32>, Option<ChunkKv>)> {
        const OP: &str = "Model::extend";
        let n = x.dim(0).ctx(OP)?;
        if n == 0 {
            return Err(Error::Invalid {
                op: OP,
                detail: "empty input".into(),
            });
        }
        if rotary.is_some_and(|r| r.len() != n) {
            return Err(Error::Shape {
                op: OP,
                detail: format!("{} rotary positions for {n} tokens", rotary.map_or(0, |r| r.len())),
            });
        }
        let start = context.end();
        let positions: Vec<i64> = (0..n as i64).map(|i| start + i).collect();
        let k_pos: Vec<i64> = (context.offset()..start + n as i64).collect();
        // Rotation: explicit ids, else the context's rotary end onwards (= `positions` unless
        // the context holds an image whose span is not its token count).
        let shifted: Option<Vec<[i64; 3]>> = match rotary {
            Some(_) => None,
            None if context.rotary_end() != start => {
                Some((0..n as i64).map(|i| [context.rotary_end() + i; 3]).collect())
            }
            None => None,
        };
        let mrope = rotary.or(shifted.as_deref());
        let chunk_start = mrope.and_then(|p| p.first()).map_or(start, |p| p[0]);
        context.reserve(n)?;
        let mut layers = Vec::with_capacity(self.cfg.n_layers);
        for (l, w) in self.weights.layers.iter().enumerate() {
            let window = self.window(l);
            let (q, k, v) = project_qkv(&self.cfg, w, l, &self.rope, &x, &positions, mrope)?;
            let (kh, vh) = context.write(l, &k, &v)?;
            x = attend_and_mlp(&self.cfg, w, &x, &q, (&kh, &vh), &positions, &k_pos, window)?;
            if keep.chunk {
                layers.push(LayerKv {
                    k: tensor_to_mat(&k)?,
                    v: tensor_to_mat(&v)?,
                });
            }
        }
        let logits = if keep.logits {
            self.logits(&x, PrefillOptions::default())?.0
        } else {
            Vec::new()
        };
        let chunk = if keep.chunk {
            Some(ChunkKv::new(self.layout, chunk_start, layers).ops(OP)?)
        } else {
            None
        };
        context.commit(n);
        Ok((logits, chunk))
    }

    /// The input row of a one-token input (decode), `None` for more tokens.
    fn single_row(&self, input: Input<'_>) -> Result<Option<Vec<f32>>> {
        const OP: &str = "Model::extend";
        let hidden = self.cfg.hidden;
        match input {
            Input::Tokens(&[id]) => {
                let vocab = self.cfg.vocab;
                if id as usize >= vocab {
                    return Err(Error::TokenOutOfRange { op: OP, id, vocab });
                }
                let mut x = vec![0f32; hidden];
                self.weights.embed.row_into(id as usize, &mut x)?;
                if let Some(s) = self.cfg.embed_scale {
                    x.iter_mut().for_each(|v| *v *= s);
                }
                Ok(Some(x))
            }
            Input::Embeddings { data, n: 1 } if data.len() == hidden => Ok(Some(data.to_vec())),
            _ => Ok(None),
        }
    }

    /// [`Model::extend`] by one token on plain buffers (`decode.rs`).
    fn decode_one(&self, x: Vec<f32>, context: &mut Context) -> Result<Prefill> {
        const OP: &str = "Model::extend";
        let (start, rotary) = (context.end(), context.rotary_end());
        context.reserve(1)?;
        let step = Step {
            cfg: &self.cfg,
            weights: &self.weights,
            vectors: &self.vectors,
            rope: &self.rope,
            precision: self.decode_precision,
        };
        let (logits, layers) = step.run(x, context, rotary, rotary != start)?;
        let chunk = ChunkKv::new(self.layout, rotary, layers).ops(OP)?;
        context.commit(1);
        Ok(Prefill {
            logits,
            all_logits: None,
            chunk,
        })
    }

    fn check_layout(&self, op: &'static str, context: &Context) -> Result<()> {
        if *context.layout() != self.layout {
            return Err(Error::Shape {
                op,
                detail: format!(
                    "context layout {:?} != model layout {:?}",
                    context.layout(),
                    self.layout
                ),
            });
        }
        Ok(())
    }

    /// The sliding window of layer `l` (Gemma's local layers), if any.
    fn window(&self, l: usize) -> Option<usize> {
        if self.cfg.local_layers[l] {
            self.cfg.sliding_window
        } else {
            None
        }
    }

    /// Logits at the last row of `x` (and at every row with `opts.all_logits`).
    fn logits(&self, x: &Tensor, opts: PrefillOptions) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        const OP: &str = "Model::logits";
        let n = x.dim(0).ctx(OP)?;
        let lm = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
        let eps = self.cfg.rms_eps;
        Ok(if opts.all_logits {
            let all = head(x, &self.weights.out_norm, lm, eps)?
                .flatten_all()
                .ctx(OP)?
                .to_vec1::<f32>()
                .ctx(OP)?;
            (all[(n - 1) * self.cfg.vocab..].to_vec(), Some(all))
        } else {
            let last = x.narrow(0, n - 1, 1).ctx(OP)?;
            (
                head(&last, &self.weights.out_norm, lm, eps)?
                    .flatten_all()
                    .ctx(OP)?
                    .to_vec1::<f32>()
                    .ctx(OP)?,
                None,
            )
        })
    }

    /// Resident bytes of the weights as held (quantized matrices as their codes, scales and
    /// offsets; bf16 matrices in bf16; everything else f32), and the block types kept quantized with their bytes.
    pub fn weight_bytes(&self) -> WeightBytes {
        if let Some(mla) = &self.mla {
            let b = mla.weight_bytes();
            return WeightBytes {
                total: b,
                dense: b,
                ..Default::default()
            };
        }
        self.weights.bytes()
    }

    /// Sets how prefills multiply by the weights (f32 by default), from 8 tokens for a GGUF's
    /// quantized weights (which keep their codes) and from 2 for a Hugging Face checkpoint's dense
    /// matrices (text and tower): on the bf16 tiles (f32 ones rounded) or in f32 (a bf16
    /// checkpoint's matrices stay bf16 either way: half the bytes, the f32 products). An error
    /// names what is missing when this CPU cannot run `p`.
    pub fn set_prefill_precision(&mut self, p: crate::PrefillPrecision) -> Result<()> {
        check_precision(p)?;
        let hf = self.vision.is_some();
        let took = self.weights.set_precision(p, hf)?;
        if let Some(v) = &mut self.vision {
            v.tower.set_precision(p)?;
        }
        self.precision = if took { p } else { crate::PrefillPrecision::F32 };
        // Canonical KV from bf16 products differs (slightly) from f32's: the store keeps them
        // apart. f32 keeps the fingerprint a model always had.
        self.fingerprint = match self.precision {
            crate::PrefillPrecision::F32 => self.base_fingerprint.clone(),
            other => {
                let d = Sha256::new()
                    .chain_update(&self.base_fingerprint)
                    .chain_update(format!("prefill={other}"))
                    .finalize();
                d.iter().take(16).map(|b| format!("{b:02x}")).collect()
            }
        };
        Ok(())
    }

    /// How long prefills multiply by the quantized weights.
    pub fn prefill_precision(&self) -> crate::PrefillPrecision {
        self.precision
    }

    /// Sets how one-token steps (decode) multiply by the quantized weights (f32 by default); an
    /// error names what is missing when this CPU cannot run `p`. Decode's KV is not stored, so
    /// the fingerprint stays.
    pub fn set_decode_precision(&mut self, p: crate::DecodePrecision) -> Result<()> {
        if !p.available() {
            return Err(crate::Error::Invalid {
                op: "Model::set_decode_precision",
                detail: format!("{p} decode needs an x86-64 CPU with AVX512-VNNI (and AVX-512F/BW) or AVX2 + FMA"),
            });
        }
        self.decode_precision = p;
        Ok(())
    }

    /// How one-token steps multiply by the quantized weights.
    pub fn decode_precision(&self) -> crate::DecodePrecision {
        self.decode_precision
    }

    pub(crate) fn weights(&self) -> &Weights {
        &self.weights
    }

    /// The input embeddings of `ids` (`n x hidden`, row-major, with the family's embedding
    /// scale): what [`Input::Embeddings`] takes, e.g. to splice vision embeddings between them.
    pub fn embed_tokens(&self, ids: &[u32]) -> Result<Vec<f32>> {
        const OP: &str = "Model::embed_tokens";
        self.embed(Input::Tokens(ids))?
            .flatten_all()
            .ctx(OP)?
            .to_vec1::<f32>()
            .ctx(OP)
    }

    pub(crate) fn embed(&self, input: Input<'_>) -> Result<Tensor> {
        const OP: &str = "Model::embed";
        match input {
            Input::Tokens(ids) => {
                let vocab = self.cfg.vocab;
                if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
                    return Err(Error::TokenOutOfRange { op: OP, id, vocab });
                }
                let x = self.weights.embed.rows(ids)?;
                match self.cfg.embed_scale {
                    Some(s) => (x * s as f64).ctx(OP),
                    None => Ok(x),
                }
            }
            Input::Embeddings { data, n } => {
                if data.len() != n * self.cfg.hidden {
                    return Err(Error::Shape {
                        op: OP,
                        detail: format!(
                            "embeddings: expected {n} x {} = {} values, got {}",
                            self.cfg.hidden,
                            n * self.cfg.hidden,
                            data.len()
                        ),
                    });
                }
                Tensor::from_slice(data, (n, self.cfg.hidden), &self.device).ctx(OP)
            }
        }
    }
}

/// An error naming what this CPU lacks when it cannot run prefills at `p`.
fn check_precision(p: crate::PrefillPrecision) -> Result<()> {
    if p.available() {
        return Ok(());
    }
    Err(crate::Error::Invalid {
        op: "Model::set_prefill_precision",
        detail: format!("{p} prefill needs a CPU with AVX-512F and AVX512_BF16"),
    })
}
