//! A Hugging Face tokenizer.json (byte-level BPE: Qwen2, GPT-2 style) read into [`Tokenizer`]:
//! vocabulary, merges (as strings or pairs), added tokens, and the pre-tokenizer's splits.

use std::path::Path;

use serde_json::Value;

use crate::bpe::ByteBpe;
use crate::error::{Error, Result};
use crate::hf::read_json;
use crate::tokenizer::{Tokenizer, TokenizerParts};

fn bad(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Tokenizer(format!("{}: {detail}", path.display()))
}

/// The regex splits a pre-tokenizer applies, in order; `Sequence`s are flattened.
fn splits(pre: &Value, path: &Path, out: &mut Vec<String>) -> Result<()> {
    match pre.get("type").and_then(Value::as_str) {
        Some("Sequence") => {
            for p in pre.get("pretokenizers").and_then(Value::as_array).into_iter().flatten() {
                splits(p, path, out)?;
            }
        }
        Some("Split") => {
            let pat = pre
                .get("pattern")
                .and_then(|p| p.get("Regex").or_else(|| p.get("String")))
                .and_then(Value::as_str)
                .ok_or_else(|| bad(path, "Split pre-tokenizer without a pattern"))?;
            let behavior = pre.get("behavior").and_then(Value::as_str).unwrap_or("Isolated");
            if behavior != "Isolated" || pre.get("invert").and_then(Value::as_bool) == Some(true) {
                return Err(bad(
                    path,
                    format!("Split behavior {behavior:?} (inverted or not isolated) is not supported"),
                ));
            }
            out.push(pat.to_string());
        }
        Some("ByteLevel") => {
            if pre.get("use_regex").and_then(Value::as_bool).unwrap_or(true) {
                out.push(ByteBpe::GPT2_SPLIT.to_string());
            }
            if pre.get("add_prefix_space").and_then(Value::as_bool) == Some(true) {
                return Err(bad(path, "ByteLevel add_prefix_space = true is not supported"));
            }
        }
        Some("Digits") => out.push(r"\p{N}".to_string()),
        other => {
            return Err(bad(
                path,
                format!("pre-tokenizer {other:?} is not supported (Sequence, Split, ByteLevel, Digits)"),
            ));
        }
    }
    Ok(())
}

impl Tokenizer {
    /// Reads a byte-level BPE `tokenizer.json` (and `tokenizer_config.json` beside it, when
    /// present, for the BOS/EOS tokens).
    pub fn from_hf_json(path: &Path) -> Result<Tokenizer> {
        let v = read_json(path)?;
        let model = v.get("model").ok_or_else(|| bad(path, "no \"model\""))?;
        let kind = model.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "BPE" {
            return Err(bad(path, format!("model type {kind:?} is not supported (BPE)")));
        }
        let vocab = model
            .get("vocab")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(path, "no model.vocab"))?;
        let added: Vec<(u32, String, bool)> = v
            .get("added_tokens")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|t| {
                Some((
                    t.get("id")?.as_u64()? as u32,
                    t.get("content")?.as_str()?.to_string(),
                    t.get("special").and_then(Value::as_bool).unwrap_or(false),
                ))
            })
            .collect();
        let max_id = vocab
            .values()
            .filter_map(Value::as_u64)
            .chain(added.iter().map(|a| a.0 as u64))
            .max()
            .ok_or_else(|| bad(path, "empty vocabulary"))?;
        if max_id > 10_000_000 {
            return Err(bad(path, format!("token id {max_id} is implausibly large")));
        }
        let mut tokens = vec![String::new(); max_id as usize + 1];
        for (tok, id) in vocab {
            let id = id
                .as_u64()
                .ok_or_else(|| bad(path, format!("vocab entry {tok:?} has no integer id")))?;
            tokens[id as usize] = tok.clone();
        }
        let mut control = Vec::new();
        let mut user = Vec::new();
        for (id, content, special) in &added {
            tokens[*id as usize] = content.clone();
            if *special { control.push(*id) } else { user.push(*id) }
        }
        let merges = model
            .get("merges")
            .and_then(Value::as_array)
            .ok_or_else(|| bad(path, "no model.merges"))?
            .iter()
            .enumerate()
            .map(|(i, m)| match m {
                Value::String(s) => Ok(s.clone()),
                Value::Array(p) if p.len() == 2 => Ok(format!(
                    "{} {}",
                    p[0].as_str().unwrap_or(""),
                    p[1].as_str().unwrap_or("")
                )),
                _ => Err(bad(path, format!("merge {i} is neither \"a b\" nor [a, b]"))),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut pats = Vec::new();
        if let Some(pre) = v.get("pre_tokenizer").filter(|p| !p.is_null()) {
            splits(pre, path, &mut pats)?;
        }
        let pat_refs: Vec<&str> = pats.iter().map(String::as_str).collect();
        let bpe = ByteBpe::with_patterns(&tokens, &merges, &pat_refs)?;
        // Optional: without it (or unreadable) the model has no BOS/EOS of its own.
        let cfg = read_json(&path.with_file_name("tokenizer_config.json")).ok();
        let special = |key: &str| -> Option<u32> {
            let s = cfg.as_ref()?.get(key)?;
            let s = s.as_str().or_else(|| s.get("content").and_then(Value::as_str))?;
            tokens.iter().position(|t| t == s).map(|i| i as u32)
        };
        let (bos, eos) = (special("bos_token"), special("eos_token"));
        Ok(Tokenizer::from_parts(TokenizerParts {
            bpe,
            tokens,
            control,
            user,
            bos,
            eos,
            add_bos: false,
        }))
    }
}
