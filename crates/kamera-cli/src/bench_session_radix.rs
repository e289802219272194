//! The radix prefix cache `kamera bench session` compares against (SGLang's RadixAttention, vLLM's
//! automatic prefix caching): a token trie over every sequence served, each node a run of tokens
//! with the KV rows for them. A request walks the trie to its longest cached prefix (splitting a
//! node it leaves midway), extends from there and inserts its new suffix; leaves are evicted least
//! recently used first until the cache holds at most its budget of bytes. Generic over the KV
//! payload so its tests need no model; the bench stores `ChunkKv` rows cut from a `Context`.

use std::collections::BTreeMap;

use anyhow::Result;

/// What a node holds for its run of tokens.
pub trait Payload: Sized {
    /// Bytes held (what the budget counts).
    fn bytes(&self) -> usize;
    /// Keeps the first `at` tokens' rows in `self` and returns the rest.
    fn split_off(&mut self, at: usize) -> Result<Self>;
}

struct Node<P> {
    tokens: Vec<u32>,
    kv: Option<P>,
    parent: usize,
    children: BTreeMap<u32, usize>,
    last_use: u64,
}

/// Counters of what the cache did.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RadixStats {
    pub requests: usize,
    /// Requests that reused at least one cached token.
    pub hits: usize,
    pub tokens_reused: usize,
    pub tokens_inserted: usize,
    pub evicted_nodes: usize,
    pub evicted_bytes: usize,
    pub splits: usize,
}

pub struct RadixTrie<P> {
    /// Node 0 is the root (no tokens, no payload); removed nodes are `None`.
    nodes: Vec<Option<Node<P>>>,
    free: Vec<usize>,
    bytes: usize,
    budget: usize,
    clock: u64,
    pub stats: RadixStats,
}

const ROOT: usize = 0;

impl<P: Payload> RadixTrie<P> {
    pub fn new(budget: usize) -> RadixTrie<P> {
        let root = Node {
            tokens: Vec::new(),
            kv: None,
            parent: ROOT,
            children: BTreeMap::new(),
            last_use: 0,
        };
        RadixTrie {
            nodes: vec![Some(root)],
            free: Vec::new(),
            bytes: 0,
            budget,
            clock: 0,
            stats: RadixStats::default(),
        }
    }

