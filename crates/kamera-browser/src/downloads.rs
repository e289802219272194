//! Downloads: refused unless the run gives a folder ([`crate::BrowserOptions::downloads`]); with
//! one, Chromium saves each download there (`Browser.setDownloadBehavior`, on a DevTools
//! connection of our own to the browser target, which gets the download events), and each
//! completed one is renamed from Chromium's guid to its suggested file name (made unique in the
//! folder) and listed as a [`Download`].
//!
//! Headless Chromium left to itself saves downloads into the user's `~/Downloads` (Debian's
//! chromium 156 does: tests/files.rs saw it); a run that names no folder gets `deny`, held for
//! the browser's life (a behavior set over a connection ends when that connection closes), so a
//! page can never write files on the machine.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chromiumoxide::cdp::browser_protocol::browser::{
    BrowserContextId, DownloadProgressState, EventDownloadProgress, EventDownloadWillBegin,
    SetDownloadBehaviorBehavior, SetDownloadBehaviorParams,
};
use chromiumoxide::conn::Connection;
use chromiumoxide::types::{CdpJsonEventMessage, Message};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, cdp};

/// One completed download, saved in the run's downloads folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Download {
    /// Where it came from.
    pub url: String,
    /// Its file name in the folder (the page's suggested name, ` (1)` added where taken).
    pub filename: String,
    /// Its path (the folder joined with `filename`).
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
}

#[derive(Default)]
struct State {
    /// Begun, not finished: guid -> (url, suggested name).
    pending: HashMap<String, (String, String)>,
    /// How many have begun so far.
    began: usize,
    done: Vec<Download>,
}

/// The browser's download policy and, with a folder, the downloads it completed.
pub(crate) struct Downloads {
    state: Arc<Mutex<State>>,
    /// Whether downloads are saved (a folder) or refused.
    saving: bool,
    task: tokio::task::JoinHandle<()>,
}

impl Downloads {
    /// Sets the download behavior of the browser at `ws` (of its `context`, when the run has one):
    /// `deny` without a folder; with one, saved there (created when missing) and listed.
    pub(crate) async fn start(ws: &str, folder: Option<&Path>, context: Option<BrowserContextId>) -> Result<Downloads> {
        let folder = match folder {
            Some(f) => {
                std::fs::create_dir_all(f).map_err(|source| Error::Io {
                    op: "downloads folder",
                    source,
                })?;
                Some(std::path::absolute(f).map_err(|source| Error::Io {
                    op: "downloads folder",
                    source,
                })?)
            }
            None => None,
        };
        let mut conn = Connection::<CdpJsonEventMessage>::connect(ws)
            .await
            .map_err(cdp("downloads"))?;
        let mut params = SetDownloadBehaviorParams::new(match folder {
            Some(_) => SetDownloadBehaviorBehavior::AllowAndName,
            None => SetDownloadBehaviorBehavior::Deny,
        });
        params.browser_context_id = context;
        if let Some(f) = &folder {
            params.download_path = Some(f.display().to_string());
            params.events_enabled = Some(true);
        }
        crate::raw::call(&mut conn, params)
            .await
            .map_err(|detail| Error::Chromium {
                op: "downloads",
                detail,
            })?;
        let state = Arc::new(Mutex::new(State::default()));
        let saving = folder.is_some();
        // The connection lives as long as the browser: the behavior set over it ends with it.
        let task = tokio::spawn(watch(conn, folder, state.clone()));
        Ok(Downloads { state, saving, task })
    }

    /// Whether downloads are saved (into a folder) rather than refused.
    pub(crate) fn saving(&self) -> bool {
        self.saving
    }

    /// How many downloads have begun so far.
    pub(crate) fn began(&self) -> usize {
        self.state.lock().map(|s| s.began).unwrap_or(0)
    }

    /// The downloads completed so far, in order.
    pub(crate) fn done(&self) -> Vec<Download> {
        self.state.lock().map(|s| s.done.clone()).unwrap_or_default()
    }

    /// Downloads begun and not finished (completed or cancelled) yet.
    pub(crate) fn pending(&self) -> usize {
        self.state.lock().map(|s| s.pending.len()).unwrap_or(0)
    }
}

