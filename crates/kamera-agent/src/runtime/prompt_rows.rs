//! Prompt rows kept per window layout. A layout is the chunks a live context holds with their
//! versions, which name what each chunk's KV was computed from (kamera-sched's versions). When
//! the window changes, the rows of the last model call's prompt (computed over the old window) are
//! set aside under that window's layout; when a layout comes back (a revisit, a recall, a plan
//! that returns to an earlier window) its prompt rows go back after it. A layout keeps several
//! prompts, as a radix prefix cache keeps several branches after one prefix: a call whose prompt
//! shares more with a kept one than with the last call's swaps them ([`crate::Live::prompt`]), and
//! the next call prefills only where its prompt differs. Bounded by tokens, least recently kept
//! dropped first.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};

use kamera_ops::ChunkKv;
use kamera_store::ChunkId;

/// Prompt tokens kept over all layouts: each token is one row of KV, so this bounds the memory
/// beside the window and the store (`kamera bench session` gives its radix cache the same bytes).
/// 4096 holds the branches of a walk's cycle: several layouts, each with the step prompts of its
/// pages and questions (14-44 tokens each on the session bench's walk).
pub const PROMPT_ROWS_TOKENS: usize = 4096;

/// A window layout: the chunks a live context holds from position 0, with their versions.
pub(crate) fn layout_key(chunks: &[(ChunkId, u64)]) -> u64 {
    let mut h = DefaultHasher::new();
    chunks.hash(&mut h);
    h.finish()
}

/// How many leading tokens `a` and `b` share.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// One kept prompt: its tokens and their KV rows (at the window's end).
struct Kept {
    layout: u64,
    tokens: Vec<u32>,
    kv: ChunkKv,
}

/// The kept prompts, oldest first.
#[derive(Default)]
pub(crate) struct PromptRows {
    kept: VecDeque<Kept>,
    tokens: usize,
}

impl PromptRows {
    /// Keeps `tokens` and their rows `kv` for `layout` (a prompt of that layout that starts
    /// `tokens` is replaced, one that `tokens` starts makes this one redundant), then drops the
    /// oldest until the total fits [`PROMPT_ROWS_TOKENS`].
    pub fn keep(&mut self, layout: u64, tokens: Vec<u32>, kv: ChunkKv) {
        if tokens.is_empty() || tokens.len() > PROMPT_ROWS_TOKENS || tokens.len() != kv.n_tokens() {
            return;
        }
        let covered = |k: &Kept| k.layout == layout && k.tokens.starts_with(&tokens);
        if let Some(i) = self.kept.iter().position(covered) {
            // Already kept (in a longer prompt): it becomes the most recent.
            let k = self.kept.remove(i).expect("found");
            self.kept.push_back(k);
            return;
        }
        let before = self.kept.len();
        self.kept
            .retain(|k| !(k.layout == layout && tokens.starts_with(&k.tokens)));
        if self.kept.len() != before {
            self.tokens = self.kept.iter().map(|k| k.tokens.len()).sum();
        }
        self.tokens += tokens.len();
        self.kept.push_back(Kept { layout, tokens, kv });
        while self.tokens > PROMPT_ROWS_TOKENS {
            let Some(old) = self.kept.pop_front() else { break };
            self.tokens -= old.tokens.len();
        }
    }

    /// The prompt kept last for `layout`, removed (it goes back into the live context).
    pub fn take(&mut self, layout: u64) -> Option<(Vec<u32>, ChunkKv)> {
        let i = self.kept.iter().rposition(|k| k.layout == layout)?;
        self.remove(i)
    }

    /// How many leading tokens of `prompt` the best kept prompt of `layout` holds.
    #[cfg(test)]
    pub fn best_prefix(&self, layout: u64, prompt: &[u32]) -> usize {
        self.best(layout, prompt).map_or(0, |(_, n)| n)
    }

    /// The kept prompt of `layout` sharing the most leading tokens with `prompt`, removed, if
    /// it shares more than `than` (what the live context already holds).
    pub fn take_best(&mut self, layout: u64, prompt: &[u32], than: usize) -> Option<(Vec<u32>, ChunkKv)> {
        let (i, _) = self.best(layout, prompt).filter(|(_, n)| *n > than)?;
        self.remove(i)
    }

