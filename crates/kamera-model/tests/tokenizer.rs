//! Tokenizer parity with the HF tokenizers built from the same GGUF metadata (ids, with BOS
//! where the model adds it), and decode round trips.

mod common;

use std::collections::HashMap;

use anyhow::{Result, ensure};
use kamera_model::ModelName;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[test]
fn tokenizers_match_reference() -> Result<()> {
    let path = kamera_model::Golden::path(ModelName::Smollm2_135m).with_file_name("tokenizer.json");
    let golden: HashMap<String, Vec<Case>> = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    for name in ModelName::ALL {
        let m = common::load(name)?;
        let tok = m.tokenizer();
        for case in &golden[name.as_str()] {
            let ids = tok.encode(&case.text)?;
            ensure!(
                ids == case.ids,
                "{name}: {:?}\n ours {ids:?}\n ref  {:?}",
                case.text,
                case.ids
            );
            let body = if tok.adds_bos() { &ids[1..] } else { &ids[..] };
            ensure!(
                tok.decode(body, false)? == case.text,
                "{name}: decode round trip of {:?}",
                case.text
            );
        }
        eprintln!(
            "{name}: {} strings tokenized as the reference does",
            golden[name.as_str()].len()
        );
    }
    Ok(())
}
