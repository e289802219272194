//! The fuzz targets: one per decoder, each with its real seed files, a dictionary for text
//! formats, a stated allocation bound and the invariants an accepted input must meet.

mod gguf;
mod record;
mod safetensors;
mod text;
mod tokenizer;

use crate::error::{Error, Result};

pub use gguf::{gguf_seed_from_model, gguf_seeds_dir};
pub use safetensors::{safetensors_seed_from_model, safetensors_seed_path, safetensors_seed_sources};

/// What a decoder made of one input.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Decoded (and the target's invariants held).
    Accepted,
    /// Refused with this error text (which names the input).
    Rejected(String),
}

/// Decodes one input: `Ok` with the outcome, `Err` with the invariant it broke.
pub type Decode = Box<dyn Fn(&[u8]) -> std::result::Result<Outcome, String>>;

/// A decoder under test.
pub struct Target {
    pub name: &'static str,
    /// What is decoded, and from which seeds.
    pub about: String,
    pub seeds: Vec<Vec<u8>>,
    /// Tokens the mutator splices into text formats.
    pub dict: Vec<&'static [u8]>,
    /// The most bytes one decode may hold live for an input of `n` bytes.
    pub bound: fn(usize) -> usize,
    /// The bound in words (for the report).
    pub bound_text: &'static str,
    /// Applied to most mutated inputs so that they pass a checksum and reach the parser.
    pub fixup: Option<fn(&mut [u8])>,
    pub decode: Decode,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("seeds", &self.seeds.len())
            .finish()
    }
}

/// Every target's name.
pub const NAMES: [&str; 7] = [
    "gguf",
    "safetensors",
    "record",
    "trace",
    "recorder",
    "scenario",
    "tokenizer",
];

/// The target called `name`.
pub fn by_name(name: &str) -> Result<Target> {
    match name {
        "gguf" => gguf::target(),
        "safetensors" => safetensors::target(),
        "record" => record::target(),
        "trace" => text::trace(),
        "recorder" => text::recorder(),
        "scenario" => text::scenario(),
        "tokenizer" => tokenizer::target(),
        _ => Err(Error::UnknownTarget {
            name: name.to_string(),
            known: NAMES.join(", "),
        }),
    }
}

/// The folder of committed seed files.
pub(crate) fn seeds_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds")
}

/// Reads one committed seed file.
pub(crate) fn read_seed(target: &'static str, name: &str) -> Result<Vec<u8>> {
    let path = seeds_dir().join(name);
    std::fs::read(&path).map_err(|e| Error::Seed {
        target,
        path,
        detail: e.to_string(),
    })
}

/// `Rejected(text)` when `text` names `input`; an invariant failure otherwise.
pub(crate) fn rejected(input: &str, text: String) -> std::result::Result<Outcome, String> {
    if text.contains(input) {
        Ok(Outcome::Rejected(text))
    } else {
        Err(format!("error does not name the input {input:?}: {text}"))
    }
}
