//! The one error type of kamera-agent.

use std::path::PathBuf;

/// What went wrong loading, running or replaying a scenario.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A scenario file that does not parse or does not make sense.
    #[error("scenario {path}: {detail}")]
    Scenario { path: PathBuf, detail: String },
    /// A trace that does not parse; `line` is 1-based.
    #[error("trace {path} line {line}: {detail}")]
    Trace { path: PathBuf, line: usize, detail: String },
    /// The browser failed.
    #[error(transparent)]
    Browser(#[from] Box<kamera_browser::Error>),
    /// The model failed.
    #[error("model {op}: {source}")]
    Model {
        op: &'static str,
        #[source]
        source: Box<kamera_model::Error>,
    },
    /// The operator failed.
    #[error("kv {op}: {source}")]
    Ops {
        op: &'static str,
        #[source]
        source: Box<kamera_ops::Error>,
    },
    /// The scheduler refused an operation (budget, unknown chunk).
    #[error("scheduler: {0}")]
    Sched(#[from] Box<kamera_sched::Error>),
    /// The chunk store failed.
    #[error("store: {0}")]
    Store(#[from] Box<kamera_store::Error>),
    /// The relocation backend failed.
    #[error("backend: {0}")]
    Backend(#[from] Box<kamera_gpu::Error>),
    /// The session's state cannot carry out a plan step (a bug, or a store that lost a record).
    #[error("runtime {op}: {detail}")]
    Runtime { op: &'static str, detail: String },
    /// The model policy produced no valid action within its retries.
    #[error("policy: no valid action after {tries} tries; last output {last:?}")]
    Policy { tries: usize, last: String },
    /// A scripted step that cannot be carried out on the current page.
    #[error("step {step}: {detail}")]
    Step { step: usize, detail: String },
    /// Fetching, unpacking or serving a suite's pages failed (the harness names the suite).
    #[error("suite {suite}: {detail}")]
    Suite { suite: String, detail: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An action cache entry that does not read (corrupt, or of another format version).
    #[error("action cache {path}: {detail}")]
    Cache { path: PathBuf, detail: String },
    #[error("cancelled")]
    Cancelled,
    /// A run went past the agent's deadline (checked between steps).
    #[error("deadline passed after {after_ms} ms")]
    Deadline { after_ms: u64 },
    /// An agent that cannot be built as configured.
    #[error("agent: {detail}")]
    Build { detail: String },
    /// A file the runtime is assembled from (`what`: a calibration, a patch basis) that does not
    /// read or does not fit the model.
    #[error("{what} {path}: {detail}")]
    Config {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    /// A JSON Schema extraction cannot decode under (an unsupported keyword or type, a bad
    /// value); `detail` names it and where it is.
    #[error("extract: {detail}")]
    Schema { detail: String },
    /// The model's reply to an extraction is not a `type_name`.
    #[error("extract {type_name}: {detail}; the model wrote {output:?}")]
    Extract {
        type_name: &'static str,
        detail: String,
        output: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}

pub(crate) fn model(op: &'static str) -> impl FnOnce(kamera_model::Error) -> Error {
    move |source| Error::Model {
        op,
        source: Box::new(source),
    }
}

impl From<kamera_browser::Error> for Error {
    fn from(e: kamera_browser::Error) -> Self {
        Error::Browser(Box::new(e))
    }
}

impl From<kamera_sched::Error> for Error {
    fn from(e: kamera_sched::Error) -> Self {
        Error::Sched(Box::new(e))
    }
}

impl From<kamera_store::Error> for Error {
    fn from(e: kamera_store::Error) -> Self {
        Error::Store(Box::new(e))
    }
}

impl From<kamera_gpu::Error> for Error {
    fn from(e: kamera_gpu::Error) -> Self {
        Error::Backend(Box::new(e))
    }
}
