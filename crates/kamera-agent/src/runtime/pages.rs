//! Pages as chunks: a page whose chunk text is longer than a chunk's cap
//! ([`Session::page_cap`]) becomes several chunks, its blocks in reading order, each content
//! addressed on its own, so an unchanged block of a changed page is still a hit and a page of any
//! length runs in a window of any size (a page's later blocks evict its earlier ones; recall by
//! relevance brings back the block a question is about).
//!
//! The text is split on line boundaries (the observation's page text is one DOM block per
//! line), never inside a line unless that line alone exceeds the cap; then it is split between
//! words, and a word longer than the cap between characters. The first block keeps the page's
//! header line (`Page "title" (path):`); each later block opens with the same header marked
//! `continued (part k)`, and each block but the last ends with `(continues in part k+1)`. A page
//! that fits is one chunk, its text unchanged.

use std::ops::Range;

use kamera_sched::Visit;
use kamera_store::ChunkId;

use crate::error::{Error, Result};
use crate::runtime::session::{Applied, Session};

/// Default cap of a page chunk's tokens ([`crate::SessionConfig::chunk_tokens_max`]).
pub const CHUNK_TOKENS_MAX: usize = 512;

/// One block of a page: the chunk text the model reads, and which bytes of the page's text it
/// holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The chunk's text: header, the page's lines in `body`, and the continuation line.
    pub text: String,
    /// The bytes of the page's chunk text this block carries (after the header line, which every
    /// block repeats). Consecutive blocks' ranges are adjacent and together reach the text's end.
    pub body: Range<usize>,
    /// Tokens of `text`, as the splitter counted them.
    pub tokens: usize,
}

/// What observing a page did.
#[derive(Debug, Clone, Default)]
pub struct ObservedPage {
    /// The blocks' plans, in order, merged: `chunk` names the page's first block (its header),
    /// `visit` is the costliest of its blocks' visits (new, stored, recall, hit).
    pub applied: Applied,
    /// The page's chunks, in reading order (one for a page that fits a chunk).
    pub chunks: Vec<ChunkId>,
    /// Tokens of all of them.
    pub tokens: usize,
}

/// Splits a page's chunk text into blocks of at most `cap` tokens as `count` measures them (see
/// the module docs). Deterministic; a text that fits is one block, unchanged.
pub fn split_page(text: &str, cap: usize, count: &mut dyn FnMut(&str) -> Result<usize>) -> Result<Vec<Block>> {
    let n = count(text)?;
    if n <= cap {
        return Ok(vec![Block {
            text: text.to_string(),
            body: 0..text.len(),
            tokens: n,
        }]);
    }
    let bad = |detail: String| Error::Runtime {
        op: "split page",
        detail,
    };
    // The header: the first line, where there is one and it is short beside the cap.
    let header = match text.find('\n') {
        Some(i) if count(&text[..i])? <= cap / 4 => &text[..i],
        _ => "",
    };
    let body_start = if header.is_empty() { 0 } else { header.len() + 1 };
    let heads = Heads { header };
    // Room for the page's own text in one block: the cap less the longest header and footer a
    // block can carry (part numbers of up to five digits) and a margin for merges at the seams.
    let overhead = count(&heads.open(99_999))? + count(&heads.close(99_999))? + 4;
    let room = cap.checked_sub(overhead).filter(|r| *r > 0).ok_or_else(|| {
        bad(format!(
            "a cap of {cap} tokens leaves no room after the header ({overhead} tokens)"
        ))
    })?;
    // Pieces: lines (with their newline), a line over `room` split between words, then chars.
    let mut pieces: Vec<(Range<usize>, usize)> = Vec::new();
    let mut at = body_start;
    for line in text[body_start..].split_inclusive('\n') {
        let r = at..at + line.len();
        at = r.end;
        let n = count(line)?;
        if n <= room {
            pieces.push((r, n));
        } else {
            split_long(text, r, room, count, &mut pieces)?;
        }
    }
    // Greedy packing by the pieces' own counts, then the block's exact count: a block over the
    // cap gives back its last piece to the next.
    let mut blocks: Vec<Block> = Vec::new();
    let mut i = 0;
    while i < pieces.len() {
        let part = blocks.len() + 1;
        let mut j = i;
        let mut est = overhead;
        while j < pieces.len() && (j == i || est + pieces[j].1 <= cap) {
            est += pieces[j].1;
            j += 1;
        }
        loop {
            let body = pieces[i].0.start..pieces[j - 1].0.end;
            let mut block = heads.render(text, part, body, j == pieces.len());
            let n = count(&block.text)?;
            if n <= cap {
                block.tokens = n;
                blocks.push(block);
                break;
            }
            if j - i == 1 {
                return Err(bad(format!("part {part} holds {n} tokens, over the cap of {cap}")));
            }
            j -= 1;
        }
        i = j;
    }
    Ok(blocks)
}

