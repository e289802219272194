//! Whether an action navigated the page, told by the main frame's protocol events instead of a
//! fixed wait: the events are collected from before the action, and after it a page-script
//! barrier (two timer turns) lets the tasks the action queued run, a form's submission among
//! them. A navigation requested by then (`Page.frameRequestedNavigation` in this tab, a load
//! started, the marked document replaced) is waited for until the new document has loaded, woken
//! by its load event; none requested, the action is done at once. A navigation a page starts
//! later (a timer, a fetch's answer) is not waited for: a scenario's `wait_for` does that. As
//! Playwright waits for the navigations an action started and no others.

use std::time::Duration;

use chromiumoxide::Page;
use chromiumoxide::cdp::IntoEventKind;
use chromiumoxide::cdp::browser_protocol::page::{
    ClientNavigationDisposition, EventFrameRequestedNavigation, EventFrameStartedLoading, EventFrameStoppedLoading,
    EventLoadEventFired, EventNavigatedWithinDocument, FrameId,
};
use chromiumoxide::listeners::EventStream;
use futures::FutureExt;
use futures::stream::{BoxStream, StreamExt, select_all};

use super::ChromiumBrowser;
use crate::error::{Error, Result, cdp};

/// One main-frame event that bears on whether (and when) a navigation ends.
enum Signal {
    /// A navigation of this tab's document was requested or began loading.
    Requested,
    /// A download was requested (a link with `download`).
    Download,
    /// The page's load event (the main frame's document finished loading).
    Loaded,
    /// A navigation inside the document (a fragment, `history.pushState`): no new document.
    SameDocument,
    /// Some frame's event that is not the main frame's, or a navigation to another tab.
    Other,
}

/// The main frame's navigation events since [`Navigation::watch`].
pub(super) struct Navigation {
    events: BoxStream<'static, Signal>,
    requested: bool,
    same_document: bool,
    download: bool,
}

/// After the barrier, how long further events may take to arrive (a navigation request reaches
/// the browser on a channel of its own): the wait ends at the first event.
const GRACE: Duration = Duration::from_millis(10);
/// The same after an action that may navigate (a link, a button, Enter): a download's request
/// came later than 10 ms in 2 of 15 runs of tests/files.rs `a_download_lands_in_the_folder` on an
/// idle 2-core host, and the action then did not wait for the file (0 of 30 with 50 ms).
const GRACE_MAY_NAVIGATE: Duration = Duration::from_millis(50);

/// The barrier: two timer turns (tasks the action queued, such as a form's submission, run
/// first), then whether the document marked `mark` is still the page's.
fn barrier_js(mark: u64) -> String {
    format!("new Promise(r => setTimeout(() => setTimeout(() => r(window.__kameraDoc === {mark}), 0), 0))")
}

/// Marks the page's document with `mark` (a new one per action: [`new_document_js`]).
pub(super) fn mark_js(mark: u64) -> String {
    format!("window.__kameraDoc = {mark}")
}

impl Navigation {
    /// Starts collecting the main frame's navigation events; call before acting.
    pub(super) async fn watch(page: &Page) -> Result<Navigation> {
        let main = page.mainframe().await.map_err(cdp("navigation"))?;
        // `s` when the event is the main frame's, else nothing to note.
        let of_main = move |frame: &FrameId, s: Signal| {
            if main.as_ref().is_none_or(|m| m == frame) {
                s
            } else {
                Signal::Other
            }
        };
        let (m1, m2) = (of_main.clone(), of_main.clone());
        let events = select_all([
            listen::<EventFrameRequestedNavigation>(page)
                .await?
                .map(move |e| match e.disposition {
                    ClientNavigationDisposition::CurrentTab => m1(&e.frame_id, Signal::Requested),
                    ClientNavigationDisposition::Download => m1(&e.frame_id, Signal::Download),
                    _ => Signal::Other,
                })
                .boxed(),
            listen::<EventFrameStartedLoading>(page)
                .await?
                .map(move |e| m2(&e.frame_id, Signal::Requested))
                .boxed(),
            listen::<EventLoadEventFired>(page)
                .await?
                .map(|_| Signal::Loaded)
                .boxed(),
            // Loading stopped (a download, a 204): only a wake-up for the poll.
            listen::<EventFrameStoppedLoading>(page)
                .await?
                .map(|_| Signal::Other)
                .boxed(),
            listen::<EventNavigatedWithinDocument>(page)
                .await?
                .map(move |e| of_main(&e.frame_id, Signal::SameDocument))
                .boxed(),
        ]);
        Ok(Navigation {
            events: events.boxed(),
            requested: false,
            same_document: false,
            download: false,
        })
    }

    fn note(&mut self, s: &Signal) {
        match s {
            Signal::Requested => self.requested = true,
            Signal::SameDocument => self.same_document = true,
            Signal::Download => self.download = true,
            Signal::Loaded | Signal::Other => {}
        }
    }

    /// Waits at most `limit`, less when an event arrives, and takes the events that have.
    async fn pause(&mut self, limit: Duration) {
        match tokio::time::timeout(limit, self.events.next()).await {
            Ok(Some(s)) => self.note(&s),
            // No more events (the page is gone): the time passes as without one.
            Ok(None) => return tokio::time::sleep(limit).await,
            Err(_) => return,
        }
        while let Some(Some(s)) = self.events.next().now_or_never() {
            self.note(&s);
        }
    }

    /// After the action: whether it started a navigation to a new document of this tab.
    pub(super) async fn started(&mut self, browser: &ChromiumBrowser, may_navigate: bool) -> bool {
        let same_doc = match browser.eval_once("navigation", &barrier_js(browser.doc_mark)).await {
            Ok(serde_json::Value::Bool(same)) => same,
            // A page that does not answer: nothing to wait for here (the next call times out).
            Err(Error::Timeout { .. }) => return false,
            // The document went while the barrier ran (its context destroyed): a navigation.
            Ok(_) | Err(_) => false,
        };
        self.pause(if may_navigate { GRACE_MAY_NAVIGATE } else { GRACE }).await;
        !same_doc || (self.requested && !self.same_document)
    }

    /// Whether the action asked for a download (its start comes on the browser's connection).
    pub(super) fn download_requested(&self) -> bool {
        self.download
    }

    /// [`Navigation::pause`] where the events are watched, else a sleep of `limit`.
    pub(super) async fn pause_on(events: Option<&mut Navigation>, limit: Duration) {
        match events {
            Some(n) => n.pause(limit).await,
            None => tokio::time::sleep(limit).await,
        }
    }
}

/// "complete" once another document (a new one, or one restored from the back/forward cache
/// with an older mark) has replaced the one marked `mark` and finished loading.
pub(super) fn new_document_js(mark: u64) -> String {
    format!("window.__kameraDoc === {mark} ? 'same' : document.readyState")
}

/// A stream of the page's events of type `T`, from now on.
async fn listen<T: IntoEventKind + Unpin>(page: &Page) -> Result<EventStream<T>> {
    page.event_listener::<T>().await.map_err(cdp("navigation"))
}
