//! Lexical relevance of page chunks to a query (the goal, the question, remembered values): BM25's
//! saturating term frequency times the inverse document frequency of each query term a chunk
//! contains, summed; identifiers (terms with a digit: order numbers, tracking codes) count double.
//! What recall by relevance ranks by.

use std::collections::{BTreeMap, BTreeSet};

use kamera_store::ChunkId;

const STOPWORDS: &[&str] = &[
    "the", "and", "for", "with", "what", "which", "who", "how", "is", "are", "was", "of", "to", "in", "on", "at", "by",
    "an", "or", "be", "it", "this", "that", "from", "as", "its", "do", "does", "page", "pages", "find", "show", "tell",
    "get", "give", "list", "please",
];

/// The terms of `text`: lower-case runs of letters, digits and inner hyphens (so `A-1042` and
/// `TRK-48213` stay whole) of two or more characters, or any with a digit; stopwords left out.
pub fn terms(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .map(|w| w.trim_matches('-'))
        .filter(|w| w.chars().count() >= 2 || w.chars().any(|c| c.is_ascii_digit()))
        .map(str::to_lowercase)
        .filter(|w| !STOPWORDS.contains(&w.as_str()))
        .collect()
}

/// Term counts of `text` (the terms of [`terms`], with repeats).
fn counts(text: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for w in text.split(|c: char| !(c.is_alphanumeric() || c == '-')) {
        for t in terms(w) {
            *m.entry(t).or_insert(0) += 1;
        }
    }
    m
}

/// BM25's term-frequency saturation (k1 = 1.2, no length normalisation).
fn saturate(tf: usize) -> f64 {
    let tf = tf as f64;
    tf * 2.2 / (tf + 1.2)
}

/// The term counts of the chunks a session has met.
#[derive(Debug, Clone, Default)]
pub struct Relevance {
    chunks: BTreeMap<ChunkId, BTreeMap<String, usize>>,
}

impl Relevance {
    pub fn add(&mut self, id: ChunkId, text: &str) {
        self.chunks.insert(id, counts(text));
    }

    /// Every known chunk's score for `query`: Σ w(t)·sat(tf)·ln(1 + N / df(t)) over the query
    /// terms t it contains tf times (N chunks known, df(t) of them contain t; w = 2 for a term
    /// with a digit, else 1; sat(tf) = 2.2·tf / (tf + 1.2)).
    pub fn scores(&self, query: &str) -> BTreeMap<ChunkId, f64> {
        let q = terms(query);
        let n = self.chunks.len().max(1) as f64;
        let idf: BTreeMap<&String, f64> = q
            .iter()
            .map(|t| {
                let df = self.chunks.values().filter(|c| c.contains_key(t)).count().max(1) as f64;
                let w = if t.chars().any(|c| c.is_ascii_digit()) {
                    2.0
                } else {
                    1.0
                };
                (t, w * (1.0 + n / df).ln())
            })
            .collect();
        self.chunks
            .iter()
            .map(|(id, c)| {
                let s = idf
                    .iter()
                    .filter_map(|(t, w)| c.get(*t).map(|tf| w * saturate(*tf)))
                    .sum();
                (*id, s)
            })
            .collect()
    }

    /// The chunks that hold one of `query`'s identifiers (its terms with a digit: an order
    /// number, a tracking code, a remembered value).
    pub fn naming(&self, query: &str) -> BTreeSet<ChunkId> {
        let ids: Vec<String> = terms(query)
            .into_iter()
            .filter(|t| t.chars().any(|c| c.is_ascii_digit()))
            .collect();
        self.chunks
            .iter()
            .filter(|(_, c)| ids.iter().any(|t| c.contains_key(t)))
            .map(|(id, _)| *id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kamera_store::ModelFp;

    #[test]
    fn rare_identifiers_outweigh_common_words() {
        let m = ModelFp::of("m");
        let id = |s: &str| ChunkId::of(s.as_bytes(), "t", m);
        let mut r = Relevance::default();
        r.add(id("a"), "Orders: A-1041 A-1042 A-1043 shipping");
        r.add(
            id("b"),
            "Tracking TRK-48213: status Awaiting pickup, shipping by Harbor Line",
        );
        r.add(id("c"), "Team page: shipping, billing, support");
        let s = r.scores("What is the shipping status of order A-1042? tracking TRK-48213");
        assert!(s[&id("b")] > s[&id("a")], "{s:?}");
        assert!(s[&id("a")] > s[&id("c")], "{s:?}");
        assert_eq!(terms("What is THE A-1042? x -"), ["a-1042".to_string()].into());
        let naming = r.naming("Status of A-1042? tracking TRK-48213");
        assert_eq!(naming, [id("a"), id("b")].into());
    }
}
