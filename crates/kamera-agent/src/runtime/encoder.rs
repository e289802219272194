//! The session's side of kamera-sched's executor: a [`kamera_sched::Encoder`] over kamera-model
//! and the `Backend`. It keeps the model's live context, which holds the window's KV rows by
//! (chunk, version) from position 0 and is only rewritten from the first chunk that changed; a
//! prefill after the window appends to it in place; image chunks get the vision tower's
//! embeddings (kept in a [`TowerCache`] within its budget) and 3-D rotary ids. After the window
//! it keeps the last model call's prompt rows ([`crate::Live`]) while the window does not change,
//! and sets them aside per window layout when it does ([`PromptRows`]).

use std::collections::HashMap;
use std::sync::Arc;

use kamera_gpu::Backend;
use kamera_model::vision::RgbImage;
use kamera_model::vl::Grid;
use kamera_model::{Context, Input, Model, Prefill, PrefillOptions};
use kamera_ops::{ChunkKv, DType, KvLayout, Patch, RopeSpec};
use kamera_sched::{BoxError, Encoder, Prior};
use kamera_store::ChunkId;

use super::prompt_rows::{PromptRows, layout_key};
use super::towers::TowerCache;
use crate::error::{Error, Result, model};

mod ahead;

/// A chunk's content: what a prefill needs.
#[derive(Debug, Clone)]
pub(crate) struct Content {
    pub tokens: Vec<u32>,
    /// An image chunk's pixels (its `tokens` are the vision markers and pads).
    pub image: Option<Arc<ImageContent>>,
}

/// An image chunk's pixels, kept as a PNG (a fraction of the raw bytes; decoded only when the
/// tower runs on them), and its patch grid.
#[derive(Debug)]
pub(crate) struct ImageContent {
    pub png: Vec<u8>,
    pub grid: Grid,
}

/// A chunk's prefill input: embeddings to use instead of its tokens (image chunks), and 3-D
/// rotary ids (M-RoPE models).
type ChunkInput = (Option<Vec<f32>>, Option<Vec<[i64; 3]>>);

/// The model, the chunks' contents and the live context, for the executor.
pub(crate) struct SessionEncoder {
    pub model: Arc<Model>,
    pub backend: Box<dyn Backend + Send>,
    pub content: HashMap<ChunkId, Content>,
    /// Position spans of chunks that do not occupy one position per token (images).
    pub spans: HashMap<ChunkId, i64>,
    pub image_max_pixels: usize,
    /// The tower's outputs by image chunk, within [`crate::SessionConfig::tower_cache_bytes`].
    pub towers: TowerCache<ChunkId>,
    pub ctx: Context,
    /// The chunks (id, version) whose rows the context holds, in order from position 0.
    ctx_chunks: Vec<(ChunkId, u64)>,
    /// The last model call's prompt tokens, whose rows follow the window's in `ctx`.
    prompt_tail: Vec<u32>,
    /// Earlier prompts' rows, by the window layout they were computed over.
    prompt_rows: PromptRows,
    /// Screenshots run through the vision tower.
    pub images_encoded: usize,
    /// Model calls that prefilled chunks (a run made ahead counts once).
    pub prefill_calls: usize,
    /// KV bytes written into the live context.
    pub bytes_moved: u64,
    /// A run of prefills in place the executor announced, and those made ahead.
    ahead: ahead::Ahead,
}

impl SessionEncoder {
    /// Tokens of earlier prompts' rows kept per window layout (at most [`crate::PROMPT_ROWS_TOKENS`]).
    pub fn prompt_rows_tokens(&self) -> usize {
        self.prompt_rows.tokens()
    }

