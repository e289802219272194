//! MiniWoB++ from the `miniwob` pip package (fetched with `pip download --no-deps`, checked by
//! sha256, unpacked under `$KAMERA_HOME/miniwob-1.1.0/`) and served on loopback. The episode
//! protocol the agent loop drives (seed, start, reward globals) is kamera-agent's
//! `MiniWobSpec::start_js` and `MiniWobSpec::REWARD_JS`.

use std::path::{Path, PathBuf};
use std::process::Command;

use kamera_agent::{Error, Result, sha256_hex};

use crate::io;

pub const VERSION: &str = "1.1.0";
const WHEEL: &str = "miniwob-1.1.0-py3-none-any.whl";
const WHEEL_SHA256: &str = "297006e84219d56ad037e843527ed773a4a82509dc43b6031ec4a3ad3e3e61d9";

/// The unpacked `html/` folder (with `core/` and `miniwob/` inside), fetching it on first use.
pub fn ensure(home: &Path) -> Result<PathBuf> {
    let root = home.join(format!("miniwob-{VERSION}"));
    let html = root.join("html");
    if html.join("core").join("core.js").exists() {
        return Ok(html);
    }
    let dl = home.join("downloads");
    std::fs::create_dir_all(&dl).map_err(io("create", &dl))?;
    let wheel = dl.join(WHEEL);
    if !wheel.exists() {
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
            .arg(&dl)
            .output()
            .map_err(|e| Error::MiniWob(format!("cannot run {py} -m pip: {e}")))?;
        if !out.status.success() || !wheel.exists() {
            return Err(Error::MiniWob(format!(
                "pip download miniwob=={VERSION} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let bytes = std::fs::read(&wheel).map_err(io("read", &wheel))?;
    let got = sha256_hex(&bytes);
    if got != WHEEL_SHA256 {
        return Err(Error::MiniWob(format!(
            "{} has sha256 {got}, expected {WHEEL_SHA256}",
            wheel.display()
        )));
    }
    let tmp = root.with_extension("partial");
    let _ = std::fs::remove_dir_all(&tmp);
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| Error::MiniWob(e.to_string()))?;
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).map_err(|e| Error::MiniWob(e.to_string()))?;
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
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&tmp, &root).map_err(io("rename", &root))?;
    Ok(html)
}

/// The page of `task` on a server serving [`ensure`]'s folder.
pub fn task_path(task: &str) -> String {
    format!("/miniwob/{task}.html")
}
