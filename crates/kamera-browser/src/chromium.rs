//! [`ChromiumBrowser`]: Debian's chromium, headless, driven over the DevTools protocol.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use chromiumoxide::cdp::browser_protocol::browser::BrowserContextId;
use chromiumoxide::cdp::browser_protocol::page::CaptureScreenshotFormat;
use chromiumoxide::cdp::browser_protocol::target::TargetId;
use chromiumoxide::page::ScreenshotParams;
use chromiumoxide::{Browser as CdpBrowser, Page};
use serde::Deserialize;

use crate::Browser;
use crate::confine::{Blocked, Confinement};
use crate::dialogs::Dialogs;
use crate::downloads::{Download, Downloads};
use crate::error::{Error, Result, cdp};
use crate::types::{Action, Element, Observation};

mod actions;
mod launch;
mod navigation;
mod remote;
mod state;

pub use launch::{BrowserOptions, ChromiumConfig};
use navigation::{Navigation, mark_js, new_document_js};

const OBSERVE_JS: &str = include_str!("observe.js");

/// A headless Chromium with one page, its own temporary user-data-dir, background networking off.
pub struct ChromiumBrowser {
    cfg: ChromiumConfig,
    browser: CdpBrowser,
    page: Page,
    handler: tokio::task::JoinHandle<()>,
    profile: launch::ProfileDir,
    /// The browser context of the run's tabs (an attached browser's, made for this run).
    context: Option<BrowserContextId>,
    /// Origins whose localStorage was imported (exported again with the allowed ones).
    imported: Vec<String>,
    /// The browser process (its helpers are its children and exit with it).
    pid: Option<u32>,
    confinement: Confinement,
    /// The download policy, and the downloads saved in the run's folder.
    downloads: Downloads,
    /// Dialog answering, one per tab set up (the launch tab, then each tab switched to).
    dialogs: Vec<Dialogs>,
    last: Option<Observation>,
    /// Tabs in order of first sight (the first is the launch page).
    tabs: Vec<TargetId>,
    /// Tabs whose dialogs, click hook and reports are set up (the launch tab, tabs switched to).
    set_up: Vec<TargetId>,
    /// The mark last set on the page's document ([`ChromiumBrowser::next_mark`]).
    doc_mark: u64,
}

#[derive(Deserialize)]
struct RawObservation {
    title: String,
    url: String,
    text: String,
    elements: Vec<Element>,
}

impl ChromiumBrowser {
    /// JavaScript dialogs that opened (a `beforeunload`, or one the page's hook did not catch),
    /// each answered at once; the hook's are counted in the page's `window.__kameraDialogs`.
    pub fn dialogs(&self) -> usize {
        self.dialogs.iter().map(Dialogs::count).sum()
    }

    /// Tabs open now (Chromium's own helper pages aside).
    pub async fn open_tabs(&self) -> Result<usize> {
        let browser = &self.browser;
        let pages = with_timeout("open_tabs", self.cfg.timeout, async {
            browser.pages().await.map_err(cdp("open_tabs"))
        })
        .await?;
        let mut n = 0;
        for p in pages {
            let url = with_timeout("open_tabs", self.cfg.timeout, async {
                p.url().await.map_err(cdp("open_tabs"))
            })
            .await?
            .unwrap_or_default();
            if !url.starts_with("chrome") && !url.starts_with("devtools:") {
                n += 1;
            }
        }
        Ok(n)
    }

    /// The downloads completed so far in [`BrowserOptions::downloads`], in order (none without
    /// that folder: downloads are refused).
    pub fn downloads(&self) -> Vec<Download> {
        self.downloads.done()
    }