    pub fn new(
        model: Arc<Model>,
        backend: Box<dyn Backend + Send>,
        image_max_pixels: usize,
        tower_cache_bytes: usize,
    ) -> SessionEncoder {
        let ctx = model.empty_context();
        SessionEncoder {
            model,
            backend,
            content: HashMap::new(),
            spans: HashMap::new(),
            image_max_pixels,
            towers: TowerCache::new(tower_cache_bytes),
            ctx,
            ctx_chunks: Vec::new(),
            prompt_tail: Vec::new(),
            prompt_rows: PromptRows::default(),
            images_encoded: 0,
            prefill_calls: 0,
            bytes_moved: 0,
            ahead: ahead::Ahead::default(),
        }
    }

    /// Replaces the live context by `ctx`, whose rows belong to no resident chunk (the no-reuse
    /// baseline's full prefill): the next sync writes every chunk again.
    pub fn replace_context(&mut self, ctx: Context) -> &mut Context {
        self.ctx = ctx;
        self.ctx_chunks.clear();
        self.prompt_tail.clear();
        self.ahead.clear();
        &mut self.ctx
    }

    /// The live context for a model call, the last call's prompt rows kept after the window and
    /// the other prompts kept for its layout at hand (not after a full re-prefill replaced the
    /// context: its rows belong to no layout).
    pub fn live(&mut self) -> crate::Live<'_> {
        let others = (!self.ctx_chunks.is_empty()).then(|| (&mut self.prompt_rows, layout_key(&self.ctx_chunks)));
        crate::Live::kept(&mut self.ctx, &mut self.prompt_tail, others)
    }

    /// Sets the last call's prompt rows aside: the context holds exactly the window.
    pub fn cut_prompt(&mut self) -> Result<()> {
        self.set_prompt_aside()
    }

    fn content_of(&self, op: &'static str, chunk: &ChunkId) -> Result<&Content> {
        self.content.get(chunk).ok_or_else(|| Error::Runtime {
            op,
            detail: format!("chunk {chunk} has no known content to prefill"),
        })
    }

    /// An image chunk's tower output: from the tower cache, or computed and kept there (counted
    /// in `images_encoded`); computed again and not kept when `fresh`.
    fn tower_output(&mut self, chunk: &ChunkId, img: &ImageContent, fresh: bool) -> Result<Arc<Vec<f32>>> {
        if !fresh && let Some(e) = self.towers.get(chunk) {
            return Ok(e);
        }
        let vision = self.model.vision().ok_or_else(|| Error::Runtime {
            op: "vision tower",
            detail: "an image chunk needs a vision-language model".into(),
        })?;
        let image = RgbImage::decode_png(&img.png).map_err(model("decode screenshot"))?;
        let (_, out) = vision
            .encode_image(&image, Some(self.image_max_pixels))
            .map_err(model("vision tower"))?;
        if fresh {
            return Ok(Arc::new(out.embeds));
        }
        self.images_encoded += 1;
        Ok(self.towers.insert(*chunk, out.embeds))
    }

    /// What a prefill of `chunk` at rotary position `at` takes: the input embeddings (image
    /// chunks: the tower's output spliced in, computed once) and, for M-RoPE models, the 3-D
    /// rotary ids of its tokens.
    fn chunk_input(&mut self, op: &'static str, chunk: &ChunkId, at: i64) -> Result<ChunkInput> {
        let (n, image) = {
            let c = self.content_of(op, chunk)?;
            (c.tokens.len(), c.image.clone())
        };
        let mrope = self.model.config().mrope_sections.is_some();
        let Some(img) = &image else {
            let rot = mrope.then(|| (0..n as i64).map(|i| [at + i; 3]).collect());
            return Ok((None, rot));
        };
        let embeds = self.tower_output(chunk, img, false)?;
        let vision = self.model.vision().ok_or_else(|| Error::Runtime {
            op,
            detail: "an image chunk needs a vision-language model".into(),
        })?;
        let tokens = &self.content_of(op, chunk)?.tokens;
        let x = self.model.embed_tokens(tokens).map_err(model(op))?;
        let x = vision.splice(tokens, x, &[embeds.as_slice()]).map_err(model(op))?;
        let rot = vision.chunk_positions(img.grid, at);
        Ok((Some(x), Some(rot)))
    }

    /// `chunks` prefilled from scratch in order from position 0, as an engine without reuse
    /// does: each screenshot resized and run through the vision tower again (the embeddings
    /// kept for reuse are not used, nor counted in `images_encoded`), each run of text in one
    /// call. The live context is not touched. Returns the context, the tokens prefilled and the
    /// images encoded.
    pub fn reencode(&mut self, chunks: &[ChunkId]) -> Result<(Context, usize, usize)> {
        let op = "re-encode";
        let mut ctx = self.model.empty_context();
        let mut text: Vec<u32> = Vec::new();
        let (mut n_tokens, mut images) = (0, 0);
        for id in chunks {
            let c = self.content_of(op, id)?;
            n_tokens += c.tokens.len();
            if c.image.is_none() {
                text.extend(&c.tokens);
                continue;
            }
            if !text.is_empty() {
                self.model.extend(&text, &mut ctx).map_err(model(op))?;
                text.clear();
            }
            self.extend_into(op, id, &mut ctx, true)?;
            images += 1;
        }
        if !text.is_empty() {
            self.model.extend(&text, &mut ctx).map_err(model(op))?;
        }
        Ok((ctx, n_tokens, images))
    }

    /// Prefills `chunk` alone at position 0 (its canonical KV); the live context is untouched.
    fn prefill_alone_kv(&mut self, op: &'static str, chunk: &ChunkId) -> Result<Prefill> {
        self.prefill_calls += 1;
        let empty = self.model.empty_context();
        let (embeds, rot) = self.chunk_input(op, chunk, 0)?;
        let c = self.content_of(op, chunk)?;
        let input = match &embeds {
            Some(x) => Input::Embeddings {
                data: x,
                n: c.tokens.len(),
            },
            None => Input::Tokens(&c.tokens),
        };
        match rot {
            Some(rot) => self
                .model
                .prefill_rotary(input, &rot, &empty, PrefillOptions::default()),
            None => self.model.prefill_with(input, 0, &empty, PrefillOptions::default()),
        }
        .map_err(model(op))
    }

    /// Appends `chunk` to the live context in place (at its rotary end), recording its span.
    fn extend_chunk(&mut self, op: &'static str, chunk: &ChunkId) -> Result<Prefill> {
        self.prefill_calls += 1;
        let mut ctx = std::mem::replace(&mut self.ctx, self.model.empty_context());
        let out = self.extend_into(op, chunk, &mut ctx, false);
        self.ctx = ctx;
        out
    }

    /// Appends `chunk` to `ctx` at its rotary end (an image with its span: what follows
    /// rotates from its end), its image encoded again when `fresh`.
    fn extend_into(&mut self, op: &'static str, chunk: &ChunkId, ctx: &mut Context, fresh: bool) -> Result<Prefill> {
        let c = self.content_of(op, chunk)?;
        let (tokens, image) = (c.tokens.clone(), c.image.clone());
        match &image {
            Some(img) => {
                let embeds = self.tower_output(chunk, img, fresh)?;
                self.model.extend_image(img.grid, &embeds, ctx)
            }
            None => self.model.extend(&tokens, ctx),
        }
        .map_err(model(op))
    }

    /// Makes the live context hold exactly `prior`'s chunks: rows of the longest unchanged run
    /// of (chunk, version) from position 0 stay; the context is cut there and the rest written.
    /// With `keep_prompt`, the last call's prompt rows stay when the window is unchanged, and
    /// the rows kept for the new window's layout come back when it changed.
    fn sync_to(&mut self, prior: &Prior<'_>, keep_prompt: bool) -> Result<()> {
        let keep = self
            .ctx_chunks
            .iter()
            .zip(&prior.parts)
            .take_while(|(have, p)| have.0 == p.chunk && have.1 == p.version)
            .count();
        let rows: usize = prior.parts[..keep].iter().map(|p| p.kv.n_tokens()).sum();
        let unchanged = keep == self.ctx_chunks.len() && keep == prior.parts.len();
        if unchanged && keep_prompt && self.ctx.len() == rows + self.prompt_tail.len() {
            if self.prompt_tail.is_empty() {
                self.bring_prompt_back()?;
            }
            return Ok(());
        }
        self.set_prompt_aside()?;
        self.ctx.truncate(rows);
        self.ctx_chunks.truncate(keep);
        for p in &prior.parts[keep..] {
            let span = self.span(&p.chunk, p.kv.n_tokens());
            self.ctx.push_spanned(p.kv, span).map_err(model("context push"))?;
            self.bytes_moved += p.kv.kv_bytes() as u64;
            self.ctx_chunks.push((p.chunk, p.version));
        }
        if keep_prompt {
            self.bring_prompt_back()?;
        }
        Ok(())
    }

    /// Moves the last call's prompt rows out of the context into [`PromptRows`], under the
    /// layout they were computed over.
    fn set_prompt_aside(&mut self) -> Result<()> {
        let tail = std::mem::take(&mut self.prompt_tail);
        let Some(base) = self.ctx.len().checked_sub(tail.len()).filter(|_| !tail.is_empty()) else {
            return Ok(());
        };
        let kv = self
            .ctx
            .rows_chunk(base, tail.len())
            .map_err(model("set prompt aside"))?;
        self.ctx.truncate(base);
        self.prompt_rows.keep(layout_key(&self.ctx_chunks), tail, kv);
        Ok(())
    }

    /// Puts back the prompt rows kept for the window the context now holds, if any (and if they
    /// start where it ends).
    fn bring_prompt_back(&mut self) -> Result<()> {
        let Some((tokens, kv)) = self.prompt_rows.take(layout_key(&self.ctx_chunks)) else {
            return Ok(());
        };
        if kv.offset() != self.ctx.rotary_end() {
            return Ok(());
        }
        self.ctx.push(&kv).map_err(model("prompt rows back"))?;
        self.bytes_moved += kv.kv_bytes() as u64;
        self.prompt_tail = tokens;
        Ok(())
    }
}

