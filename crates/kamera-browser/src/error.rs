//! The one error type of kamera-browser.

/// What went wrong driving a browser.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Chromium executable is not there.
    #[error(
        "chromium not found at {path}: run scripts/install-chromium.sh (Debian's chromium, as root) or set KAMERA_CHROMIUM"
    )]
    ChromiumMissing { path: String },
    /// Launching or talking to Chromium failed.
    #[error("chromium {op}: {detail}")]
    Chromium { op: &'static str, detail: String },
    /// The browser process exited (killed, crashed) under a call: the run cannot go on.
    #[error("chromium exited ({status}) during {op}")]
    Crashed { op: &'static str, status: String },
    /// A browser call did not answer in time.
    #[error("{op} timed out after {ms} ms")]
    Timeout { op: &'static str, ms: u64 },
    /// A navigation (or a page that ended up) off the allowed origins.
    #[error("navigation to {url} refused: {reason}")]
    Refused { url: String, reason: String },
    /// An action names an element that the last observation does not have.
    #[error("{op}: no element with id {id} in the last observation")]
    NoElement { op: &'static str, id: u32 },
    /// An action's target exists but cannot take it: hidden, disabled, of the wrong kind (a
    /// `select` on a button), without the named option, or never appeared (`wait_for`).
    #[error("{op}: {detail}")]
    Target { op: &'static str, detail: String },
    /// An action that this browser cannot perform, or malformed input.
    #[error("{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
    /// A file an action names (an upload's) that is missing or cannot be read.
    #[error("{op} {path}: {detail}")]
    File {
        op: &'static str,
        path: std::path::PathBuf,
        detail: String,
    },
    /// A replayed browser ran out of recorded observations or was asked for what it did not record.
    #[error("replay: {0}")]
    Replay(String),
    /// The run was cancelled.
    #[error("cancelled")]
    Cancelled,
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn cdp(op: &'static str) -> impl FnOnce(chromiumoxide::error::CdpError) -> Error {
    move |e| Error::Chromium {
        op,
        detail: e.to_string(),
    }
}