    /// After an action: waits (bounded by the call timeout) for the downloads it began to finish;
    /// where it asked for one (`asked`: how many had begun before it), first for that one to
    /// begin, at most 1.5 s (its events come on the browser's connection, not the page's).
    async fn await_downloads(&self, asked: Option<usize>) {
        let t0 = std::time::Instant::now();
        let to_begin = || {
            asked.is_some_and(|before| {
                self.downloads.saving()
                    && self.downloads.began() == before
                    && t0.elapsed() < Duration::from_millis(1500)
            })
        };
        while (to_begin() || self.downloads.pending() > 0) && t0.elapsed() < self.cfg.timeout && !self.gone() {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The browser process's id (its helper processes are its children).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The profile (user-data-dir): the kept one of [`BrowserOptions::profile`], else a
    /// temporary one, removed when this is dropped.
    pub fn profile_dir(&self) -> &Path {
        self.profile.path()
    }

    /// How the browser process ended, if it has.
    fn exited(&mut self) -> Option<String> {
        match self.browser.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }

    /// Before a call: a browser that has exited is [`Error::Crashed`] at once.
    fn alive(&mut self, op: &'static str) -> Result<()> {
        match self.exited() {
            Some(status) => Err(Error::Crashed { op, status }),
            None => Ok(()),
        }
    }

    /// After a call: a protocol error or a timeout because the browser exited is [`Error::Crashed`].
    fn diagnose<T>(&mut self, r: Result<T>) -> Result<T> {
        match r {
            Err(Error::Chromium { op, detail }) => Err(match self.exited() {
                Some(status) => Error::Crashed { op, status },
                None => Error::Chromium { op, detail },
            }),
            Err(Error::Timeout { op, ms }) => Err(match self.exited() {
                Some(status) => Error::Crashed { op, status },
                None => Error::Timeout { op, ms },
            }),
            r => r,
        }
    }

    /// Whether the browser process is gone (exited, or a zombie not reaped yet): cheaper than a
    /// call that would wait for its timeout on a closed connection.
    fn gone(&self) -> bool {
        let Some(pid) = self.pid else { return false };
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with(['Z', 'X'])),
            Err(_) => cfg!(target_os = "linux"),
        }
    }

    async fn eval_once(&self, op: &'static str, js: &str) -> Result<serde_json::Value> {
        if self.gone() {
            return Err(Error::Chromium {
                op,
                detail: "the browser process is gone".into(),
            });
        }
        let page = &self.page;
        with_timeout(op, self.cfg.timeout, async {
            let r = page.evaluate(js).await.map_err(cdp(op))?;
            Ok(r.value().cloned().unwrap_or(serde_json::Value::Null))
        })
        .await
    }

