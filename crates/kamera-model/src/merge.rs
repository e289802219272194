//! The merge loop both BPE tokenizers share: a piece's symbols in a linked list, adjacent pairs
//! in a heap best first, stale entries skipped; O(n log n) in the piece's length.

use std::collections::BinaryHeap;

/// A symbol of the piece being merged: a span of its text, linked to its neighbours.
pub(crate) struct Sym {
    pub start: usize,
    pub len: usize,
    pub prev: Option<usize>,
    pub next: Option<usize>,
}

/// One symbol per char of `text`, linked in order.
pub(crate) fn symbols(text: &str) -> Vec<Sym> {
    let mut syms: Vec<Sym> = text
        .char_indices()
        .enumerate()
        .map(|(i, (start, c))| Sym {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        })
        .collect();
    let n = syms.len();
    for i in 0..n.saturating_sub(1) {
        syms[i].next = Some(i + 1);
    }
    syms
}

/// Merges `syms` best pair first. `pair(syms, l, r)` is the heap entry of two adjacent symbols
/// that may merge (`None`: they may not); `left_size(entry)` its left symbol and the merged
/// length, which tells a stale entry (either side merged since) from a live one.
pub(crate) fn merge<E: Ord>(
    syms: &mut [Sym],
    mut pair: impl FnMut(&[Sym], usize, usize) -> Option<E>,
    left_size: impl Fn(&E) -> (usize, usize),
) {
    let mut heap = BinaryHeap::new();
    for i in 1..syms.len() {
        heap.extend(pair(syms, i - 1, i));
    }
    while let Some(e) = heap.pop() {
        let (l, size) = left_size(&e);
        let Some(r) = syms[l].next else { continue };
        if syms[l].len == 0 || syms[l].len + syms[r].len != size {
            continue;
        }
        syms[l].len += syms[r].len;
        syms[r].len = 0;
        syms[l].next = syms[r].next;
        if let Some(nn) = syms[r].next {
            syms[nn].prev = Some(l);
        }
        if let Some(p) = syms[l].prev {
            heap.extend(pair(syms, p, l));
        }
        if let Some(nx) = syms[l].next {
            heap.extend(pair(syms, l, nx));
        }
    }
}