    fn best(&self, layout: u64, prompt: &[u32]) -> Option<(usize, usize)> {
        self.kept
            .iter()
            .enumerate()
            .filter(|(_, k)| k.layout == layout)
            .map(|(i, k)| (i, common_prefix(&k.tokens, prompt)))
            .filter(|(_, n)| *n > 0)
            .max_by_key(|(i, n)| (*n, *i))
    }

    fn remove(&mut self, i: usize) -> Option<(Vec<u32>, ChunkKv)> {
        let k = self.kept.remove(i)?;
        self.tokens -= k.tokens.len();
        Some((k.tokens, k.kv))
    }

    /// Tokens kept over all layouts.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kamera_ops::{DType, KvLayout};

    fn rows(n: usize) -> ChunkKv {
        let layout = KvLayout::mha(1, 1, 2);
        ChunkKv::zeros(layout, 0, n, DType::F32).unwrap()
    }

    #[test]
    fn a_layout_gets_its_own_prompt_back_once_and_the_oldest_go_first() {
        let mut p = PromptRows::default();
        let (a, b) = (
            layout_key(&[(ChunkId([1; 32]), 1)]),
            layout_key(&[(ChunkId([1; 32]), 2)]),
        );
        assert_ne!(a, b, "a version is part of the layout");
        p.keep(a, vec![1, 2, 3], rows(3));
        p.keep(b, vec![4, 5], rows(2));
        assert_eq!(p.take(a).map(|t| t.0), Some(vec![1, 2, 3]));
        assert!(p.take(a).is_none(), "taken back into the context, not copied");
        p.keep(b, vec![6], rows(1));
        assert_eq!(p.tokens(), 3, "the taken prompt is gone; b keeps both of its prompts");
        p.keep(a, vec![7; 3], rows(2));
        assert_eq!(p.tokens(), 3, "tokens without their rows are not kept");
        let big = PROMPT_ROWS_TOKENS - 2;
        p.keep(a, vec![0; big], rows(big));
        assert_eq!(p.tokens(), big + 1, "the oldest went first");
        assert_eq!(p.best_prefix(b, &[4, 5]), 0);
        p.keep(layout_key(&[]), vec![9, 9], rows(2));
        assert!(p.take(b).is_none(), "then the next oldest");
        assert_eq!(p.tokens(), big + 2);
    }

    /// A layout keeps several prompts (branches after one window); a prompt that another
    /// starts is not kept twice; the best match for a new prompt is the longest shared start.
    #[test]
    fn a_layout_keeps_its_branches_and_gives_the_longest_match() {
        let mut p = PromptRows::default();
        let a = layout_key(&[(ChunkId([1; 32]), 1)]);
        let other = layout_key(&[(ChunkId([2; 32]), 1)]);
        p.keep(a, vec![1, 2, 3, 4], rows(4));
        p.keep(a, vec![1, 2, 9], rows(3));
        p.keep(other, vec![1, 2, 3, 4, 5], rows(5));
        assert_eq!(p.tokens(), 12);
        assert_eq!(p.best_prefix(a, &[1, 2, 3, 7]), 3);
        assert_eq!(p.best_prefix(a, &[1, 2, 9, 9]), 3);
        assert_eq!(p.best_prefix(a, &[5]), 0);
        p.keep(a, vec![1, 2], rows(2));
        assert_eq!(p.tokens(), 12, "a start of a kept prompt adds nothing");
        p.keep(a, vec![1, 2, 3, 4, 6], rows(5));
        assert_eq!(p.tokens(), 13, "a longer prompt replaces the one it starts with");
        assert_eq!(
            p.take_best(a, &[1, 2, 3, 4, 6, 0], 0).map(|t| t.0),
            Some(vec![1, 2, 3, 4, 6])
        );
        assert_eq!(p.best_prefix(a, &[1, 2, 3, 4, 6, 0]), 2, "taken out");
        assert_eq!(p.take(a).map(|t| t.0), Some(vec![1, 2, 9]));
        assert_eq!(p.best_prefix(other, &[1, 2, 3, 4, 5]), 5);
    }
}
