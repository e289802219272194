//! Progress on stderr, drawn only when stderr is a terminal: a bar for counted work (episodes)
//! and a byte counter while a model is fetched.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kamera_model::ModelName;

/// Whether progress is drawn (stderr is a terminal).
pub fn drawn() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar over `total` items with `what` as the unit, hidden when stderr is not a terminal.
pub fn bar(total: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total as u64);
    if drawn() {
        pb.set_draw_target(ProgressDrawTarget::stderr());
        let t = format!("{{spinner}} [{{bar:30}}] {{pos}}/{{len}} {what} (ETA {{eta}}) {{msg}}");
        if let Ok(style) = ProgressStyle::with_template(&t) {
            pb.set_style(style.progress_chars("=> "));
        }
    } else {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb
}

/// Bytes under `p` (a file, or a folder's files, recursively).
fn bytes(p: &Path) -> u64 {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => m.len(),
        Ok(m) if m.is_dir() => std::fs::read_dir(p)
            .map(|rd| rd.flatten().map(|e| bytes(&e.path())).sum())
            .unwrap_or(0),
        _ => 0,
    }
}

/// kamera-model's fetch of `name` into `home`, with the bytes downloaded and joined so far
/// counted on stderr (its temp folder and partial file, named by this process's id).
pub fn fetch(name: ModelName, home: &Path) -> Result<PathBuf> {
    let cached = kamera_model::model_path(name, home).exists();
    if cached || !drawn() {
        return kamera_model::fetch(name, home).with_context(|| format!("fetching {}", name.as_str()));
    }
    let pb = ProgressBar::new_spinner();
    pb.set_draw_target(ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} fetching {prefix}: {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.set_prefix(name.as_str());
    let done = Arc::new(AtomicBool::new(false));
    let models = home.join("models");
    let pid = std::process::id();
    let tmp = models.join(format!(".tmp-{}-{pid}", name.as_str()));
    let partial = kamera_model::model_path(name, home).with_extension(format!("gguf.partial-{pid}"));
    let watcher = {
        let (pb, done) = (pb.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let (d, j) = (bytes(&tmp), bytes(&partial));
                pb.set_message(format!(
                    "{:.1} MB downloaded, {:.1} MB joined and checked",
                    d as f64 / 1e6,
                    j as f64 / 1e6
                ));
                pb.tick();
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let r = kamera_model::fetch(name, home);
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    pb.finish_and_clear();
    r.with_context(|| format!("fetching {}", name.as_str()))
}
