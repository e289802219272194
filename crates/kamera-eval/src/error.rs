//! The crate's error type: every variant names the operation and the input involved.

use std::path::PathBuf;

/// Errors of the task format and the basis file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op}: operator error: {source}")]
    Ops {
        op: &'static str,
        #[source]
        source: Box<kamera_ops::Error>,
    },
    #[error("{op}: I/O error on {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("task file {path}, line {line}: {detail}")]
    TaskFile { path: PathBuf, line: usize, detail: String },
    #[error("task {id:?}: {detail}")]
    Task { id: String, detail: String },
    #[error("{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) trait OpsCtx<T> {
    fn ops(self, op: &'static str) -> Result<T>;
}

impl<T> OpsCtx<T> for Result<T, kamera_ops::Error> {
    fn ops(self, op: &'static str) -> Result<T> {
        self.map_err(|source| Error::Ops {
            op,
            source: Box::new(source),
        })
    }
}
