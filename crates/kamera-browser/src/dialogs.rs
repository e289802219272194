//! JavaScript dialogs (`alert`, `confirm`, `prompt`, `beforeunload`) stop a page, and every later
//! call to it, until someone answers them. Each document's `alert`/`confirm`/`prompt` return at
//! once as dismissed (counted in the page's `window.__kameraDialogs`); a dialog that still opens
//! (`beforeunload`, or a function taken from elsewhere) is answered over the protocol as it opens
//! (dismissed; a `beforeunload` accepted, so the navigation goes on) and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use chromiumoxide::Page;
use chromiumoxide::cdp::browser_protocol::page::{
    DialogType, EventJavascriptDialogOpening, HandleJavaScriptDialogParams,
};
use futures::StreamExt;

use crate::error::{Result, cdp};

/// Run before each document's own scripts: the blocking dialog functions answer at once.
pub(crate) const HOOK_JS: &str = "(() => { if (window.__kameraDialogs !== undefined) return; \
  window.__kameraDialogs = 0; \
  const answer = (v) => function () { window.__kameraDialogs++; return v; }; \
  window.alert = answer(undefined); window.confirm = answer(false); window.prompt = answer(null); })()";

/// Answers a page's dialogs until dropped.
pub(crate) struct Dialogs {
    count: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Dialogs {
    pub(crate) async fn start(page: &Page) -> Result<Dialogs> {
        let mut opening = page
            .event_listener::<EventJavascriptDialogOpening>()
            .await
            .map_err(cdp("dialogs"))?;
        page.evaluate_on_new_document(HOOK_JS).await.map_err(cdp("dialogs"))?;
        // A tab set up after it opened may be held by a dialog already: dismiss it (an error
        // when none is showing).
        let _ = page.execute(HandleJavaScriptDialogParams::new(false)).await;
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        let page = page.clone();
        let task = tokio::spawn(async move {
            while let Some(ev) = opening.next().await {
                let n = seen.fetch_add(1, Ordering::Relaxed) + 1;
                let accept = ev.r#type == DialogType::Beforeunload;
                if n <= 3 || n.is_power_of_two() {
                    tracing::info!(kind = ?ev.r#type, message = %ev.message, n, "answered a page's dialog");
                }
                if let Err(e) = page.execute(HandleJavaScriptDialogParams::new(accept)).await {
                    tracing::debug!(error = %e, "dialog: the page is gone");
                }
            }
        });
        Ok(Dialogs { count, task })
    }

    /// Dialogs answered over the protocol so far (those the page's hook answered are not here).
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

impl Drop for Dialogs {
    fn drop(&mut self) {
        self.task.abort();
    }
}
