//! The radix cache's side of `kamera bench session`: its own layout (pages appended in visit
//! order after the pinned prefix, the oldest half of the window dropped in one batch when it
//! overflows, as llama.cpp's context shift does) and the radix trie of `bench_session_radix`
//! holding real KV rows (`ChunkKv` cut from the model's `Context`).

use std::time::Instant;

use anyhow::Result;
use kamera_model::{Context, Model};
use kamera_ops::ChunkKv;

use super::radix::{Payload, RadixTrie};

impl Payload for ChunkKv {
    fn bytes(&self) -> usize {
        self.kv_bytes()
    }
    fn split_off(&mut self, at: usize) -> Result<ChunkKv> {
        let ctx = Context::from_chunk(self)?;
        let tail = ctx.rows_chunk(at, self.n_tokens() - at)?;
        *self = ctx.rows_chunk(0, at)?;
        Ok(tail)
    }
}

/// The pages a transcript-style agent keeps: the pinned prefix, then each page the first time it
/// is seen (a page still in the list is not appended again: the layout that serves a prefix
/// cache best). When a new page does not fit the window's page budget, the oldest pages are
/// dropped in one batch freeing at least half of it.
pub struct AppendLayout {
    prefix: Vec<u32>,
    budget: usize,
    pages: Vec<(String, Vec<u32>)>,
}

/// What a visit did to the layout.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LayoutChange {
    /// The page was already in the list.
    pub hit: bool,
    /// Tokens dropped right after the pinned prefix (a context shift), if any.
    pub dropped: usize,
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

    fn used(&self) -> usize {
        self.pages.iter().map(|p| p.1.len()).sum()
    }

    pub fn visit(&mut self, key: &str, tokens: &[u32]) -> LayoutChange {
        if self.pages.iter().any(|p| p.0 == key) {
            return LayoutChange { hit: true, dropped: 0 };
        }
        let mut dropped = 0;
        if self.used() + tokens.len() > self.budget {
            let mut n = 0;
            while n < self.pages.len() && (dropped < self.budget / 2 || self.used_after(n) + tokens.len() > self.budget)
            {
                dropped += self.pages[n].1.len();
                n += 1;
            }
            self.pages.drain(..n);
        }
        self.pages.push((key.to_string(), tokens.to_vec()));
        LayoutChange { hit: false, dropped }
    }

    fn used_after(&self, n: usize) -> usize {
        self.pages[n..].iter().map(|p| p.1.len()).sum()
    }

    /// The prefix and the pages, in order.
    pub fn tokens(&self) -> Vec<u32> {
        let mut out = self.prefix.clone();
        for p in &self.pages {
            out.extend_from_slice(&p.1);
        }
        out
    }
}

/// A radix cache serving requests on the model: the trie of KV rows, and the context of the last
/// request (reused in place when it holds the matched prefix, as a paged cache would; otherwise
/// the matched rows are copied from the trie's nodes, counted in the time to first token).
pub struct RadixCache {
    pub trie: RadixTrie<ChunkKv>,
    live: Option<(Vec<u32>, Context)>,
}

/// One request served by the radix cache.
pub struct RadixRun {
    pub logits: Vec<f32>,
    pub reused: usize,
    pub prefilled: usize,
    pub ttft_ms: f64,
    /// Time to first token plus the insertion of the new suffix's rows and the eviction.
    pub work_ms: f64,
    /// Of the time to first token, copying matched rows out of the trie.
    pub copy_ms: f64,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl RadixCache {
    pub fn new(budget_bytes: usize) -> RadixCache {
        RadixCache {
            trie: RadixTrie::new(budget_bytes),
            live: None,
        }
    }

    pub fn run(&mut self, model: &Model, seq: &[u32]) -> Result<RadixRun> {
        anyhow::ensure!(!seq.is_empty(), "radix cache: an empty request");
        let t0 = Instant::now();
        let (matched, path) = self.trie.match_prefix(seq)?;
        // At least the last token runs, for its logits.
        let keep = matched.min(seq.len() - 1);
        let lcp = |a: &[u32]| a.iter().zip(seq).take_while(|(x, y)| x == y).count();
        let mut copy_ms = 0.0;
        let mut ctx = match self.live.take() {
            Some((toks, ctx)) if lcp(&toks) >= matched && ctx.len() >= matched => ctx,
            _ => {
                let tc = Instant::now();
                let mut ctx = model.empty_context();
                for p in self.trie.payloads(&path) {
                    ctx.push(p)?;
                }
                copy_ms = ms(tc);
                ctx
            }
        };
        ctx.truncate(keep);
        let logits = model.extend(&seq[keep..], &mut ctx)?.logits;
        let ttft_ms = ms(t0);
        self.trie
            .insert(seq, matched, &path, |a, b| Ok(ctx.rows_chunk(a, b - a)?))?;
        self.live = Some((seq.to_vec(), ctx));
        Ok(RadixRun {
            logits,
            reused: keep,
            prefilled: seq.len() - keep,
            ttft_ms,
            work_ms: ms(t0),
            copy_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::AppendLayout;

    #[test]
    fn layout_appends_new_pages_and_drops_half_in_one_batch() {
        let mut l = AppendLayout::new(vec![0], 10);
        assert!(!l.visit("a", &[1, 1, 1]).hit);
        assert!(!l.visit("b", &[2, 2, 2]).hit);
        assert!(l.visit("a", &[1, 1, 1]).hit);
        assert_eq!(l.visit("c", &[3, 3, 3]).dropped, 0);
        // 9 + 3 > 10: a and b go (6 >= 5 freed), c stays.
        let ch = l.visit("d", &[4, 4, 4]);
        assert_eq!((ch.hit, ch.dropped), (false, 6));
        assert_eq!(l.tokens(), vec![0, 3, 3, 3, 4, 4, 4]);
        assert!(!l.visit("a", &[1, 1, 1]).hit, "a dropped page comes back at the end");
    }
}
