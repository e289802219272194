//! The one error type of kamera-store. Damage, an unknown format version and a record of another
//! model are their own variants: callers treat them as a miss (re-encode), never as data.

use crate::id::Key;

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The record's checksum does not match its bytes (torn write, bit rot, foreign bytes).
    #[error("{op}: record {key} is corrupt: {detail}")]
    Corrupt {
        op: &'static str,
        key: String,
        detail: String,
    },
    /// The record was written in a format version this build does not read.
    #[error("{op}: record {key} has format version {found}, this build reads {expected}")]
    Version {
        op: &'static str,
        key: String,
        found: u16,
        expected: u16,
    },
    /// The record belongs to another model fingerprint than the key asked for.
    #[error("{op}: record {key} was written for model {found}, asked for {expected}")]
    ForeignModel {
        op: &'static str,
        key: String,
        expected: String,
        found: String,
    },
    /// A record or key that this store cannot hold (shape, kind or size out of range).
    #[error("{op}: invalid {what}: {detail}")]
    Invalid {
        op: &'static str,
        what: &'static str,
        detail: String,
    },
    /// The sled database failed (I/O, or sled's own corruption check).
    #[error("{op}: database error at {path}: {source}")]
    Db {
        op: &'static str,
        path: String,
        #[source]
        source: sled::Error,
    },
    /// A Redis command failed: connection refused or lost, timeout, or an error reply.
    #[error("{op}: redis at {url} failed on {key}: {source}")]
    Redis {
        op: &'static str,
        /// The server URL, password redacted.
        url: String,
        /// The record key, or what the command was about.
        key: String,
        #[source]
        source: redis::RedisError,
    },
    /// A record stored in pieces lacks a piece (evicted or expired before its manifest, or
    /// removed under a reader): refused, never served in part.
    #[error("{op}: record {key} is incomplete: {detail}")]
    Incomplete {
        op: &'static str,
        key: String,
        detail: String,
    },
    /// A transform-coded patch whose basis (a per-model constant, like the weights) is not among
    /// the bases the decoder was given.
    #[error(
        "{op}: record {key} is coded in patch basis {basis}, which is not among the bases given (open the store with the model's basis: kamera run --patch-basis FILE)"
    )]
    MissingBasis {
        op: &'static str,
        key: String,
        basis: String,
    },
    /// A KV or patch shape rejected by kamera-ops while decoding.
    #[error("{op}: {source}")]
    Ops {
        op: &'static str,
        #[source]
        source: kamera_ops::Error,
    },
}

impl Error {
    /// Whether this error means "the record is unusable": the caller re-encodes as on a miss.
    pub fn is_miss(&self) -> bool {
        matches!(
            self,
            Error::Corrupt { .. }
                | Error::Version { .. }
                | Error::ForeignModel { .. }
                | Error::Incomplete { .. }
                | Error::Ops { .. }
                | Error::MissingBasis { .. }
        )
    }

    /// Whether this error means "the store cannot be reached or read right now" (a Redis
    /// connection, a database I/O error), as opposed to a bad record or a bad argument.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Redis { .. } | Error::Db { .. })
    }

    pub(crate) fn corrupt(op: &'static str, key: &Key, detail: impl Into<String>) -> Error {
        Error::Corrupt {
            op,
            key: key.to_string(),
            detail: detail.into(),
        }
    }
}

/// Result with the kamera-store [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
