//! Errors of the GPU backend.

/// What went wrong, naming the op and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Built without the `cuda` feature.
    #[error("{op}: kamera-gpu was built without the `cuda` feature (rebuild with `--features cuda`)")]
    NotCompiled { op: &'static str },
    /// The CUDA driver or NVRTC library is not installed or not loadable.
    #[error("{op}: {lib} is not available on this machine (no NVIDIA driver / CUDA toolkit found)")]
    NoLibrary { op: &'static str, lib: &'static str },
    /// A CUDA driver call failed.
    #[error("{op}: CUDA driver error: {detail}")]
    Driver { op: &'static str, detail: String },
    /// NVRTC failed to compile kernels/*.cu.
    #[error("{op}: NVRTC failed to compile kernels/{file}.cu for {arch}: {detail}")]
    Compile {
        op: &'static str,
        file: &'static str,
        arch: String,
        detail: String,
    },
    /// A model, context or chunk the device path does not take.
    #[error("{op}: {detail}")]
    Unsupported { op: &'static str, detail: String },
    /// The operator rejected its inputs (shapes, non-finite values, specs).
    #[error(transparent)]
    Ops(#[from] kamera_ops::Error),
}

/// Result with the kamera-gpu [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