    /// Evaluates `js`, retrying (bounded) while a navigation swaps the execution context.
    async fn eval_value(&self, op: &'static str, js: &str) -> Result<serde_json::Value> {
        let mut tries = 0;
        loop {
            match self.eval_once(op, js).await {
                Err(Error::Chromium { detail, .. })
                    if tries < 20 && (detail.contains("context") || detail.contains("Context")) =>
                {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                r => return r,
            }
        }
    }

    /// After an action that navigated (or may have, where its events are not watched: `Back`,
    /// or the watch failed): waits (up to `limit`) for a new document to replace the marked one
    /// and finish loading, polling at each of `events` and every 25 ms. Without a navigation it
    /// returns after `limit`.
    async fn await_navigation(&self, limit: Duration, mut events: Option<&mut Navigation>) {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < limit {
            match self.eval_once("navigation", &new_document_js(self.doc_mark)).await {
                Ok(serde_json::Value::String(s)) if s == "complete" => return,
                Err(Error::Timeout { .. }) => return,
                Err(_) if self.gone() => return,
                _ => {}
            }
            let left = limit.saturating_sub(t0.elapsed()).min(Duration::from_millis(25));
            Navigation::pause_on(events.as_deref_mut(), left).await;
        }
    }

    async fn settle(&self) {
        // Wait (bounded: at most one call timeout in all) for the document to finish loading
        // after an action; a page that does not answer is left to the next call's timeout.
        let t0 = std::time::Instant::now();
        while t0.elapsed() < self.cfg.timeout {
            match self.eval_once("settle", "document.readyState").await {
                Ok(serde_json::Value::String(s)) if s == "complete" => break,
                Err(Error::Timeout { .. }) => break,
                Err(_) if self.gone() => break,
                _ => tokio::time::sleep(Duration::from_millis(40)).await,
            }
        }
    }

    fn element(&self, op: &'static str, id: u32) -> Result<Element> {
        self.last
            .as_ref()
            .and_then(|o| o.element(id))
            .cloned()
            .ok_or(Error::NoElement { op, id })
    }

    async fn goto(&mut self, url: &str) -> Result<()> {
        self.cfg.origins.check(url)?;
        // chromiumoxide's goto waits for every frame's navigation to finish, and queues later
        // navigations behind it; a frame whose load Chromium refuses (an iframe of a file: URL)
        // never finishes, so every later goto would time out. Navigate from the page instead and
        // poll for the new document (the old one is marked); where the page cannot run the
        // script (a hung page, no page yet), fall back to goto.
        let mark = self.next_mark();
        let marked = tokio::time::timeout(Duration::from_secs(1), self.eval_once("mark", &mark_js(mark)))
            .await
            .is_ok_and(|r| r.is_ok());
        let target = serde_json::to_string(url).unwrap_or_default();
        if marked {
            // Its load event wakes the poll (without the events, it polls every 40 ms).
            let mut events = Navigation::watch(&self.page).await.ok();
            let _ = self.eval_once("navigate", &format!("location.href = {target}")).await;
            let poll = format!(
                "window.__kameraDoc === {mark} ? (location.href === {target} ? 'complete' : 'same') : document.readyState"
            );
            with_timeout("navigate", self.cfg.timeout, async {
                loop {
                    match self.eval_once("navigate", &poll).await {
                        Ok(serde_json::Value::String(s)) if s == "complete" => return Ok(()),
                        Err(e) if self.gone() => return Err(e),
                        _ => {}
                    }
                    Navigation::pause_on(events.as_mut(), Duration::from_millis(40)).await;
                }
            })
            .await?;
        } else {
            let page = &self.page;
            with_timeout("navigate", self.cfg.timeout, async {
                page.goto(url).await.map_err(cdp("navigate"))?;
                Ok(())
            })
            .await?;
        }
        self.settle().await;
        Ok(())
    }

    async fn key(&self, key: &str) -> Result<()> {
        let page = &self.page;
        with_timeout("key", self.cfg.timeout, async {
            let body = page.find_element("body").await.map_err(cdp("key"))?;
            body.press_key(key).await.map_err(cdp("key"))?;
            Ok(())
        })
        .await
    }

    /// After an action the page may have moved: refuse (and leave) a page off the allowed origins.
    async fn check_location(&mut self) -> Result<()> {
        let url = self.eval_value("location", "location.href").await?;
        let url = url.as_str().unwrap_or("").to_string();
        if let Err(e) = self.cfg.origins.check(&url) {
            let _ = self.page.goto("about:blank").await;
            return Err(e);
        }
        Ok(())
    }
}

async fn with_timeout<T>(op: &'static str, limit: Duration, f: impl Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            op,
            ms: limit.as_millis() as u64,
        }),
    }
}

#[async_trait]
impl Browser for ChromiumBrowser {
    async fn navigate(&mut self, url: &str) -> Result<()> {
        self.alive("navigate")?;
        let r = self.goto(url).await;
        self.diagnose(r)
    }

    async fn act(&mut self, action: &Action) -> Result<()> {
        self.alive("act")?;
        let r = self.act_once(action).await;
        self.diagnose(r)
    }

    async fn observe(&mut self) -> Result<Observation> {
        self.alive("observe")?;
        let r = self.observe_once(true).await;
        self.diagnose(r)
    }

    async fn observe_text(&mut self) -> Result<Observation> {
        self.alive("observe")?;
        let r = self.observe_once(false).await;
        self.diagnose(r)
    }

    async fn eval(&mut self, js: &str) -> Result<serde_json::Value> {
        self.alive("eval")?;
        let r = self.eval_value("eval", js).await;
        self.diagnose(r)
    }

    fn blocked(&self) -> Vec<Blocked> {
        self.confinement.blocked()
    }

    fn downloads(&self) -> Vec<Download> {
        self.downloads.done()
    }

    async fn close(&mut self) -> Result<()> {
        // The storage state is written while the browser still answers; a failure to write it
        // is reported once the browser is shut down.
        let mut saved = Ok(());
        if let Some(path) = self.cfg.options.storage_state.clone()
            && self.exited().is_none()
        {
            saved = self.export_state_file(&path).await;
        }
        if self.is_attached() {
            // Not ours to shut down: the run's context goes, the browser stays.
            self.detach().await;
            return saved;
        }
        if self.exited().is_none() {
            let _ = tokio::time::timeout(Duration::from_secs(5), self.browser.close()).await;
            let _ = tokio::time::timeout(Duration::from_secs(5), self.browser.wait()).await;
        }
        let _ = self.browser.kill().await;
        self.handler.abort();
        saved
    }
}

