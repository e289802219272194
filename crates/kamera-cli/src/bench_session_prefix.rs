//! The radix cache's side of `kamera bench session`: its own layout (pages appended in visit
//! order after the pinned prefix, the oldest half of the window dropped in one batch when it
//! overflows, as llama.cpp's context shift does) and the radix trie of `bench_session_radix`
//! holding real KV rows (`ChunkKv` cut from the model's `Context`). A request is a list of
//! pieces, text runs and screenshots; the trie keys text by its tokens and a screenshot by one
//! key from its content hash (SGLang's radix cache pads image tokens with the image's hash the
//! same way), so a screenshot is matched whole or not at all and its rows are never split. Like
//! SGLang's `MultiModalCache`, it keeps the vision tower's outputs by image, least recently used
//! out first past a byte budget (SGLang's default: 100 MB), so a screenshot whose rows were
//! evicted is prefilled again without the tower.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use kamera_model::vision::RgbImage;
use kamera_model::vl::Grid;
use kamera_model::{Context, Model};
use kamera_ops::ChunkKv;

use super::radix::{Payload, RadixTrie};

/// A screenshot in a request: its pixels, its patch grid at the session's pixel budget, its
/// chunk tokens (vision markers and pads) and the one trie key it is matched by.
#[derive(Debug)]
pub struct Screenshot {
    pub key: u32,
    pub image: RgbImage,
    pub grid: Grid,
    pub tokens: Vec<u32>,
    /// Positions the chunk spans.
    pub span: i64,
}

/// Trie keys of screenshots have the top bit set: no text token id reaches it.
const IMAGE_KEY: u32 = 1 << 31;

impl Screenshot {
    /// Decodes `png` and sizes it as the session does (`max_pixels`).
    pub fn new(model: &Model, png: &[u8], max_pixels: usize) -> Result<Screenshot> {
        let vision = model.vision().context("a screenshot needs a vision-language model")?;
        let image = RgbImage::decode_png(png)?;
        let grid = vision
            .preprocess_config()
            .clone()
            .with_max_pixels(max_pixels)
            .grid(image.height(), image.width())?;
        let digest = kamera_agent::sha256_hex(png);
        let key = IMAGE_KEY | (u32::from_str_radix(&digest[..8], 16)? & !IMAGE_KEY);
        Ok(Screenshot {
            key,
            tokens: vision.chunk_tokens(grid),
            span: vision.chunk_span(grid),
            image,
            grid,
        })
    }
}

/// A run of a request: text tokens, or one screenshot.
#[derive(Debug, Clone)]
pub enum Piece {
    Text(Vec<u32>),
    Image(Arc<Screenshot>),
}

impl Piece {
    /// Trie keys: a text run's tokens, a screenshot's one key.
    fn keys(&self) -> usize {
        match self {
            Piece::Text(t) => t.len(),
            Piece::Image(_) => 1,
        }
    }
    /// Rows (tokens) in the model's context.
    fn rows(&self) -> usize {
        match self {
            Piece::Text(t) => t.len(),
            Piece::Image(s) => s.tokens.len(),
        }
    }
    pub fn tokens(&self) -> &[u32] {
        match self {
            Piece::Text(t) => t,
            Piece::Image(s) => &s.tokens,
        }
    }
}

/// The trie keys of `pieces`, in order.
pub fn keys(pieces: &[Piece]) -> Vec<u32> {
    let mut out = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.extend(t),
            Piece::Image(s) => out.push(s.key),
        }
    }
    out
}

/// Context rows of the first `n` keys of `pieces`.
fn rows_of(pieces: &[Piece], mut n: usize) -> usize {
    let mut rows = 0;
    for p in pieces {
        let k = p.keys().min(n);
        rows += if k == p.keys() { p.rows() } else { k };
        n -= k;
    }
    rows
}

/// The radix cache's vision-tower outputs by screenshot key, in the Session's own
/// [`kamera_agent::TowerCache`] (least recently used out first past a budget of bytes).
pub struct Towers {
    cache: kamera_agent::TowerCache<u32>,
    /// Screenshots run through the tower, and those served from the cache.
    pub encoded: usize,
    pub hits: usize,
}

impl Towers {
    pub fn new(budget_bytes: usize) -> Towers {
        Towers {
            cache: kamera_agent::TowerCache::new(budget_bytes),
            encoded: 0,
            hits: 0,
        }
    }

    /// `s`'s tower output: from the cache, or resized and encoded (then kept within the budget).
    fn embeds(&mut self, model: &Model, s: &Screenshot, max_pixels: usize) -> Result<Arc<Vec<f32>>> {
        if let Some(e) = self.cache.get(&s.key) {
            self.hits += 1;
            return Ok(e);
        }
        let vision = model.vision().context("a screenshot needs a vision-language model")?;
        let (_, out) = vision.encode_image(&s.image, Some(max_pixels))?;
        self.encoded += 1;
        Ok(self.cache.insert(s.key, out.embeds))
    }
}

