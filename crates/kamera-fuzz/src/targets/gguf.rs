//! The GGUF target: header, metadata and tensor table (`Gguf::from_bytes`), then what a model
//! load reads from them: the config, the tokenizer and every tensor dequantized to f32.
//! Seeds are small GGUF files cut from the real models (metadata kept, arrays cut to 512
//! entries, block_count 2, each tensor replaced by a 2 x 256 one of the same quantisation type).

use std::io::Cursor;
use std::path::{Path, PathBuf};

use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::{Device, Tensor};
use kamera_model::{Config, Gguf, Tokenizer};

use super::{Outcome, Target, read_seed, rejected};
use crate::error::{Error, Result};

const INPUT: &str = "fuzz.gguf";
const SEEDS: [&str; 3] = ["smollm2-135m.gguf", "qwen2.5-0.5b.gguf", "gemma3-270m.gguf"];

/// The folder holding the GGUF seeds (and where [`gguf_seed_from_model`]'s output goes).
pub fn gguf_seeds_dir() -> PathBuf {
    super::seeds_dir()
}

pub(super) fn target() -> Result<Target> {
    let seeds = SEEDS.iter().map(|s| read_seed("gguf", s)).collect::<Result<Vec<_>>>()?;
    Ok(Target {
        name: "gguf",
        about: format!(
            "Gguf::from_bytes + Config + Tokenizer + every tensor to f32; seeds {}",
            SEEDS.join(", ")
        ),
        seeds,
        dict: Vec::new(),
        bound: |n| 64 * n + (8 << 20),
        bound_text: "64 x input + 8 MiB",
        fixup: None,
        decode: Box::new(decode),
    })
}

fn decode(bytes: &[u8]) -> std::result::Result<Outcome, String> {
    let g = match Gguf::from_bytes(Path::new(INPUT), bytes.to_vec()) {
        Ok(g) => g,
        Err(e) => return rejected(INPUT, e.to_string()),
    };
    let mut first_err = None;
    if let Err(e) = Config::from_gguf(&g) {
        first_err.get_or_insert(e.to_string());
    }
    if let Err(e) = Tokenizer::from_gguf(&g) {
        first_err.get_or_insert(e.to_string());
    }
    for name in g.tensor_names() {
        if let Err(e) = g.tensor_f32(&name, &Device::Cpu) {
            first_err.get_or_insert(e.to_string());
        }
    }
    match first_err {
        Some(e) => rejected(INPUT, e),
        None => Ok(Outcome::Accepted),
    }
}

/// A small seed cut from the real GGUF at `path`: all metadata (arrays cut to 512 entries) and
/// each of up to 8 tensors, of distinct quantisation types where possible, as 2 x 256 values.
pub fn gguf_seed_from_model(path: &Path) -> Result<Vec<u8>> {
    let bad = |detail: String| Error::Seed {
        target: "gguf",
        path: path.to_path_buf(),
        detail,
    };
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let content = Content::read(&mut Cursor::new(&bytes)).map_err(|e| bad(e.to_string()))?;
    let mut meta: Vec<(String, Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::Array(a) if a.len() > 512 => Value::Array(a[..512].to_vec()),
                // As many layers as the seed has tensors for (the config checks the count).
                _ if k.ends_with(".block_count") => Value::U32(2),
                v => v.clone(),
            };
            (k.clone(), v)
        })
        .collect();
    meta.sort_by(|a, b| a.0.cmp(&b.0));
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut picked: Vec<(String, QTensor)> = Vec::new();
    let mut seen = Vec::new();
    for pass in 0..2 {
        for name in &names {
            let dt = content.tensor_infos[*name].ggml_dtype;
            let fresh = !seen.contains(&dt);
            if picked.len() >= 8 || picked.iter().any(|(n, _)| n == *name) || (pass == 0 && !fresh) {
                continue;
            }
            let vals: Vec<f32> = (0..512).map(|i| ((i * 7919 % 513) as f32 / 256.0) - 1.0).collect();
            let t = Tensor::from_vec(vals, (2, 256), &Device::Cpu).map_err(|e| bad(e.to_string()))?;
            let q = QTensor::quantize(&t, dt).map_err(|e| bad(format!("quantize {name} as {dt:?}: {e}")))?;
            seen.push(dt);
            picked.push(((*name).clone(), q));
        }
    }
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = picked.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut out = Cursor::new(Vec::new());
    gguf_file::write(&mut out, &meta_refs, &tensor_refs).map_err(|e| bad(e.to_string()))?;
    Ok(out.into_inner())
}