impl ChromiumBrowser {
    /// A mark no document of this run carries yet: a page Back restores from Chromium's
    /// back/forward cache still holds the mark it had when it was left, so a fixed mark would
    /// take it for the document the action started from.
    fn next_mark(&mut self) -> u64 {
        self.doc_mark += 1;
        self.doc_mark
    }

    async fn act_once(&mut self, action: &Action) -> Result<()> {
        // Mark the current document so that a navigation the action causes can be waited for.
        let mark = self.next_mark();
        let _ = self.eval_value("mark", &mark_js(mark)).await;
        let may_navigate = match action {
            Action::Click { id } => self.last.as_ref().and_then(|o| o.element(*id)).is_some_and(|e| {
                (!e.href.is_empty() && !e.href.starts_with('#') && !e.href.starts_with("javascript:"))
                    || matches!(e.tag.as_str(), "button" | "input")
            }),
            Action::Key { key } => key == "Enter",
            Action::Back | Action::ClickXy { .. } => true,
            _ => false,
        };
        if !matches!(
            action,
            Action::Wait { .. } | Action::Done { .. } | Action::SwitchTab { .. }
        ) {
            // A tab the page opened comes to the front; the driven tab goes back there (input
            // to a tab behind another waits seconds for a frame that is not drawn).
            let page = &self.page;
            with_timeout("act", self.cfg.timeout, async {
                page.bring_to_front().await.map_err(cdp("act"))?;
                Ok(())
            })
            .await?;
        }
        // The main frame's events tell whether the action navigated (`Back` goes through the
        // browser's history, whose events may come after the barrier: it is polled for the
        // page before, loaded again or restored from the back/forward cache, for up to 1.5 s).
        let mut navigation = match action {
            Action::Back => None,
            _ => match Navigation::watch(&self.page).await {
                Ok(n) => Some(n),
                Err(e) => {
                    tracing::debug!(error = %e, "navigation events not watched: a fixed wait after the action");
                    None
                }
            },
        };
        let began = self.downloads.began();
        let t0 = std::time::Instant::now();
        self.perform(action).await?;
        let performed = t0.elapsed();
        // Watched, the wait is for a navigation the action started; else a fixed one.
        let navigated = match &mut navigation {
            Some(n) => Some(n.started(self, may_navigate).await),
            None => None,
        };
        let limit = match navigated {
            Some(true) => Some(1500),
            Some(false) => None,
            None => Some(if may_navigate { 1500 } else { 60 }),
        };
        if let Some(ms) = limit {
            self.await_navigation(Duration::from_millis(ms), navigation.as_mut())
                .await;
        }
        let loaded = t0.elapsed();
        let asked = navigation.as_ref().is_some_and(Navigation::download_requested);
        self.await_downloads(asked.then_some(began)).await;
        self.settle().await;
        let r = self.check_location().await;
        tracing::debug!(action = %action.label(), ?navigated, ?performed, ?loaded, done = ?t0.elapsed(), "acted");
        r
    }

    /// The page's text and elements, and its viewport screenshot when `screenshot`.
    async fn observe_once(&mut self, screenshot: bool) -> Result<Observation> {
        let raw = self.eval_value("observe", OBSERVE_JS).await?;
        let raw: RawObservation = serde_json::from_str(raw.as_str().unwrap_or("null")).map_err(|e| Error::Invalid {
            op: "observe",
            detail: format!("page script returned malformed JSON: {e}"),
        })?;
        let page = &self.page;
        let png = if screenshot {
            with_timeout("screenshot", self.cfg.timeout, async {
                page.screenshot(ScreenshotParams::builder().format(CaptureScreenshotFormat::Png).build())
                    .await
                    .map_err(cdp("screenshot"))
            })
            .await?
        } else {
            Vec::new()
        };
        let obs = Observation {
            url: raw.url,
            title: raw.title,
            text: raw.text,
            elements: raw.elements,
            screenshot_png: png,
        };
        self.last = Some(obs.clone());
        Ok(obs)
    }
}

impl Drop for ChromiumBrowser {
    fn drop(&mut self) {
        self.handler.abort();
    }
}
