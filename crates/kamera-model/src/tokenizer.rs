//! Tokenizer read from GGUF metadata: byte-level BPE (`gpt2`: SmolLM2, Qwen) or SentencePiece
//! BPE with byte fallback (`llama`: Gemma). Control and user-defined tokens are matched first.

use std::collections::HashMap;

use crate::bpe::ByteBpe;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::spm::Spm;

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

#[derive(Debug)]
enum Kind {
    Bpe(ByteBpe),
    Spm(Spm),
}

/// A tokenizer built from GGUF metadata.
#[derive(Debug)]
pub struct Tokenizer {
    kind: Kind,
    tokens: Vec<String>,
    types: Vec<i32>,
    /// Special strings by first char, longest first.
    specials: HashMap<char, Vec<(String, u32)>>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

/// What a byte-level BPE tokenizer read from elsewhere (tokenizer.json) is made of.
pub(crate) struct TokenizerParts {
    pub bpe: ByteBpe,
    pub tokens: Vec<String>,
    /// Special (control) token ids, matched before the BPE and dropped when decoding.
    pub control: Vec<u32>,
    /// Added, non-special token ids, matched before the BPE and kept when decoding.
    pub user: Vec<u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
}

impl Tokenizer {
    pub(crate) fn from_parts(p: TokenizerParts) -> Tokenizer {
        let mut types = vec![NORMAL; p.tokens.len()];
        for &i in &p.control {
            types[i as usize] = CONTROL;
        }
        for &i in &p.user {
            types[i as usize] = USER_DEFINED;
        }
        let specials = specials_of(&p.tokens, &types);
        Tokenizer {
            kind: Kind::Bpe(p.bpe),
            tokens: p.tokens,
            types,
            specials,
            bos: p.bos,
            eos: p.eos,
            add_bos: p.add_bos,
        }
    }

    /// Build from `tokenizer.ggml.*` metadata; a malformed tokenizer is an [`Error::Gguf`]
    /// that names the file.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
        Self::build(g).map_err(|e| match e {
            Error::Tokenizer(detail) => Error::Gguf {
                path: g.path().to_path_buf(),
                detail: format!("tokenizer: {detail}"),
            },
            e => e,
        })
    }

    fn build(g: &Gguf) -> Result<Tokenizer> {
        let model = g.str("tokenizer.ggml.model")?.to_string();
        let tokens = g.strings("tokenizer.ggml.tokens")?;
        let types: Vec<i32> = if g.has_meta("tokenizer.ggml.token_type") {
            g.f32s("tokenizer.ggml.token_type")?
                .into_iter()
                .map(|t| t as i32)
                .collect()
        } else {
            vec![NORMAL; tokens.len()]
        };
        if types.len() != tokens.len() {
            return Err(Error::Tokenizer(format!(
                "{} token types for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let kind = match model.as_str() {
            "gpt2" => {
                let merges = g.strings("tokenizer.ggml.merges")?;
                let pre = g.str("tokenizer.ggml.pre").unwrap_or("default").to_string();
                Kind::Bpe(ByteBpe::new(&tokens, &merges, &pre)?)
            }
            "llama" => {
                let scores = g.f32s("tokenizer.ggml.scores")?;
                let byte_ids = (0..tokens.len())
                    .filter(|&i| types[i] == BYTE)
                    .map(|i| i as u32)
                    .collect::<Vec<_>>();
                Kind::Spm(Spm::new(
                    &tokens,
                    &scores,
                    &byte_ids,
                    g.bool("tokenizer.ggml.add_space_prefix").unwrap_or(true),
                )?)
            }
            other => {
                return Err(Error::Tokenizer(format!(
                    "unsupported tokenizer model {other:?} (supported: gpt2, llama)"
                )));
            }
        };
        let specials = specials_of(&tokens, &types);
        let id = |k: &str| g.u64(k).ok().map(|v| v as u32);
        let default_bos = model == "llama";
        Ok(Tokenizer {
            kind,
            tokens,
            types,
            specials,
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            add_bos: g.bool("tokenizer.ggml.add_bos_token").unwrap_or(default_bos),
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// Whether [`Tokenizer::encode`] prepends BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }
    /// The id of an exact token string.
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.tokens.iter().position(|t| t == s).map(|i| i as u32)
    }
    /// Whether `id` is a control token (BOS, EOS, chat markers...).
    pub fn is_control(&self, id: u32) -> bool {
        self.types.get(id as usize) == Some(&CONTROL)
    }

    /// Encode as the model's own tokenizer does by default (BOS where the model adds it).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if self.adds_bos()
            && let Some(b) = self.bos
        {
            ids.push(b);
        }
        ids.extend(self.encode_raw(text)?);
        Ok(ids)
    }

    /// Encode without BOS; control and user-defined token strings in `text` map to their ids.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut seg_start = 0;
        let mut i = 0;
        while i < text.len() {
            let c = text[i..].chars().next().unwrap_or('\0');
            let hit = self
                .specials
                .get(&c)
                .and_then(|v| v.iter().find(|(s, _)| text[i..].starts_with(s.as_str())));
            if let Some((s, id)) = hit {
                self.encode_plain(&text[seg_start..i], &mut ids)?;
                ids.push(*id);
                i += s.len();
                seg_start = i;
            } else {
                i += c.len_utf8();
            }
        }
        self.encode_plain(&text[seg_start..], &mut ids)?;
        Ok(ids)
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        match &self.kind {
            Kind::Bpe(b) => b.encode(text, out),
            Kind::Spm(s) => s.encode(text, out),
        }
    }

    /// Decode ids to text; control tokens are dropped when `skip_control`.
    pub fn decode(&self, ids: &[u32], skip_control: bool) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            let Some(tok) = self.tokens.get(id as usize) else {
                return Err(Error::TokenOutOfRange {
                    op: "Tokenizer::decode",
                    id,
                    vocab: self.tokens.len(),
                });
            };
            let ty = self.types[id as usize];
            if ty == CONTROL {
                if !skip_control {
                    bytes.extend_from_slice(tok.as_bytes());
                }
                continue;
            }
            if ty == USER_DEFINED {
                bytes.extend_from_slice(tok.as_bytes());
                continue;
            }
            match &self.kind {
                Kind::Bpe(b) => b.decode_token(tok, &mut bytes),
                Kind::Spm(s) => s.decode_token(tok, ty == BYTE, &mut bytes),
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Control and user-defined token strings by first char, longest first.
fn specials_of(tokens: &[String], types: &[i32]) -> HashMap<char, Vec<(String, u32)>> {
    let mut specials: HashMap<char, Vec<(String, u32)>> = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        if (types[i] == CONTROL || types[i] == USER_DEFINED)
            && let Some(c) = t.chars().next()
        {
            specials.entry(c).or_default().push((t.clone(), i as u32));
        }
    }
    for v in specials.values_mut() {
        v.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
    }
    specials
}