/// Splits `text[r]` (one line over `room` tokens) between words, a word over `room` between
/// characters (at most `room / 4` of them: no character is more than four byte tokens).
fn split_long(
    text: &str,
    r: Range<usize>,
    room: usize,
    count: &mut dyn FnMut(&str) -> Result<usize>,
    out: &mut Vec<(Range<usize>, usize)>,
) -> Result<()> {
    let mut cur: Option<(Range<usize>, usize)> = None;
    let mut at = r.start;
    for word in text[r].split_inclusive(' ') {
        let w = at..at + word.len();
        at = w.end;
        let n = count(word)?;
        let words = if n <= room {
            vec![(w, n)]
        } else {
            let step = (room / 4).max(1);
            let mut v = Vec::new();
            let mut s = w.start;
            let idx: Vec<usize> = word.char_indices().map(|(k, _)| w.start + k).chain([w.end]).collect();
            for k in (step..idx.len() - 1).step_by(step).chain([idx.len() - 1]) {
                let e = idx[k];
                if e > s {
                    v.push((s..e, count(&text[s..e])?));
                    s = e;
                }
            }
            v
        };
        for (w, n) in words {
            cur = match cur.take() {
                Some((c, m)) if m + n <= room => Some((c.start..w.end, m + n)),
                Some(done) => {
                    out.push(done);
                    Some((w, n))
                }
                None => Some((w, n)),
            };
        }
    }
    out.extend(cur);
    Ok(())
}

/// The lines each block adds around the page's text.
struct Heads<'a> {
    header: &'a str,
}

impl Heads<'_> {
    /// The opening line of part `k` > 1.
    fn open(&self, k: usize) -> String {
        match self.header.strip_suffix(':') {
            Some(h) => format!("{h}, continued (part {k}):\n"),
            None if self.header.is_empty() => format!("(continued, part {k})\n"),
            None => format!("{} (continued, part {k})\n", self.header),
        }
    }
    /// The closing line of a block that part `k` follows.
    fn close(&self, k: usize) -> String {
        format!("(continues in part {k})\n\n")
    }
    fn render(&self, text: &str, part: usize, body: Range<usize>, last: bool) -> Block {
        let mut s = if part == 1 {
            text[..body.start].to_string()
        } else {
            self.open(part)
        };
        s += &text[body.clone()];
        if !last {
            if !s.ends_with('\n') {
                s.push('\n');
            }
            s += &self.close(part + 1);
        }
        Block {
            text: s,
            body,
            tokens: 0,
        }
    }
}

/// Appends a later plan of the same step (another block of the page, a recall by relevance) to
/// `into`'s.
pub(crate) fn merge(into: &mut Applied, later: Applied) {
    into.plan.append(later.plan);
    into.prefill_tokens += later.prefill_tokens;
    into.timings.prefill_ms += later.timings.prefill_ms;
    into.timings.patch_ms += later.timings.patch_ms;
    into.timings.place_ms += later.timings.place_ms;
    into.timings.sync_ms += later.timings.sync_ms;
}

/// The costlier of two visits: new, stored, recall, hit.
pub(crate) fn costlier(a: Visit, b: Visit) -> Visit {
    let rank = |v: Visit| match v {
        Visit::Hit => 0,
        Visit::Recall => 1,
        Visit::Stored => 2,
        Visit::New => 3,
    };
    if rank(b) > rank(a) { b } else { a }
}

impl Session {
    /// Most tokens of one page chunk: [`crate::SessionConfig::chunk_tokens_max`], at most half
    /// the window (so two blocks of a page always fit), at least one.
    pub fn page_cap(&self) -> usize {
        self.cfg.chunk_tokens_max.min(self.cfg.window_tokens / 2).max(1)
    }

    /// The blocks `text` (a page's chunk text, [`crate::chunk_text`]) becomes under this session's
    /// tokenizer and [`Session::page_cap`].
    pub fn page_blocks(&self, text: &str) -> Result<Vec<Block>> {
        let cap = self.page_cap();
        split_page(text, cap, &mut |s| Ok(self.tokenize(s, false)?.len()))
    }

