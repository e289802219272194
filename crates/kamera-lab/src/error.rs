//! The crate's error type: every variant names the operation and the input involved.

use std::path::PathBuf;

/// Errors of the reuse experiments (kamera-eval's errors map to the variants of the same name).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op}: model error: {source}")]
    Model {
        op: &'static str,
        #[source]
        source: Box<kamera_model::Error>,
    },
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
    #[error(
        "method {spec:?}: {detail} (known: full, prefix, blind, kamera:R, kamera-budget:B, kamera-share:B, kamera-kv:BK+BV, kamera-energy:E[+EV], orbit:R, orbit-later:R, orbit-slot:R, orbit-unseen:R, cacheblend:F, epic:K, oracle-tokens:F, oracle-layer:L[k|v], oracle-except:L[k|v], recall:SPEC, recall-foreign:SPEC, kvq:B, kvq-deficit:B; patch methods take /q8, /q4, /f32, /f16, /bf16, /drop=S and more, see the README)"
    )]
    Method { spec: String, detail: String },
    #[error("{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
    #[error("{op}: store encoding: {source}")]
    Store {
        op: &'static str,
        #[source]
        source: Box<kamera_store::Error>,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<kamera_eval::Error> for Error {
    fn from(e: kamera_eval::Error) -> Error {
        use kamera_eval::Error as Eval;
        match e {
            Eval::Ops { op, source } => Error::Ops { op, source },
            Eval::Io { op, path, source } => Error::Io { op, path, source },
            Eval::TaskFile { path, line, detail } => Error::TaskFile { path, line, detail },
            Eval::Task { id, detail } => Error::Task { id, detail },
            Eval::Invalid { op, detail } => Error::Invalid { op, detail },
        }
    }
}

/// An invalid method or state in a task's run (`Evaluator::run_task`).
pub(crate) fn invalid(detail: &str) -> Error {
    Error::Invalid {
        op: "Evaluator::run_task",
        detail: detail.into(),
    }
}

pub(crate) trait ModelCtx<T> {
    fn model(self, op: &'static str) -> Result<T>;
}

impl<T> ModelCtx<T> for Result<T, kamera_model::Error> {
    fn model(self, op: &'static str) -> Result<T> {
        self.map_err(|source| Error::Model {
            op,
            source: Box::new(source),
        })
    }
}

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