/// Appends `pieces` from key `from` on to `ctx` (which holds the rows of the keys before it):
/// text by the model's prefill, each screenshot's tower output (from `tower`, or resized and
/// encoded) prefilled at its 3-D positions. Returns the last token's logits.
pub fn extend(
    model: &Model,
    pieces: &[Piece],
    from: usize,
    max_pixels: usize,
    tower: &mut Towers,
    ctx: &mut Context,
) -> Result<Vec<f32>> {
    let mut logits = Vec::new();
    let mut at = 0;
    for p in pieces {
        let (start, end) = (at, at + p.keys());
        at = end;
        if end <= from {
            continue;
        }
        logits = match p {
            Piece::Text(t) => model.extend(&t[from.saturating_sub(start)..], ctx)?.logits,
            Piece::Image(s) => {
                anyhow::ensure!(from <= start, "radix cache: a screenshot matched in part");
                let embeds = tower.embeds(model, s, max_pixels)?;
                model.extend_image(s.grid, &embeds, ctx)?.logits
            }
        };
    }
    anyhow::ensure!(!logits.is_empty(), "radix cache: nothing to prefill after key {from}");
    Ok(logits)
}

/// A trie node's rows: runs of text rows, and whole screenshots' rows with their spans.
pub struct Rows {
    parts: Vec<(ChunkKv, Option<i64>)>,
}

impl Rows {
    /// The rows of keys `a..b` of `pieces`, cut from `ctx` (which holds at least them).
    fn cut(pieces: &[Piece], a: usize, b: usize, ctx: &Context) -> Result<Rows> {
        let mut parts = Vec::new();
        let (mut key, mut row) = (0, 0);
        for p in pieces {
            let (k0, k1) = (key.max(a), (key + p.keys()).min(b));
            if k0 < k1 {
                match p {
                    Piece::Text(_) => parts.push((ctx.rows_chunk(row + k0 - key, k1 - k0)?, None)),
                    Piece::Image(s) => parts.push((ctx.rows_chunk(row, p.rows())?, Some(s.span))),
                }
            }
            key += p.keys();
            row += p.rows();
        }
        Ok(Rows { parts })
    }

    /// Appends the rows to `ctx`.
    fn push_into(&self, ctx: &mut Context) -> Result<()> {
        for (kv, span) in &self.parts {
            match span {
                Some(s) => ctx.push_spanned(kv, *s)?,
                None => ctx.push(kv)?,
            }
        }
        Ok(())
    }
}

impl Payload for Rows {
    fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.0.kv_bytes()).sum()
    }
    /// Splits after `at` keys: a text run is cut between rows, a screenshot never.
    fn split_off(&mut self, mut at: usize) -> Result<Rows> {
        let mut i = 0;
        while i < self.parts.len() {
            let keys = if self.parts[i].1.is_some() {
                1
            } else {
                self.parts[i].0.n_tokens()
            };
            if at < keys {
                break;
            }
            at -= keys;
            i += 1;
        }
        let mut tail = self.parts.split_off(i);
        if at > 0 {
            let (kv, span) = &mut tail[0];
            anyhow::ensure!(span.is_none(), "radix split inside a screenshot");
            let ctx = Context::from_chunk(kv)?;
            self.parts.push((ctx.rows_chunk(0, at)?, None));
            *kv = ctx.rows_chunk(at, kv.n_tokens() - at)?;
        }
        Ok(Rows { parts: tail })
    }
}

/// The pages a transcript-style agent keeps: the pinned prefix, then each page the first time it
/// is seen (a page still in the list is not appended again: the layout that serves a prefix
/// cache best). When a new page does not fit the window's page budget (in tokens, a
/// screenshot's counted), the oldest pages are dropped in one batch freeing at least half of it.
pub struct AppendLayout {
    prefix: Vec<u32>,
    budget: usize,
    pages: Vec<(String, Vec<Piece>)>,
}

/// What a visit did to the layout.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LayoutChange {
    /// The page was already in the list.
    pub hit: bool,
    /// Tokens dropped right after the pinned prefix (a context shift), if any.
    pub dropped: usize,
}

fn tokens_of(pieces: &[Piece]) -> usize {
    pieces.iter().map(Piece::rows).sum()
}

impl AppendLayout {
    pub fn new(prefix: Vec<u32>, budget: usize) -> AppendLayout {
        AppendLayout {
            prefix,
            budget,
            pages: Vec::new(),
        }
    }

    pub fn prefix_len(&self) -> usize {
        self.prefix.len()
    }

    fn used_after(&self, n: usize) -> usize {
        self.pages[n..].iter().map(|p| tokens_of(&p.1)).sum()
    }

