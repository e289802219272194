//! Scenario files as the harness reads them: kamera-agent's scenario format, plus the suites the
//! harness serves: a `[miniwob]` table ([`MiniWobSpec`]) becomes the task's start page and its
//! episode protocol (kamera-agent's `[episode]`).

use std::path::Path;

use kamera_agent::{Error, Result, Scenario};

use crate::miniwob::{self, MiniWobSpec};

/// Reads and checks a scenario file (kamera-agent's format, or with a `[miniwob]` task).
pub fn load_scenario(path: &Path) -> Result<Scenario> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Scenario {
        path: path.to_path_buf(),
        detail: format!("cannot read: {e}"),
    })?;
    parse_scenario(&text, path)
}

/// Parses and checks scenario TOML (`path` only names it in errors).
pub fn parse_scenario(text: &str, path: &Path) -> Result<Scenario> {
    let bad = |detail: String| Error::Scenario {
        path: path.to_path_buf(),
        detail,
    };
    // Not TOML at all: kamera-agent's parser names the error.
    let Ok(mut table) = toml::from_str::<toml::Table>(text) else {
        return Scenario::parse(text, path);
    };
    let Some(spec) = table.remove("miniwob") else {
        return Scenario::parse(text, path);
    };
    let spec: MiniWobSpec = spec.try_into().map_err(|e| bad(format!("[miniwob]: {e}")))?;
    for key in ["site", "episode", "start"] {
        if table.contains_key(key) {
            return Err(bad(format!(
                "[miniwob] sets the start page and the episode: remove `{key}`"
            )));
        }
    }
    table.insert("start".into(), miniwob::task_path(&spec.task).into());
    let episode = toml::Value::try_from(spec.episode()).map_err(|e| bad(format!("[miniwob]: {e}")))?;
    table.insert("episode".into(), episode);
    let text = toml::to_string(&table).map_err(|e| bad(format!("[miniwob]: {e}")))?;
    Scenario::parse(&text, path)
}