    /// A page observed: its blocks ([`Session::page_blocks`]) are met by the window in reading
    /// order, each one chunk ([`Session::observe`]). A block evicts what the window's eviction
    /// order says, the page's own earlier blocks last under recency; each is at most half the
    /// window, so the newest always fits. Of a page longer than the window, the leading blocks
    /// that its later ones would evict again are met only if the window has never seen them (to
    /// prefill and store them once): one it holds in the store stays there, ready for a recall.
    pub fn observe_page(&mut self, text: &str) -> Result<ObservedPage> {
        let blocks = self.page_blocks(text)?;
        // Blocks from `tail` on fit the window together.
        let mut tail = blocks.len();
        let mut room = self.cfg.window_tokens;
        while tail > 0 && blocks[tail - 1].tokens <= room {
            room -= blocks[tail - 1].tokens;
            tail -= 1;
        }
        let mut page = ObservedPage::default();
        let mut met = 0;
        for (k, b) in blocks.iter().enumerate() {
            let id = self.chunk_id(&b.text);
            if k < tail && self.window.is_evicted(&id) {
                page.tokens += b.tokens;
                page.chunks.push(id);
                continue;
            }
            let a = self.observe(&b.text)?;
            page.tokens += self.chunk_tokens(&id).map_or(b.tokens, <[u32]>::len);
            page.chunks.push(id);
            met += 1;
            if met == 1 {
                page.applied = Applied {
                    chunk: Some(page.chunks[0]),
                    ..a
                };
            } else {
                page.applied.visit = match (page.applied.visit, a.visit) {
                    (Some(x), Some(y)) => Some(costlier(x, y)),
                    (x, y) => x.or(y),
                };
                merge(&mut page.applied, a);
            }
        }
        if blocks.len() > 1 {
            tracing::debug!(
                blocks = blocks.len(),
                met,
                tokens = page.tokens,
                "page observed as several chunks"
            );
        }
        Ok(page)
    }

    /// Recall by relevance ([`Session::recall_relevant`]) while `page` (the current page's
    /// chunks, [`ObservedPage::chunks`]) is on screen. The page keeps up to half the window: its
    /// last block, then its blocks most relevant to `query` (on a tie, the later) while they fit
    /// in half of `window_tokens`, rank above every other chunk, so no other page's chunk evicts
    /// them; the page's other blocks and every other chunk compete on their scores for the rest,
    /// so a question about an earlier page (or an evicted block of this one) can always bring it
    /// back. An evicted block of the page comes back only on its own score's merit
    /// ([`Session::recall_scores`], above [`crate::SessionConfig::min_relevance`]).
    pub fn recall_relevant_page(&mut self, query: &str, page: &[ChunkId]) -> Result<Applied> {
        let scores = self.recall_scores(query);
        let score = |id: &ChunkId| scores.get(id).copied().unwrap_or(0.0);
        let tokens = |id: &ChunkId| self.chunk_tokens(id).map_or(0, <[u32]>::len);
        let mut kept: Vec<ChunkId> = page.last().into_iter().copied().collect();
        let mut used: usize = kept.iter().map(tokens).sum();
        let mut cands: Vec<(usize, &ChunkId)> = page
            .iter()
            .enumerate()
            .filter(|(_, id)| self.window.slot(id).is_some() || score(id) > self.cfg.min_relevance)
            .collect();
        cands.sort_by(|a, b| score(b.1).total_cmp(&score(a.1)).then(b.0.cmp(&a.0)));
        for (_, id) in cands {
            let n = tokens(id);
            if !kept.contains(id) && used + n <= self.cfg.window_tokens / 2 {
                kept.push(*id);
                used += n;
            }
        }
        let lift = scores.values().copied().fold(0.0, f64::max) + 1.0;
        tracing::debug!(
            kept = ?kept.iter().map(kamera_sched::short).collect::<Vec<_>>(),
            scores = ?scores.iter().map(|(id, s)| (kamera_sched::short(id), (s * 100.0).round() / 100.0, self.window.slot(id).is_some())).collect::<Vec<_>>(),
            "recall for a page's query"
        );
        for (id, s) in &scores {
            let s = match kept.iter().position(|k| k == id) {
                Some(0) => f64::INFINITY,
                Some(_) => s + lift,
                None => *s,
            };
            self.window.set_relevance(id, s);
        }
        self.recall_scored(!page.is_empty())
    }

