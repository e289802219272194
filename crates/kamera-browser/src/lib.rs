//! kamera-browser: what the Kamera agent drives. A small async [`Browser`] trait, the real
//! [`ChromiumBrowser`] (Debian's chromium, headless, over the DevTools protocol via
//! chromiumoxide), a browser-free [`ReplayBrowser`] for recorded traces, the allowed-origins check
//! every navigation passes ([`Origins`]), and a loopback static [`Server`] for local test sites.
//!
//! An observation is a PNG screenshot plus compact page text in which every interactive element
//! carries an id (`[3] button "Track"`), the URL and the title; same-origin frames and open
//! shadow roots are part of the page.
//!
//! Every request of every tab is checked at the browser (the tabs the page opens included). A
//! browser keeps its state in a profile folder or a Playwright storageState file, or runs
//! elsewhere and is attached to ([`BrowserOptions`]).
//!
//! Faults are typed: a call past its limit is [`Error::Timeout`], a browser process that died
//! under a call is [`Error::Crashed`] (at once, not after a timeout); a page's dialogs are
//! answered as they open; closing or dropping a [`ChromiumBrowser`] leaves no process and no
//! profile behind.
//!
//! ```
//! use kamera_browser::{Browser, ReplayBrowser, Observation, Action};
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let page = Observation { url: "http://127.0.0.1:1/".into(), title: "t".into(),
//!     text: "[1] button \"Go\"".into(), elements: vec![], screenshot_png: vec![] };
//! let mut b = ReplayBrowser::new(vec![page.clone()]);
//! assert_eq!(b.observe().await.unwrap(), page);
//! b.act(&Action::Click { id: 1 }).await.unwrap();
//! assert!(b.observe().await.is_err()); // nothing more recorded
//! # });
//! ```

mod chromium;
mod confine;
mod dialogs;
mod downloads;
mod error;
mod origin;
mod procs;
mod raw;
mod replay;
mod serve;
mod storage;
mod types;
mod upload;

use async_trait::async_trait;

pub use chromium::{BrowserOptions, ChromiumBrowser, ChromiumConfig};
pub use confine::Blocked;
pub use downloads::Download;
pub use error::{Error, Result};
pub use origin::Origins;
pub use procs::processes_of;
pub use replay::ReplayBrowser;
pub use serve::{Content, Server};
pub use storage::{NameValue, OriginStorage, StorageState, StoredCookie};
pub use types::{Action, Element, Observation};
pub use upload::{MAX_BODY, Upload};

/// A browser the agent loop can drive. Implementations check navigations against their allowed
/// origins and bound every call with a timeout, so a hung page becomes an error, never a hang.
#[async_trait]
pub trait Browser: Send {
    /// Loads `url` (refused with [`Error::Refused`] off the allowed origins).
    async fn navigate(&mut self, url: &str) -> Result<()>;
    /// Performs one action; element ids refer to the last observation.
    async fn act(&mut self, action: &Action) -> Result<()>;
    /// Screenshot + page text of the current page.
    async fn observe(&mut self) -> Result<Observation>;
    /// The page's text and elements without the screenshot (`screenshot_png` empty), for a
    /// caller that reads text only: in Chromium the capture is most of an observation's time.
    /// By default the whole [`Browser::observe`].
    async fn observe_text(&mut self) -> Result<Observation> {
        self.observe().await
    }
    /// Evaluates a JavaScript expression on the page and returns its JSON value.
    async fn eval(&mut self, js: &str) -> Result<serde_json::Value>;
    /// Shuts the browser down.
    async fn close(&mut self) -> Result<()>;
    /// Requests the page made off the allowed origins, refused at the browser, in order (none
    /// for a browser that does not confine them).
    fn blocked(&self) -> Vec<Blocked> {
        Vec::new()
    }
    /// The downloads completed so far, saved in the run's downloads folder, in order (none for a
    /// browser without one: downloads are refused).
    fn downloads(&self) -> Vec<Download> {
        Vec::new()
    }
    /// Whether this browser replays a recording (no page behind it).
    fn is_replay(&self) -> bool {
        false
    }
}
