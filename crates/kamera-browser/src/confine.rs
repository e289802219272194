//! Navigation confinement at the browser: every request the page makes (documents, frames,
//! redirects, forms, scripts, images, fetches) pauses in the DevTools Fetch domain and goes on
//! only when its URL is on an allowed origin; the rest fail as blocked, counted and logged.

use std::sync::{Arc, Mutex};

use chromiumoxide::Page;
use chromiumoxide::cdp::browser_protocol::fetch::{
    ContinueRequestParams, EnableParams, EventRequestPaused, FailRequestParams, RequestPattern, RequestStage,
};
use chromiumoxide::cdp::browser_protocol::network::ErrorReason;
use futures::StreamExt;

use crate::error::{Result, cdp};
use crate::origin::Origins;

/// One request refused at the browser.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Blocked {
    pub url: String,
    /// The resource type Chromium gave it (`Document`, `Image`, `Fetch`, ...).
    pub resource: String,
    /// Why the origin policy refused it.
    pub reason: String,
}

/// Intercepts a page's requests until dropped.
pub(crate) struct Confinement {
    blocked: Arc<Mutex<Vec<Blocked>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Confinement {
    /// Enables request interception on `page` for every URL, before anything is loaded.
    pub(crate) async fn start(page: &Page, origins: Origins) -> Result<Confinement> {
        let mut paused = page
            .event_listener::<EventRequestPaused>()
            .await
            .map_err(cdp("confine"))?;
        let pattern = RequestPattern::builder()
            .url_pattern("*")
            .request_stage(RequestStage::Request)
            .build();
        page.execute(EnableParams::builder().pattern(pattern).build())
            .await
            .map_err(cdp("confine"))?;
        let blocked = Arc::new(Mutex::new(Vec::new()));
        let log = blocked.clone();
        let page = page.clone();
        let task = tokio::spawn(async move {
            while let Some(ev) = paused.next().await {
                let url = ev.request.url.clone();
                let sent = match origins.check(&url) {
                    Ok(()) => page
                        .execute(ContinueRequestParams::new(ev.request_id.clone()))
                        .await
                        .map(|_| ()),
                    Err(e) => {
                        let resource = format!("{:?}", ev.resource_type);
                        tracing::warn!(%url, %resource, "blocked a request off the allowed origins");
                        if let Ok(mut v) = log.lock() {
                            v.push(Blocked {
                                url,
                                resource,
                                reason: e.to_string(),
                            });
                        }
                        page.execute(FailRequestParams::new(
                            ev.request_id.clone(),
                            ErrorReason::BlockedByClient,
                        ))
                        .await
                        .map(|_| ())
                    }
                };
                if let Err(e) = sent {
                    tracing::debug!(error = %e, "request interception: the page is gone");
                }
            }
        });
        Ok(Confinement { blocked, task })
    }

    /// The requests blocked so far.
    pub(crate) fn blocked(&self) -> Vec<Blocked> {
        self.blocked.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for Confinement {
    fn drop(&mut self) {
        self.task.abort();
    }
}
