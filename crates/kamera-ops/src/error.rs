//! The one error type of kamera-ops: every variant names the operation and the shapes involved.

/// Errors of the operator. No function of this crate panics on bad input.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum Error {
    /// Two operands (or an operand and the layout) disagree on a shape.
    #[error("{op}: shape mismatch for {what}: expected {expected}, got {got}")]
    Shape {
        op: &'static str,
        what: String,
        expected: String,
        got: String,
    },
    /// A NaN or infinity in an input (or produced from one).
    #[error("{op}: non-finite value in {what} at index {index}")]
    NonFinite {
        op: &'static str,
        what: String,
        index: usize,
    },
    /// A RoPE spec, layout or setting that this crate does not implement or that is malformed.
    #[error("{op}: unsupported or invalid {what}: {detail}")]
    Invalid {
        op: &'static str,
        what: &'static str,
        detail: String,
    },
    /// The truncated SVD failed to converge.
    #[error("{op}: SVD of a {rows}x{cols} matrix did not converge")]
    Svd { op: &'static str, rows: usize, cols: usize },
}

/// Result with the kamera-ops [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn shape(op: &'static str, what: impl Into<String>, expected: impl ToString, got: impl ToString) -> Error {
    Error::Shape {
        op,
        what: what.into(),
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

pub(crate) fn invalid(op: &'static str, what: &'static str, detail: impl Into<String>) -> Error {
    Error::Invalid {
        op,
        what,
        detail: detail.into(),
    }
}
