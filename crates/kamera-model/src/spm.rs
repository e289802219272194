//! SentencePiece-style BPE: merge the adjacent pair whose joined piece has the highest score,
//! spaces as '▁', unknown pieces fall back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::merge::{Sym, merge, symbols};

/// SentencePiece BPE over scored pieces.
#[derive(Debug)]
pub(crate) struct Spm {
    vocab: HashMap<String, (u32, f32)>,
    byte_ids: [u32; 256],
    add_space_prefix: bool,
}

#[derive(PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    size: usize,
}

impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then_with(|| o.left.cmp(&self.left))
    }
}

impl Spm {
    pub fn new(tokens: &[String], scores: &[f32], byte_ids: &[u32], add_space_prefix: bool) -> Result<Spm> {
        if scores.len() != tokens.len() {
            return Err(Error::Tokenizer(format!(
                "{} scores for {} tokens",
                scores.len(),
                tokens.len()
            )));
        }
        let vocab = tokens
            .iter()
            .zip(scores)
            .enumerate()
            .map(|(i, (t, &s))| (t.clone(), (i as u32, s)))
            .collect();
        let mut bytes = [u32::MAX; 256];
        for &id in byte_ids {
            let t = &tokens[id as usize];
            if let Some(h) = t.strip_prefix("<0x").and_then(|s| s.strip_suffix('>'))
                && let Ok(b) = u8::from_str_radix(h, 16)
            {
                bytes[b as usize] = id;
            }
        }
        Ok(Spm {
            vocab,
            byte_ids: bytes,
            add_space_prefix,
        })
    }

    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut norm = String::with_capacity(text.len() + 3);
        if self.add_space_prefix {
            norm.push('▁');
        }
        for c in text.chars() {
            norm.push(if c == ' ' { '▁' } else { c });
        }
        let s = norm.as_str();
        let mut syms = symbols(s);
        let n = syms.len();
        let pair = |syms: &[Sym], l: usize, r: usize| {
            let piece = &s[syms[l].start..syms[r].start + syms[r].len];
            let &(_, score) = self.vocab.get(piece)?;
            Some(Bigram {
                score,
                left: l,
                size: piece.len(),
            })
        };
        merge(&mut syms, pair, |b| (b.left, b.size));
        let mut cur = if n > 0 { Some(0) } else { None };
        while let Some(i) = cur {
            let piece = &s[syms[i].start..syms[i].start + syms[i].len];
            match self.vocab.get(piece) {
                Some(&(id, _)) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        let id = self.byte_ids[b as usize];
                        if id == u32::MAX {
                            return Err(Error::Tokenizer(format!("no byte-fallback token for byte 0x{b:02X}")));
                        }
                        out.push(id);
                    }
                }
            }
            cur = syms[i].next;
        }
        Ok(())
    }

    pub fn decode_token(&self, tok: &str, is_byte: bool, out: &mut Vec<u8>) {
        if is_byte
            && let Some(b) = tok
                .strip_prefix("<0x")
                .and_then(|s| s.strip_suffix('>'))
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            return;
        }
        out.extend_from_slice(tok.replace('▁', " ").as_bytes());
    }
}
