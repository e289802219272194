//! The crate's error: a target or its seeds could not be set up.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown fuzz target {name:?} (targets: {known})")]
    UnknownTarget { name: String, known: String },
    #[error("fuzz target {target}: seed {path}: {detail}")]
    Seed {
        target: &'static str,
        path: PathBuf,
        detail: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