    /// Brings back the evicted chunks whose relevance, as set on the window, is above
    /// [`crate::SessionConfig::min_relevance`] (what [`Session::recall_relevant`] and the
    /// page-aware recall end with); then, where `question` (a page is on screen, its question
    /// about to be asked), the resident chunks placed blind are prefilled again where the cost
    /// model says a read of blind KV costs more KL than its budget
    /// ([`kamera_sched::Window::repair_read`]). All of them, not only the page's: the answer reads
    /// the whole window, and a blind page just before the question (the tracking page after
    /// the order page it was asked on) moved Qwen2.5-0.5B's answer by a KL of 0.12 at window
    /// 1024 where its own page had been prefilled again.
    pub(crate) fn recall_scored(&mut self, question: bool) -> Result<Applied> {
        let store = self.store.clone();
        let mut plan = self
            .window
            .recall_relevant(self.cfg.min_relevance, &|k| Self::stored(store.as_ref(), k))?;
        self.stats.recalls += plan.count("place") + plan.count("prefill");
        if question {
            let resident: Vec<ChunkId> = self.window.slots().iter().map(|s| s.chunk).collect();
            let repair = self.window.repair_read(&resident);
            self.stats.read_repair_tokens += repair.prefill_tokens(|id| self.tokens_of(id));
            plan.append(repair);
        }
        self.apply(None, None, plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per word and per newline: a tokenizer for the splitter's own tests.
    fn words(s: &str) -> Result<usize> {
        Ok(s.split_whitespace().count() + s.matches('\n').count())
    }

    fn page(lines: usize) -> String {
        let body: Vec<String> = (0..lines)
            .map(|i| format!("line {i} of the directory: person {i} in team {}", i % 7))
            .collect();
        format!("Page \"Directory\" (/people):\n{}\n\n", body.join("\n"))
    }

    fn check(text: &str, blocks: &[Block], cap: usize) {
        let first = text.find('\n').unwrap() + 1;
        assert_eq!(blocks[0].body.start, first);
        assert!(blocks[0].text.starts_with(&text[..first]));
        for (k, b) in blocks.iter().enumerate() {
            assert_eq!(words(&b.text).unwrap(), b.tokens);
            assert!(b.tokens <= cap, "part {}: {:?}", k + 1, b.text);
            assert!(b.text.contains(&text[b.body.clone()]), "part {} holds its text", k + 1);
            if k > 0 {
                assert_eq!(blocks[k - 1].body.end, b.body.start, "adjacent, in reading order");
                assert!(
                    b.text
                        .starts_with(&format!("Page \"Directory\" (/people), continued (part {}):\n", k + 1))
                );
            }
            if k + 1 < blocks.len() {
                assert!(b.text.ends_with(&format!("(continues in part {})\n\n", k + 2)));
            }
        }
        assert_eq!(blocks.last().unwrap().body.end, text.len(), "nothing left out");
        let joined: String = blocks.iter().map(|b| &text[b.body.clone()]).collect();
        assert_eq!(format!("{}{joined}", &text[..first]), text);
    }

    #[test]
    fn a_page_that_fits_is_one_block_unchanged() {
        let text = page(3);
        let blocks = split_page(&text, 200, &mut words).unwrap();
        let tokens = words(&text).unwrap();
        assert_eq!(
            blocks,
            vec![Block {
                text: text.clone(),
                body: 0..text.len(),
                tokens
            }]
        );
    }

    #[test]
    fn blocks_in_reading_order_under_the_cap_with_all_content() {
        let text = page(120);
        for cap in [40, 64, 100, 257] {
            let blocks = split_page(&text, cap, &mut words).unwrap();
            assert!(blocks.len() > 1, "cap {cap}");
            check(&text, &blocks, cap);
            // Whole lines: no block starts inside a line.
            for b in &blocks {
                assert!(text[..b.body.start].ends_with('\n'));
            }
            assert_eq!(split_page(&text, cap, &mut words).unwrap(), blocks, "deterministic");
        }
    }

    #[test]
    fn a_line_over_the_cap_is_split_between_words_then_characters() {
        let long: String = (0..300).map(|i| format!("w{i} ")).collect();
        let blob = "x".repeat(500);
        let text = format!("Page \"Directory\" (/people):\nshort line\n{long}\n{blob}\nlast line\n\n");
        // One token per 4 bytes of a word, as a byte-pair tokenizer might.
        let mut count = |s: &str| -> Result<usize> {
            Ok(s.split_whitespace().map(|w| w.len().div_ceil(4)).sum::<usize>() + s.matches('\n').count())
        };
        let blocks = split_page(&text, 48, &mut count).unwrap();
        for b in &blocks {
            assert!(count(&b.text).unwrap() <= 48, "{:?}", b.text);
        }
        let first = text.find('\n').unwrap() + 1;
        let joined: String = blocks.iter().map(|b| &text[b.body.clone()]).collect();
        assert_eq!(format!("{}{joined}", &text[..first]), text);
        assert!(blocks.len() > 300 / 40);
    }

    #[test]
    fn an_unchanged_leading_block_of_a_changed_page_keeps_its_text() {
        let a = page(120);
        let b = a.replace("line 119 of", "line 119 (edited) of");
        let (ba, bb) = (
            split_page(&a, 64, &mut words).unwrap(),
            split_page(&b, 64, &mut words).unwrap(),
        );
        assert_eq!(ba[0], bb[0]);
        assert_eq!(ba[1], bb[1]);
        assert_ne!(ba.last(), bb.last());
    }

    #[test]
    fn a_cap_too_small_for_the_header_is_an_error() {
        let text = page(50);
        let e = split_page(&text, 8, &mut words).unwrap_err().to_string();
        assert!(e.contains("no room"), "{e}");
    }
}
