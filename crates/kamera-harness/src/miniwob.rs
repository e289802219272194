//! MiniWoB++ from the `miniwob` pip package (fetched with `pip download --no-deps`, checked by
//! sha256, unpacked under `$KAMERA_HOME/miniwob-1.1.0/`) and served on loopback; a scenario
//! file's `[miniwob]` table ([`MiniWobSpec`]) becomes the start page and the episode protocol
//! (seed, start, reward globals) the agent loop drives: a kamera-agent [`Episode`].

use std::path::{Path, PathBuf};
use std::process::Command;

use kamera_agent::{Episode, Error, Result, sha256_hex};
use serde::{Deserialize, Serialize};

use crate::io;

pub const VERSION: &str = "1.1.0";
/// The suite name of [`Episode::suite`] for MiniWoB++ pages.
pub const SUITE: &str = "miniwob";
const WHEEL: &str = "miniwob-1.1.0-py3-none-any.whl";
const WHEEL_SHA256: &str = "297006e84219d56ad037e843527ed773a4a82509dc43b6031ec4a3ad3e3e61d9";

/// The unpacked `html/` folder (with `core/` and `miniwob/` inside), fetching it on first use.
pub fn ensure(home: &Path) -> Result<PathBuf> {
    let root = home.join(format!("miniwob-{VERSION}"));
    let html = root.join("html");
    let complete = || html.join("core").join("core.js").exists();
    if complete() {
        return Ok(html);
    }
    let dl = home.join("downloads");
    std::fs::create_dir_all(&dl).map_err(io("create", &dl))?;
    let wheel = dl.join(WHEEL);
    // Several tests (threads, processes) may fetch at once on an empty home: each downloads and
    // unpacks into a folder of its own and renames the result into place, so none reads a
    // half-written wheel or serves a folder another one is replacing.
    static FETCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let own = format!(
        "partial-{}-{}",
        std::process::id(),
        FETCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    if !wheel.exists() {
        let tmp_dl = dl.join(&own);
        std::fs::create_dir_all(&tmp_dl).map_err(io("create", &tmp_dl))?;
        let py = std::env::var("KAMERA_PYTHON").unwrap_or_else(|_| "python3".into());
        let out = Command::new(&py)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(format!("miniwob=={VERSION}"))
            .arg("-d")
            .arg(&tmp_dl)
            .output()
            .map_err(|e| suite_error(format!("cannot run {py} -m pip: {e}")))?;
        let got = tmp_dl.join(WHEEL);
        if !out.status.success() || !got.exists() {
            let _ = std::fs::remove_dir_all(&tmp_dl);
            return Err(suite_error(format!(
                "pip download miniwob=={VERSION} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let moved = std::fs::rename(&got, &wheel);
        let _ = std::fs::remove_dir_all(&tmp_dl);
        moved.map_err(io("rename", &wheel))?;
    }
    let bytes = std::fs::read(&wheel).map_err(io("read", &wheel))?;
    let got = sha256_hex(&bytes);
    if got != WHEEL_SHA256 {
        return Err(suite_error(format!(
            "{} has sha256 {got}, expected {WHEEL_SHA256}",
            wheel.display()
        )));
    }
    let tmp = home.join(format!("miniwob-{VERSION}.{own}"));
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| suite_error(e.to_string()))?;
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).map_err(|e| suite_error(e.to_string()))?;
        let Some(name) = f.enclosed_name() else { continue };
        let Ok(rel) = name.strip_prefix("miniwob") else {
            continue;
        };
        if !rel.starts_with("html") || f.is_dir() {
            continue;
        }
        let dst = tmp.join(rel);
        if let Some(p) = dst.parent() {
            std::fs::create_dir_all(p).map_err(io("create", p))?;
        }
        let mut out = std::fs::File::create(&dst).map_err(io("create", &dst))?;
        std::io::copy(&mut f, &mut out).map_err(io("unpack", &dst))?;
    }
    // The rename fails where a folder is already there: another fetch's, complete, is kept; one
    // left incomplete by an older layout is replaced (no other fetch can place its own over it).
    let mut placed = std::fs::rename(&tmp, &root);
    if placed.is_err() && !complete() {
        let _ = std::fs::remove_dir_all(&root);
        placed = std::fs::rename(&tmp, &root);
    }
    let _ = std::fs::remove_dir_all(&tmp);
    if complete() {
        return Ok(html);
    }
    placed.map_err(io("rename", &root))?;
    Ok(html)
}

/// The page of `task` on a server serving [`ensure`]'s folder.
pub fn task_path(task: &str) -> String {
    format!("/miniwob/{task}.html")
}

/// An error fetching or serving MiniWoB++.
pub(crate) fn suite_error(detail: String) -> Error {
    Error::Suite {
        suite: SUITE.into(),
        detail,
    }
}

/// A scenario file's `[miniwob]` table: the MiniWoB++ task to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MiniWobSpec {
    /// Task name, e.g. `click-test` (the page miniwob/html/miniwob/<task>.html).
    pub task: String,
    #[serde(default)]
    pub seed: u64,
    /// Episode time limit in ms (the package's default is 10000; its reward decays with time).
    #[serde(default)]
    pub episode_ms: Option<u64>,
}

impl MiniWobSpec {
    /// JavaScript that reads MiniWoB++'s `[done, reward, raw_reward, reason]` globals.
    pub const REWARD_JS: &str = "[WOB_DONE_GLOBAL, WOB_REWARD_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON]";

    /// JavaScript that seeds and starts this task's episode (after the page loaded), as the
    /// package's episode protocol says: `Math.seedrandom(seed)`, `core.startEpisodeReal()`.
    pub fn start_js(&self) -> String {
        let limit = self
            .episode_ms
            .map(|ms| format!("core.EPISODE_MAX_TIME = {ms};"))
            .unwrap_or_default();
        let seed = self.seed;
        format!("(() => {{ Math.seedrandom('{seed}'); {limit} core.startEpisodeReal(); return WOB_TASK_READY; }})()")
    }

    /// The episode protocol the agent loop drives for this task.
    pub fn episode(&self) -> Episode {
        Episode {
            suite: SUITE.into(),
            start_js: self.start_js(),
            reward_js: Self::REWARD_JS.into(),
        }
    }
}
