//! llama.cpp's two methods in `kamera bench session --against-llamacpp`: the prompt cache and the
//! context shift, run by scripts/bench_session_llamacpp.py (llama-cpp-python built from source by
//! scripts/llamacpp-venv.sh) as a child process on the same GGUF, token sequences and threads.
//! The child is a step server: each step is sent to it right after Kamera's and the radix
//! cache's, so every method of a step runs back to back under the same machine load.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

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
    /// llama.cpp's own full re-prefill of the same sequence.
    pub reference: Vec<f32>,
}

/// The running script.
pub struct LlamaServer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    dir: tempfile::TempDir,
    vocab: usize,
}

fn read_f32(path: &Path, rows: usize, vocab: usize) -> Result<Vec<Vec<f32>>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() != rows * vocab * 4 {
        bail!(
            "{}: {} bytes, expected {rows} rows x {vocab} logits x 4",
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

impl LlamaServer {
    /// Starts the script on `gguf` with a context of `n_ctx` tokens and waits until it has
    /// loaded the model; its vocabulary must be ours (`vocab`).
    pub fn start(gguf: &Path, threads: usize, cache_bytes: usize, n_ctx: usize, vocab: usize) -> Result<LlamaServer> {
        let scripts = crate::bench_llamacpp::scripts_dir();
        let python = crate::bench_llamacpp::llamacpp_python(&scripts)?;
        let dir = tempfile::tempdir()?;
        let mut child = Command::new(&python)
            .arg(scripts.join("bench_session_llamacpp.py"))
            .args(["--gguf", &gguf.display().to_string()])
            .args(["--out", &dir.path().display().to_string()])
            .args(["--n-ctx", &n_ctx.to_string(), "--threads", &threads.to_string()])
            .args(["--cache-bytes", &cache_bytes.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting scripts/bench_session_llamacpp.py")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("the script's stdout")?);
        let mut s = LlamaServer {
            child,
            stdin,
            stdout,
            dir,
            vocab,
        };
        let ready = s.line("loading the model")?;
        let theirs = ready["n_vocab"].as_u64().unwrap_or(0) as usize;
        if theirs != vocab {
            bail!("llama.cpp's vocabulary has {theirs} tokens, ours {vocab}");
        }
        Ok(s)
    }

    fn line(&mut self, what: &str) -> Result<serde_json::Value> {
        let mut l = String::new();
        let n = self.stdout.read_line(&mut l)?;
        if n == 0 {
            let status = self.child.wait()?;
            bail!("bench_session_llamacpp.py ended while {what} ({status})");
        }
        serde_json::from_str(l.trim()).with_context(|| format!("bench_session_llamacpp.py printed {l:?} while {what}"))
    }

    /// Runs one step: (prompt cache, context shift).
    pub fn step(&mut self, s: &SeqStep) -> Result<(LlamaStep, LlamaStep)> {
        let stdin = self.stdin.as_mut().context("the script's stdin is closed")?;
        writeln!(stdin, "{}", serde_json::to_string(s)?)?;
        stdin.flush()?;
        let j = self.line("running a step")?;
        let path: PathBuf = self.dir.path().join("step.f32");
        let mut l = read_f32(&path, 4, self.vocab)?.into_iter();
        let mut next = || l.next().unwrap_or_default();
        let (pc, cs, full_window, full_radix) = (next(), next(), next(), next());
        let of = |row: &serde_json::Value, logits, reference| LlamaStep {
            ttft_ms: row["ttft_ms"].as_f64().unwrap_or(f64::NAN),
            work_ms: row["work_ms"].as_f64().unwrap_or(f64::NAN),
            prefilled: row["prefilled"].as_u64().map(|x| x as usize),
            logits,
            reference,
        };
        Ok((
            of(&j["prompt_cache"], pc, full_window),
            of(&j["context_shift"], cs, full_radix),
        ))
    }

    /// Ends the script and returns its report (version, system info, cache size).
    pub fn finish(mut self) -> Result<serde_json::Value> {
        drop(self.stdin.take());
        let meta = self.line("finishing")?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("bench_session_llamacpp.py failed ({status})");
        }
        Ok(meta)
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        // A run cut short by an error: the script must not outlive the bench.
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