impl Encoder for SessionEncoder {
    fn layout(&self) -> KvLayout {
        self.model.layout()
    }
    fn rope(&self) -> &RopeSpec {
        self.model.rope()
    }
    fn span(&self, chunk: &ChunkId, n_tokens: usize) -> i64 {
        self.spans.get(chunk).copied().unwrap_or(n_tokens as i64)
    }
    fn prefill_alone(&mut self, chunk: ChunkId) -> std::result::Result<ChunkKv, BoxError> {
        Ok(self.prefill_alone_kv("prefill alone", &chunk)?.chunk)
    }
    fn prefill_after(
        &mut self,
        chunk: ChunkId,
        at: i64,
        prior: &Prior<'_>,
        version: u64,
    ) -> std::result::Result<ChunkKv, BoxError> {
        self.sync_to(prior, false)?;
        if self.ctx.rotary_end() != at {
            return Err(format!(
                "prefill of {chunk} at {at}: the context ends at {}",
                self.ctx.rotary_end()
            )
            .into());
        }
        let kv = self.prefill_in_place(chunk, at)?;
        self.ctx_chunks.push((chunk, version));
        self.ahead.handed_out(chunk, version);
        Ok(kv)
    }
    fn ahead(&mut self, prefills: &[(ChunkId, i64)]) {
        self.ahead.announce(prefills);
    }
    fn reuse(
        &mut self,
        kv: &ChunkKv,
        patch: Option<&Patch>,
        at: i64,
        _dtype: DType,
    ) -> std::result::Result<ChunkKv, BoxError> {
        Ok(self.backend.reuse(kv, patch, self.model.rope(), at)?)
    }
    fn sync(&mut self, prior: &Prior<'_>) -> std::result::Result<(), BoxError> {
        self.ahead.clear();
        Ok(self.sync_to(prior, true)?)
    }
}
