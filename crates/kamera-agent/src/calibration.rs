//! The calibration file `kamera calibrate` writes (`$KAMERA_HOME/calibration/<model>.json`, one
//! per model fingerprint and prefill precision, since both change the timings): this machine's
//! measured rates and the scheduler's cost model built from them. The CLI writes it; the runtime
//! ([`crate::open_runtime`]) and the benches read it here.

use std::path::{Path, PathBuf};

use kamera_model::Model;
use kamera_sched::CostModel;
use kamera_store::ModelFp;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What `kamera calibrate` writes (JSON). Fields added later carry `#[serde(default)]`, so older
/// files still read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Calibration {
    /// The model as named on the command line (for people).
    pub model: String,
    /// [`Model::fingerprint`] of the model measured (hex).
    pub fingerprint: String,
    pub measured_unix_s: u64,
    pub cores: usize,
    pub probe_tokens: usize,
    /// Raw rates behind the cost model.
    pub prefill_tok_s: f64,
    pub relocate_gb_s: f64,
    pub patch_gb_s: f64,
    pub store_read_gb_s: f64,
    pub store_write_gb_s: f64,
    /// The cost model (its patch points are not part of the file: the runtime takes them from
    /// `kamera_sched::measured_points` by the model's fingerprint).
    pub cost: CostModel,
}

impl Calibration {
    /// Where the calibration of `model` (as loaded: its prefill precision counts) lives under
    /// `home` (`$KAMERA_HOME`).
    pub fn path(home: &Path, model: &Model) -> PathBuf {
        let fp = ModelFp::of(model.fingerprint()).to_string();
        home.join("calibration").join(format!("{}.json", &fp[..16]))
    }

    /// Reads a calibration file, checking that it was measured on `model`.
    pub fn read(path: &Path, model: &Model) -> Result<Calibration> {
        let bad = |detail: String| Error::Config {
            what: "calibration",
            path: path.to_path_buf(),
            detail,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let c: Calibration = serde_json::from_str(&text).map_err(|e| bad(format!("not a calibration file: {e}")))?;
        if c.fingerprint != model.fingerprint() {
            return Err(bad(format!(
                "measured on model {} ({}), not on this one ({}); run `kamera calibrate`",
                c.fingerprint,
                c.model,
                model.fingerprint()
            )));
        }
        Ok(c)
    }

    /// Writes the file (creating its folder).
    pub fn write(&self, path: &Path) -> Result<()> {
        let io = |e: std::io::Error| Error::Config {
            what: "calibration",
            path: path.to_path_buf(),
            detail: e.to_string(),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Config {
            what: "calibration",
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        std::fs::write(path, text).map_err(io)
    }
}
