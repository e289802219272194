//! llama.cpp's two methods in `kamera bench session --against-llamacpp`: the prompt cache and the
//! context shift, run by scripts/bench_session_llamacpp.py (llama-cpp-python built from source by
//! scripts/llamacpp-venv.sh) as a child process on the same GGUF, token sequences and threads.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

/// One step's sequences as the script reads them.
#[derive(Debug, Clone, Serialize)]
pub struct SeqStep {
    /// Kamera's window + prompt (the prompt cache's request).
    pub window: Vec<u32>,
    /// The transcript layout + prompt (the context shift's request).
    pub radix: Vec<u32>,
    /// `[first position, tokens]` dropped after the pinned prefix before this step.
    pub drop: Option<[usize; 2]>,
}

/// One method's figures at one step, from the script.
#[derive(Debug, Clone, Default)]
pub struct LlamaStep {
    pub ttft_ms: f64,
    pub work_ms: f64,
    /// Tokens evaluated (context shift only; the prompt cache does not say).
    pub prefilled: Option<usize>,
    pub logits: Vec<f32>,
    /// llama.cpp's own full re-prefill of the same sequence, with `--reference`.
    pub reference: Option<Vec<f32>>,
}

pub struct LlamaRun {
    pub prompt_cache: Vec<LlamaStep>,
    pub context_shift: Vec<LlamaStep>,
    /// The script's report less the per-step rows (version, system info, cache size).
    pub meta: serde_json::Value,
}

fn read_f32(path: &Path, rows: usize, vocab: usize) -> Result<Vec<Vec<f32>>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() != rows * vocab * 4 {
        bail!(
            "{}: {} bytes, expected {rows} steps x {vocab} logits x 4",
            path.display(),
            bytes.len()
        );
    }
    Ok(bytes
        .chunks_exact(vocab * 4)
        .map(|r| {
            r.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        })
        .collect())
}

/// Runs both methods on `steps` and reads back their timings and logits.
pub fn run(gguf: &Path, steps: &[SeqStep], threads: usize, cache_bytes: usize, vocab: usize) -> Result<LlamaRun> {
    let scripts = crate::bench_llamacpp::scripts_dir();
    let python = crate::bench_llamacpp::llamacpp_python(&scripts)?;
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("steps.json");
    std::fs::write(&input, serde_json::to_vec(&serde_json::json!({ "steps": steps }))?)?;
    let out = Command::new(&python)
        .arg(scripts.join("bench_session_llamacpp.py"))
        .args([
            "--gguf",
            &gguf.display().to_string(),
            "--steps",
            &input.display().to_string(),
        ])
        .args([
            "--out",
            &dir.path().display().to_string(),
            "--threads",
            &threads.to_string(),
        ])
        .args(["--cache-bytes", &cache_bytes.to_string(), "--reference"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running scripts/bench_session_llamacpp.py")?;
    if !out.status.success() {
        bail!("bench_session_llamacpp.py failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut meta: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or(""))
        .with_context(|| format!("bench_session_llamacpp.py printed {text:?}"))?;
    let their_vocab = meta["n_vocab"].as_u64().unwrap_or(0) as usize;
    if their_vocab != vocab {
        bail!("llama.cpp's vocabulary has {their_vocab} tokens, ours {vocab}");
    }
    let n = steps.len();
    let read = |name: &str| read_f32(&dir.path().join(name), n, vocab);
    let (pc, cs) = (read("prompt_cache.f32")?, read("context_shift.f32")?);
    let (rw, rr) = (read("full_window.f32")?, read("full_radix.f32")?);
    let rows = |key: &str, logits: Vec<Vec<f32>>, refs: Vec<Vec<f32>>| -> Result<Vec<LlamaStep>> {
        let r = meta[key]
            .as_array()
            .filter(|a| a.len() == n)
            .with_context(|| format!("bench_session_llamacpp.py: no {n} rows of {key}"))?;
        Ok(r.iter()
            .zip(logits)
            .zip(refs)
            .map(|((j, logits), reference)| LlamaStep {
                ttft_ms: j["ttft_ms"].as_f64().unwrap_or(f64::NAN),
                work_ms: j["work_ms"].as_f64().unwrap_or(f64::NAN),
                prefilled: j["prefilled"].as_u64().map(|x| x as usize),
                logits,
                reference: Some(reference),
            })
            .collect())
    };
    let prompt_cache = rows("prompt_cache", pc, rw)?;
    let context_shift = rows("context_shift", cs, rr)?;
    if let Some(m) = meta.as_object_mut() {
        m.remove("prompt_cache");
        m.remove("context_shift");
    }
    Ok(LlamaRun {
        prompt_cache,
        context_shift,
        meta,
    })
}