    pub fn visit(&mut self, key: &str, page: &[Piece]) -> LayoutChange {
        if self.pages.iter().any(|p| p.0 == key) {
            return LayoutChange { hit: true, dropped: 0 };
        }
        let n = tokens_of(page);
        let mut dropped = 0;
        if self.used_after(0) + n > self.budget {
            let mut k = 0;
            while k < self.pages.len() && (dropped < self.budget / 2 || self.used_after(k) + n > self.budget) {
                dropped += tokens_of(&self.pages[k].1);
                k += 1;
            }
            self.pages.drain(..k);
        }
        self.pages.push((key.to_string(), page.to_vec()));
        LayoutChange { hit: false, dropped }
    }

    /// The prefix and the pages, in order.
    pub fn pieces(&self) -> Vec<Piece> {
        let mut out = vec![Piece::Text(self.prefix.clone())];
        for p in &self.pages {
            out.extend(p.1.iter().cloned());
        }
        out
    }

    /// The prefix's and the pages' tokens, in order.
    #[cfg(test)]
    fn tokens(&self) -> Vec<u32> {
        self.pieces().iter().flat_map(|p| p.tokens().to_vec()).collect()
    }
}

/// A radix cache serving requests on the model: the trie of KV rows, and the context of the last
/// request (reused in place when it holds the matched prefix, as a paged cache would; otherwise
/// the matched rows are copied from the trie's nodes, counted in the time to first token).
pub struct RadixCache {
    pub trie: RadixTrie<Rows>,
    pub tower: Towers,
    /// A screenshot's pixel budget (the session's).
    max_pixels: usize,
    live: Option<(Vec<u32>, Context)>,
}

/// One request served by the radix cache.
pub struct RadixRun {
    pub logits: Vec<f32>,
    /// Tokens (context rows) reused and prefilled.
    pub reused: usize,
    pub prefilled: usize,
    pub ttft_ms: f64,
    /// Time to first token plus the insertion of the new suffix's rows and the eviction.
    pub work_ms: f64,
    /// Of the time to first token, copying matched rows out of the trie.
    pub copy_ms: f64,
    /// Screenshots run through the vision tower (after the matched prefix, not in the tower's
    /// cache).
    pub images: usize,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl RadixCache {
    pub fn new(budget_bytes: usize, tower_bytes: usize, max_pixels: usize) -> RadixCache {
        RadixCache {
            trie: RadixTrie::new(budget_bytes),
            tower: Towers::new(tower_bytes),
            max_pixels,
            live: None,
        }
    }

    pub fn run(&mut self, model: &Model, request: &[Piece]) -> Result<RadixRun> {
        let seq = keys(request);
        anyhow::ensure!(!seq.is_empty(), "radix cache: an empty request");
        let t0 = Instant::now();
        let (matched, path) = self.trie.match_prefix(&seq)?;
        // At least the last key runs, for its logits.
        let keep = matched.min(seq.len() - 1);
        let lcp = |a: &[u32]| a.iter().zip(&seq).take_while(|(x, y)| x == y).count();
        let mut copy_ms = 0.0;
        let mut ctx = match self.live.take() {
            Some((keys, ctx)) if lcp(&keys) >= matched && ctx.len() >= rows_of(request, matched) => ctx,
            _ => {
                let tc = Instant::now();
                let mut ctx = model.empty_context();
                for p in self.trie.payloads(&path) {
                    p.push_into(&mut ctx)?;
                }
                copy_ms = ms(tc);
                ctx
            }
        };
        let reused = rows_of(request, keep);
        ctx.truncate(reused);
        let encoded = self.tower.encoded;
        let logits = extend(model, request, keep, self.max_pixels, &mut self.tower, &mut ctx)?;
        let ttft_ms = ms(t0);
        self.trie
            .insert(&seq, matched, &path, |a, b| Rows::cut(request, a, b, &ctx))?;
        let prefilled = ctx.len() - reused;
        let images = self.tower.encoded - encoded;
        self.live = Some((seq, ctx));
        Ok(RadixRun {
            logits,
            reused,
            prefilled,
            ttft_ms,
            work_ms: ms(t0),
            copy_ms,
            images,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{AppendLayout, Piece};

    fn page(t: u32) -> [Piece; 1] {
        [Piece::Text(vec![t; 3])]
    }

    #[test]
    fn layout_appends_new_pages_and_drops_half_in_one_batch() {
        let mut l = AppendLayout::new(vec![0], 10);
        assert!(!l.visit("a", &page(1)).hit);
        assert!(!l.visit("b", &page(2)).hit);
        assert!(l.visit("a", &page(1)).hit);
        assert_eq!(l.visit("c", &page(3)).dropped, 0);
        // 9 + 3 > 10: a and b go (6 >= 5 freed), c stays.
        let ch = l.visit("d", &page(4));
        assert_eq!((ch.hit, ch.dropped), (false, 6));
        assert_eq!(l.tokens(), vec![0, 3, 3, 3, 4, 4, 4]);
        assert!(!l.visit("a", &page(1)).hit, "a dropped page comes back at the end");
    }
}
