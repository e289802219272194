//! The one error type of kamera-sched.

use kamera_store::ChunkId;

/// Errors of the scheduler and the plan executor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request cannot fit the window's token budget even after evicting what may be evicted.
    #[error("{op}: {need} tokens do not fit a budget of {budget} ({fixed} held by pinned chunks)")]
    OverBudget {
        op: &'static str,
        need: usize,
        budget: usize,
        fixed: usize,
    },
    /// A chunk the operation needs is not where it should be (not in the window, not known).
    #[error("{op}: chunk {chunk} {detail}")]
    Chunk {
        op: &'static str,
        chunk: String,
        detail: String,
    },
    /// A request that makes no sense for the window's state.
    #[error("{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
    /// The store failed (I/O), or a record it must hold is missing or unusable.
    #[error("{op}: store: {source}")]
    Store {
        op: &'static str,
        #[source]
        source: kamera_store::Error,
    },
    /// An operator of kamera-ops rejected its input.
    #[error("{op}: {source}")]
    Ops {
        op: &'static str,
        #[source]
        source: kamera_ops::Error,
    },
    /// The model runner failed.
    #[error("{op}: runner: {source}")]
    Runner {
        op: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    pub(crate) fn chunk(op: &'static str, id: &ChunkId, detail: impl Into<String>) -> Error {
        Error::Chunk {
            op,
            chunk: short(id),
            detail: detail.into(),
        }
    }
}

/// The first 12 hex digits of a chunk id.
pub fn short(id: &ChunkId) -> String {
    id.to_string()[..12].to_string()
}

/// Result with the kamera-sched [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
