//! Prompt rows kept per window layout. When the window changes, the rows of the last model
//! call's prompt (computed over the old window) are set aside under that window's layout: the
//! chunks it held with their versions, which name what each chunk's KV was computed from
//! (kamera-sched's versions). When a layout comes back (a revisit, a recall, a plan that returns
//! to an earlier window) its prompt rows go back after it, and the next call prefills only where
//! its prompt differs: what a radix prefix cache gets from a repeated token sequence, here for
//! any layout the session has held. Bounded by tokens, least recently kept dropped first.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};

use kamera_ops::ChunkKv;
use kamera_store::ChunkId;

/// Prompt tokens kept over all layouts (a few dozen agent prompts; each token is one row of KV,
/// so this bounds the memory beside the window and the store).
pub const PROMPT_ROWS_TOKENS: usize = 1024;

/// A window layout: the chunks a live context holds from position 0, with their versions.
pub(crate) fn layout_key(chunks: &[(ChunkId, u64)]) -> u64 {
    let mut h = DefaultHasher::new();
    chunks.hash(&mut h);
    h.finish()
}

/// One layout's kept prompt: its tokens and their KV rows (at the window's end).
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
    /// Keeps `tokens` and their rows `kv` for `layout` (replacing what that layout had), then
    /// drops the oldest until the total fits [`PROMPT_ROWS_TOKENS`].
    pub fn keep(&mut self, layout: u64, tokens: Vec<u32>, kv: ChunkKv) {
        drop(self.take(layout));
        if tokens.is_empty() || tokens.len() > PROMPT_ROWS_TOKENS || tokens.len() != kv.n_tokens() {
            return;
        }
        self.tokens += tokens.len();
        self.kept.push_back(Kept { layout, tokens, kv });
        while self.tokens > PROMPT_ROWS_TOKENS {
            let Some(old) = self.kept.pop_front() else { break };
            self.tokens -= old.tokens.len();
        }
    }

    /// The prompt kept for `layout`, removed (it goes back into the live context).
    pub fn take(&mut self, layout: u64) -> Option<(Vec<u32>, ChunkKv)> {
        let i = self.kept.iter().position(|k| k.layout == layout)?;
        let k = self.kept.remove(i)?;
        self.tokens -= k.tokens.len();
        Some((k.tokens, k.kv))
    }

    /// Tokens kept over all layouts.
    #[cfg(test)]
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
        assert_eq!(p.tokens(), 1, "a layout keeps one prompt");
        p.keep(a, vec![7; 3], rows(2));
        assert_eq!(p.tokens(), 1, "tokens without their rows are not kept");
        let big = PROMPT_ROWS_TOKENS - 2;
        p.keep(a, vec![0; big], rows(big));
        assert_eq!(p.tokens(), big + 1);
        p.keep(layout_key(&[]), vec![9, 9], rows(2));
        assert!(p.take(b).is_none(), "the oldest went first");
        assert_eq!(p.tokens(), big + 2);
    }
}
