//! Shared pieces of the workspace integration tests: the repository root, the embedded default
//! model (loaded once per test binary), and the Chromium check. KL comes from kamera-eval's
//! metrics (`kamera_eval::kl`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use kamera_model::Model;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// SmolLM2-135M-Instruct, fetched by package name into `$KAMERA_HOME` once.
pub fn model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| kamera_agent::default_model(&kamera_model::default_home()).expect("default model"))
        .clone()
}

/// Fails with what to do when Debian's chromium is missing.
pub fn require_chromium() {
    let exe = std::env::var_os("KAMERA_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        exe.exists(),
        "chromium not found at {}: run scripts/install-chromium.sh (as root) first",
        exe.display()
    );
}

pub use kamera_browser::processes_of;