impl Drop for Downloads {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Holds the connection open and follows its download events: a completed download is renamed
/// to its suggested name (without a folder there are none: downloads are denied).
async fn watch(mut conn: Connection<CdpJsonEventMessage>, folder: Option<PathBuf>, state: Arc<Mutex<State>>) {
    while let Some(msg) = conn.next().await {
        let Ok(Message::Event(ev)) = msg else { continue };
        let Some(folder) = &folder else { continue };
        match ev.method.as_ref() {
            EventDownloadWillBegin::IDENTIFIER => {
                let Ok(ev) = serde_json::from_value::<EventDownloadWillBegin>(ev.params) else {
                    continue;
                };
                tracing::info!(url = %ev.url, name = %ev.suggested_filename, "download began");
                if let Ok(mut s) = state.lock() {
                    s.pending.insert(ev.guid, (ev.url, ev.suggested_filename));
                    s.began += 1;
                }
            }
            EventDownloadProgress::IDENTIFIER => {
                let Ok(ev) = serde_json::from_value::<EventDownloadProgress>(ev.params) else {
                    continue;
                };
                if ev.state == DownloadProgressState::InProgress {
                    continue;
                }
                let Some((url, suggested)) = state.lock().ok().and_then(|mut s| s.pending.remove(&ev.guid)) else {
                    continue;
                };
                if ev.state != DownloadProgressState::Completed {
                    tracing::warn!(%url, "download cancelled");
                    continue;
                }
                let saved = folder.join(&ev.guid);
                let path = match unique(folder, &safe_name(&suggested)) {
                    Some(path) => match std::fs::rename(&saved, &path) {
                        Ok(()) => path,
                        Err(e) => {
                            tracing::warn!(from = %saved.display(), to = %path.display(), error = %e, "could not name a download; kept as saved");
                            saved
                        }
                    },
                    None => saved,
                };
                let bytes = std::fs::metadata(&path)
                    .map(|m| m.len())
                    .unwrap_or(ev.received_bytes as u64);
                let filename = path
                    .file_name()
                    .map_or_else(|| ev.guid.clone(), |n| n.to_string_lossy().into_owned());
                tracing::info!(%url, path = %path.display(), bytes, "download completed");
                if let Ok(mut s) = state.lock() {
                    s.done.push(Download {
                        url,
                        filename,
                        path,
                        bytes,
                    });
                }
            }
            _ => {}
        }
    }
}

/// A file name from a page's suggestion: no folders, no control characters, never empty or a
/// dot name.
fn safe_name(suggested: &str) -> String {
    let base = suggested.rsplit(['/', '\\']).next().unwrap_or("");
    let name: String = base
        .chars()
        .map(|c| if c.is_control() || c == ':' { '_' } else { c })
        .collect();
    let name = name.trim().trim_start_matches('.').to_string();
    if name.is_empty() { "download".into() } else { name }
}

/// `name` in `folder`, or `stem (n).ext` where that is taken (none free: `None`).
fn unique(folder: &Path, name: &str) -> Option<PathBuf> {
    let p = folder.join(name);
    if !p.exists() {
        return Some(p);
    }
    let (stem, ext) = match name.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() => (s, format!(".{e}")),
        _ => (name, String::new()),
    };
    (1..10_000).find_map(|n| {
        let cand = format!("{stem} ({n}){ext}");
        let p = folder.join(cand);
        (!p.exists()).then_some(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_in_the_folder_and_unique() {
        assert_eq!(safe_name("../../etc/passwd"), "passwd");
        assert_eq!(safe_name("..\\x.csv"), "x.csv");
        assert_eq!(safe_name(".."), "download");
        assert_eq!(safe_name("a\u{0}b.txt"), "a_b.txt");
        let d = tempfile::tempdir().unwrap();
        let name = |p: PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(name(unique(d.path(), "r.csv").unwrap()), "r.csv");
        std::fs::write(d.path().join("r.csv"), b"x").unwrap();
        assert_eq!(name(unique(d.path(), "r.csv").unwrap()), "r (1).csv");
        std::fs::write(d.path().join("r (1).csv"), b"x").unwrap();
        assert_eq!(name(unique(d.path(), "r.csv").unwrap()), "r (2).csv");
    }
}