    /// Sets the budget; the bytes held are fitted to it at the next insertion.
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
    }

    /// Bytes of KV held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Nodes held (the root not counted).
    #[cfg(test)]
    fn nodes(&self) -> usize {
        self.nodes.iter().flatten().count() - 1
    }

    fn node(&self, i: usize) -> &Node<P> {
        self.nodes[i].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node<P> {
        self.nodes[i].as_mut().expect("a live node")
    }

    /// The longest cached prefix of `seq`: its length and the nodes along it, in order (each
    /// wholly inside the prefix: a node matched partway is split first). Marks them used.
    pub fn match_prefix(&mut self, seq: &[u32]) -> Result<(usize, Vec<usize>)> {
        self.clock += 1;
        self.stats.requests += 1;
        let (mut at, mut pos, mut path) = (ROOT, 0, Vec::new());
        while pos < seq.len() {
            let Some(&child) = self.node(at).children.get(&seq[pos]) else {
                break;
            };
            let run = &self.node(child).tokens;
            let k = run.iter().zip(&seq[pos..]).take_while(|(a, b)| a == b).count();
            if k < run.len() {
                self.split(child, k)?;
            }
            self.node_mut(child).last_use = self.clock;
            path.push(child);
            pos += k;
            at = child;
        }
        if pos > 0 {
            self.stats.hits += 1;
            self.stats.tokens_reused += pos;
        }
        Ok((pos, path))
    }

    /// Splits node `i` after its first `at` tokens: `i` keeps them, a new child the rest.
    fn split(&mut self, i: usize, at: usize) -> Result<()> {
        let n = self.node_mut(i);
        let tail_tokens = n.tokens.split_off(at);
        let tail_kv = match n.kv.as_mut() {
            Some(kv) => Some(kv.split_off(at)?),
            None => None,
        };
        let (children, last_use) = (std::mem::take(&mut n.children), n.last_use);
        let first = tail_tokens[0];
        let tail = self.alloc(Node {
            tokens: tail_tokens,
            kv: tail_kv,
            parent: i,
            children,
            last_use,
        });
        let grandchildren: Vec<usize> = self.node(tail).children.values().copied().collect();
        for g in grandchildren {
            self.node_mut(g).parent = tail;
        }
        self.node_mut(i).children.insert(first, tail);
        self.stats.splits += 1;
        Ok(())
    }

    fn alloc(&mut self, node: Node<P>) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = Some(node);
                i
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// The payloads of `path` (from [`RadixTrie::match_prefix`]), in order.
    pub fn payloads(&self, path: &[usize]) -> Vec<&P> {
        path.iter().filter_map(|&i| self.node(i).kv.as_ref()).collect()
    }

    /// Inserts `seq` whose first `matched` tokens are the cached prefix ending at `path`'s last
    /// node: `rows(matched, seq.len())` gives the payload of the new suffix. Then evicts least
    /// recently used leaves until the cache fits its budget.
    pub fn insert(
        &mut self,
        seq: &[u32],
        matched: usize,
        path: &[usize],
        rows: impl FnOnce(usize, usize) -> Result<P>,
    ) -> Result<()> {
        let parent = path.last().copied().unwrap_or(ROOT);
        let parent_ends = path.iter().map(|&i| self.node(i).tokens.len()).sum::<usize>();
        anyhow::ensure!(
            parent_ends == matched && matched <= seq.len(),
            "radix insert: the path covers {parent_ends} tokens, the match {matched}"
        );
        if matched < seq.len() {
            let kv = rows(matched, seq.len())?;
            self.bytes += kv.bytes();
            self.stats.tokens_inserted += seq.len() - matched;
            let leaf = self.alloc(Node {
                tokens: seq[matched..].to_vec(),
                kv: Some(kv),
                parent,
                children: BTreeMap::new(),
                last_use: self.clock,
            });
            self.node_mut(parent).children.insert(seq[matched], leaf);
        }
        self.evict();
        Ok(())
    }

    /// Removes least recently used leaves until the bytes held fit the budget.
    fn evict(&mut self) {
        while self.bytes > self.budget {
            let leaf = self
                .nodes
                .iter()
                .enumerate()
                .skip(1)
                .filter_map(|(i, n)| n.as_ref().filter(|n| n.children.is_empty()).map(|n| (n.last_use, i)))
                .min();
            let Some((_, i)) = leaf else { break };
            let n = self.nodes[i].take().expect("a live leaf");
            self.free.push(i);
            let b = n.kv.as_ref().map_or(0, P::bytes);
            self.bytes -= b;
            self.stats.evicted_nodes += 1;
            self.stats.evicted_bytes += b;
            self.node_mut(n.parent).children.remove(&n.tokens[0]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake payload: the tokens themselves, 4 bytes each.
    impl Payload for Vec<u32> {
        fn bytes(&self) -> usize {
            4 * self.len()
        }
        fn split_off(&mut self, at: usize) -> Result<Self> {
            Ok(Vec::split_off(self, at))
        }
    }

    /// Serves `seq` as the bench does: match, check the payloads are the prefix, insert.
    fn serve(t: &mut RadixTrie<Vec<u32>>, seq: &[u32]) -> usize {
        let (m, path) = t.match_prefix(seq).unwrap();
        let got: Vec<u32> = t.payloads(&path).into_iter().flatten().copied().collect();
        assert_eq!(got, seq[..m], "the path's payloads are the matched prefix's rows");
        t.insert(seq, m, &path, |a, b| Ok(seq[a..b].to_vec())).unwrap();
        m
    }

    #[test]
    fn longest_prefix_across_sequences() {
        let mut t = RadixTrie::new(usize::MAX);
        assert_eq!(serve(&mut t, &[1, 2, 3, 4, 5]), 0);
        assert_eq!(serve(&mut t, &[1, 2, 3, 9, 9]), 3, "splits [1..5] after 3");
        assert_eq!(serve(&mut t, &[7, 8]), 0);
        assert_eq!(serve(&mut t, &[1, 2, 3, 4, 5, 6]), 5);
        assert_eq!(serve(&mut t, &[1, 2, 3, 9, 9, 1]), 5);
        assert_eq!(serve(&mut t, &[1, 2]), 2, "a prefix of a node splits it again");
        assert_eq!(serve(&mut t, &[7, 8]), 2);
        assert_eq!(t.bytes(), 4 * 11, "every token stored once: 1-5, 6, 9 9, 1, 7 8");
        assert_eq!((t.stats.requests, t.stats.hits, t.stats.tokens_reused), (7, 5, 17));
    }

    #[test]
    fn lru_eviction_keeps_the_budget() {
        let mut t = RadixTrie::new(4 * 8);
        serve(&mut t, &[1, 2, 3, 4]);
        serve(&mut t, &[5, 6, 7, 8]);
        serve(&mut t, &[1, 2, 3, 4]); // [1..4] used last
        serve(&mut t, &[9, 9, 9]); // over budget: the least recently used leaf, [5..8], goes
        assert!(t.bytes() <= 4 * 8);
        assert_eq!(t.stats.evicted_nodes, 1);
        assert_eq!(serve(&mut t, &[1, 2, 3, 4]), 4);
        assert_eq!(serve(&mut t, &[5, 6, 7, 8]), 0);
        assert!(t.bytes() <= 4 * 8);
        // A sequence longer than the budget is served and then evicted.
        serve(&mut t, &(20..40).collect::<Vec<u32>>());
        assert!(t.bytes() <= 4 * 8);
    }

    #[test]
    fn hit_after_an_older_layout() {
        // Pinned prefix P, pages a b c; the layout drops a and b (context shift), then returns.
        let (p, a, b, c) = ([100, 101], [1, 1, 1], [2, 2], [3, 3, 3]);
        let cat = |parts: &[&[u32]]| parts.concat();
        let mut t = RadixTrie::new(usize::MAX);
        serve(&mut t, &cat(&[&p, &a, &b, &c]));
        assert_eq!(
            serve(&mut t, &cat(&[&p, &c])),
            2,
            "after the shift only the prefix is cached"
        );
        assert_eq!(
            serve(&mut t, &cat(&[&p, &a, &b, &c])),
            10,
            "the older layout is still whole"
        );
        assert_eq!(t.nodes(), 3, "P, then a b c and c below it");
    }
}
