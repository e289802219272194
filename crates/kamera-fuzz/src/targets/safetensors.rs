//! The safetensors target: kamera-model's loader of Hugging Face model directories (`SafeDir`:
//! the memory-mapped file, its JSON header and offsets, then every tensor read to f32). Each input
//! is written as `model.safetensors` of a private temporary directory and opened from there, as
//! a model load opens it. Seeds are cut from the tiny Qwen2.5-VL's three shards (names, shapes
//! and `__metadata__` kept, each tensor shrunk to at most 4 per dimension, dtypes varied).

use std::path::{Path, PathBuf};

use kamera_model::SafeDir;

use super::{Outcome, Target, read_seed, rejected};
use crate::error::{Error, Result};

const SEEDS: [&str; 3] = [
    "qwen25vl-tiny-1.safetensors",
    "qwen25vl-tiny-2.safetensors",
    "qwen25vl-tiny-3.safetensors",
];

/// The dtypes the seeds cycle through (the loader converts each to f32).
const DTYPES: [(&str, usize); 6] = [("F32", 4), ("BF16", 2), ("F16", 2), ("F32", 4), ("I64", 8), ("U8", 1)];

// Long: one table of seed files (each a header and its tensors) built inline, so the fuzzer's
// corpus reads in one place.
pub(super) fn target() -> Result<Target> {
    let seeds = SEEDS
        .iter()
        .map(|s| read_seed("safetensors", s))
        .collect::<Result<Vec<_>>>()?;
    let dir = tempfile::Builder::new()
        .prefix("kamera-fuzz-safetensors-")
        .tempdir()
        .map_err(|e| Error::Seed {
            target: "safetensors",
            path: std::env::temp_dir(),
            detail: format!("cannot create a scratch directory: {e}"),
        })?;
    Ok(Target {
        name: "safetensors",
        about: format!(
            "SafeDir::open (mmap, header, offsets) + every tensor to f32; seeds {}",
            SEEDS.join(", ")
        ),
        seeds,
        dict: vec![
            b"\"dtype\"",
            b"\"shape\"",
            b"\"data_offsets\"",
            b"\"__metadata__\"",
            b"\"F32\"",
            b"\"BF16\"",
            b"\"F16\"",
            b"\"I64\"",
            b"\"F8_E4M3\"",
            b"18446744073709551615",
            b"[",
            b"{",
        ],
        // The header is parsed into owned JSON and each tensor copied once to its dtype and once
        // to f32 (at most 8 bytes per input byte for U8), on top of the mapped file.
        bound: |n| 16 * n + (1 << 20),
        bound_text: "16 x input + 1 MiB",
        fixup: None,
        decode: Box::new(move |bytes| decode(dir.path(), bytes)),
    })
}

fn decode(dir: &Path, bytes: &[u8]) -> std::result::Result<Outcome, String> {
    let file = dir.join("model.safetensors");
    std::fs::write(&file, bytes).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    let input = file.display().to_string();
    // The scratch directory's name is cut from an error that names the file, so that the report's
    // distinct errors count what went wrong.
    let refused = |e: kamera_model::Error| match rejected(&input, e.to_string()) {
        Ok(Outcome::Rejected(text)) => Ok(Outcome::Rejected(text.replace(&input, ""))),
        other => other,
    };
    let st = match SafeDir::open(dir) {
        Ok(st) => st,
        Err(e) => return refused(e),
    };
    for (name, shape) in st.tensors() {
        match st.f32(&name, &shape) {
            Ok(t) if t.dims() == shape.as_slice() => {}
            Ok(t) => return Err(format!("tensor {name}: asked for {shape:?}, got {:?}", t.dims())),
            Err(e) => return refused(e),
        }
    }
    Ok(Outcome::Accepted)
}

/// A small seed cut from the real safetensors file at `path`: its `__metadata__`, up to 8 of its
/// tensors by name with every dimension cut to at most 4, dtypes cycling through F32, BF16, F16,
/// I64 and U8, values a fixed ramp.
pub fn safetensors_seed_from_model(path: &Path) -> Result<Vec<u8>> {
    let bad = |detail: String| Error::Seed {
        target: "safetensors",
        path: path.to_path_buf(),
        detail,
    };
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let n = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize)
        .ok_or_else(|| bad("shorter than 8 bytes".into()))?;
    let header: serde_json::Map<String, serde_json::Value> = bytes
        .get(8..8 + n)
        .ok_or_else(|| bad(format!("header of {n} bytes past the end")))
        .and_then(|h| serde_json::from_slice(h).map_err(|e| bad(e.to_string())))?;
    let mut out = serde_json::Map::new();
    if let Some(m) = header.get("__metadata__") {
        out.insert("__metadata__".into(), m.clone());
    }
    let mut data = Vec::new();
    let names: Vec<&String> = header.keys().filter(|k| *k != "__metadata__").take(8).collect();
    for (i, name) in names.into_iter().enumerate() {
        let shape: Vec<usize> = header[name]["shape"]
            .as_array()
            .ok_or_else(|| bad(format!("{name}: no shape")))?
            .iter()
            .map(|d| d.as_u64().unwrap_or(1).min(4) as usize)
            .collect();
        let (dtype, size) = DTYPES[i % DTYPES.len()];
        let count: usize = shape.iter().product();
        let start = data.len();
        for k in 0..count * size {
            // A ramp that is a finite number in every float dtype (the high byte stays small).
            data.push(if k % size == size - 1 {
                0x3c
            } else {
                (k * 37 % 251) as u8
            });
        }
        out.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let head = serde_json::to_vec(&out).map_err(|e| bad(e.to_string()))?;
    let mut file = (head.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&head);
    file.extend_from_slice(&data);
    Ok(file)
}

/// The tiny Qwen2.5-VL's shards that the seeds are cut from.
pub fn safetensors_seed_sources() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kamera-model/tests/golden/qwen25vl-tiny");
    (1..=3)
        .map(|i| dir.join(format!("model-0000{i}-of-00003.safetensors")))
        .collect()
}

/// Where the seed cut from source `i` (0-based) is kept.
pub fn safetensors_seed_path(i: usize) -> PathBuf {
    super::seeds_dir().join(SEEDS[i])
}
