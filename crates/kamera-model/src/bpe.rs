//! Byte-level BPE (GPT-2 style) with the pre-tokenizer regexes llama.cpp uses per `pre` name.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Mutex;

use fancy_regex::Regex;

use crate::error::{Error, Result};
use crate::merge::{Sym, merge, symbols};

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DIGITS: &str = r"\p{N}";

/// GPT-2 byte-level BPE.
#[derive(Debug)]
pub(crate) struct ByteBpe {
    vocab: HashMap<String, u32>,
    /// Merge rank by the merge's "left right" text.
    ranks: HashMap<String, u32>,
    /// Applied in order: each splits the pieces the previous one produced.
    regexes: Vec<Regex>,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
    cache: Mutex<HashMap<String, Vec<u32>>>,
}

fn bytes_to_unicode() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let keep = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        out[b as usize] = if keep {
            char::from_u32(b).unwrap_or('\0')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    out
}

impl ByteBpe {
    pub fn new(tokens: &[String], merges: &[String], pre: &str) -> Result<ByteBpe> {
        let pats: &[&str] = match pre {
            "qwen2" => &[QWEN2],
            "smollm" => &[DIGITS, GPT2],
            _ => &[GPT2],
        };
        ByteBpe::with_patterns(tokens, merges, pats)
    }

    /// The GPT-2 pre-tokenizer split (what `ByteLevel` with `use_regex` applies).
    pub const GPT2_SPLIT: &'static str = GPT2;

    /// llama.cpp's `qwen2` pre-tokenizer split (Qwen2's tokenizer.json `Split` regex).
    pub const QWEN2_SPLIT: &'static str = QWEN2;

    /// With explicit pre-tokenizer split patterns, applied in order (a tokenizer.json's `Split`s).
    pub fn with_patterns(tokens: &[String], merges: &[String], pats: &[&str]) -> Result<ByteBpe> {
        let vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let mut ranks = HashMap::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            if !m.contains(' ') {
                return Err(Error::Tokenizer(format!(
                    "merge {i} {m:?} is not two space-separated tokens"
                )));
            }
            ranks.insert(m.clone(), i as u32);
        }
        let regexes = pats
            .iter()
            .map(|p| Regex::new(p).map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        let byte_to_char = bytes_to_unicode();
        let char_to_byte = byte_to_char.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        Ok(ByteBpe {
            vocab,
            ranks,
            regexes,
            byte_to_char,
            char_to_byte,
            cache: Mutex::new(HashMap::new()),
        })
    }

    fn split<'a>(&self, text: &'a str) -> Result<Vec<&'a str>> {
        let mut pieces = vec![text];
        for re in &self.regexes {
            let mut next = Vec::new();
            for p in pieces {
                let mut last = 0;
                for m in re.find_iter(p) {
                    let m = m.map_err(|e| Error::Tokenizer(format!("pre-tokenizer: {e}")))?;
                    if m.start() > last {
                        next.push(&p[last..m.start()]);
                    }
                    next.push(m.as_str());
                    last = m.end();
                }
                if last < p.len() {
                    next.push(&p[last..]);
                }
            }
            pieces = next;
        }
        Ok(pieces)
    }

    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        for piece in self.split(text)? {
            if let Ok(cache) = self.cache.lock()
                && let Some(ids) = cache.get(piece)
            {
                out.extend_from_slice(ids);
                continue;
            }
            let ids = self.bpe(piece);
            out.extend_from_slice(&ids);
            // Only short pieces are kept (common words): the cache stays under ~100,000 x 64 bytes
            // however long the words a page holds.
            if piece.len() <= 64
                && let Ok(mut cache) = self.cache.lock()
                && cache.len() < 100_000
            {
                cache.insert(piece.to_string(), ids);
            }
        }
        Ok(())
    }

    /// Merges the piece's byte symbols, lowest-ranked pair first and leftmost among equals (the
    /// GPT-2 order), with a heap over a linked list of symbols: O(n log n) in the piece's length,
    /// so that a long unbroken word on a page (a hash, base64) cannot stall a step.
    fn bpe(&self, piece: &str) -> Vec<u32> {
        let m: String = piece.bytes().map(|b| self.byte_to_char[b as usize]).collect();
        let mut syms = symbols(&m);
        let n = syms.len();
        let mut key = String::new();
        let pair = |syms: &[Sym], l: usize, r: usize| {
            key.clear();
            key.push_str(&m[syms[l].start..syms[l].start + syms[l].len]);
            key.push(' ');
            key.push_str(&m[syms[r].start..syms[r].start + syms[r].len]);
            let rank = *self.ranks.get(key.as_str())?;
            Some(Reverse((rank, l, syms[l].len + syms[r].len)))
        };
        merge(&mut syms, pair, |&Reverse((_, l, size))| (l, size));
        // A byte whose symbol the vocabulary lacks (SmolLM2 has none for the control bytes 0x04,
        // 0x06, 0x13, 0x14, 0x16, 0x1D) is dropped: the model has no token for it, and refusing
        // it would let any page with such a character end a run. Hugging Face's BPE without an
        // unknown token skips it the same way. Merged symbols are always in the vocabulary.
        let mut out = Vec::new();
        let mut cur = if n > 0 { Some(0) } else { None };
        while let Some(i) = cur {
            if let Some(&id) = self.vocab.get(&m[syms[i].start..syms[i].start + syms[i].len]) {
                out.push(id);
            }
            cur = syms[i].next;
        }
        out
    }

    pub fn decode_token(&self, tok: &str, out: &mut Vec<u8>) {
        for c in tok.chars() {
            match self.char_to_byte.get(&c) {
                Some(&b) => out.push(b),
                None => out.extend_from_slice(c.to_string().as_bytes()),
            }
        }
    }
}
