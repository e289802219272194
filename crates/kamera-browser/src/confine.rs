//! Navigation confinement at the browser: every request the page makes (documents, frames,
//! redirects, forms, scripts, images, fetches) pauses in the DevTools Fetch domain and goes on
//! only when its URL is on an allowed origin; the rest fail as blocked, counted and logged.
//! WebSocket handshakes never pass through the Fetch domain: every document response is served
//! with a `Content-Security-Policy: connect-src` of the allowed origins added, so Chromium refuses
//! a connection anywhere else, from the page, its frames and its workers (CSP only adds
//! restrictions to the page's own). The policy refuses fetch, XHR, beacons and EventSource too,
//! in the page, before a request exists: each document reports those refusals through a binding
//! and they are counted with the rest (a worker's are refused, not counted).

use std::sync::{Arc, Mutex};

use base64::Engine;
use chromiumoxide::Page;
use chromiumoxide::cdp::browser_protocol::fetch::{
    ContinueRequestParams, ContinueResponseParams, EnableParams, EventRequestPaused, FailRequestParams,
    FulfillRequestParams, GetResponseBodyParams, HeaderEntry, RequestPattern, RequestStage,
};
use chromiumoxide::cdp::browser_protocol::network::{ErrorReason, ResourceType};
use chromiumoxide::cdp::js_protocol::runtime::{AddBindingParams, EventBindingCalled};
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

/// The binding through which each document reports what its policy refused.
const BINDING: &str = "__kameraRefused";

/// Run before each document's scripts: the policy's refusals (fetch, XHR, beacon, EventSource,
/// WebSocket: refused in the page, before any request exists) are reported to be counted.
const REPORT_JS: &str = "(() => { if (window.__kameraReports) return; window.__kameraReports = 1; \
  document.addEventListener('securitypolicyviolation', (e) => { \
    try { window.__kameraRefused(JSON.stringify({ url: e.blockedURI, directive: e.effectiveDirective })); } \
    catch (_) {} }, true); })()";

/// Intercepts a page's requests until dropped.
pub(crate) struct Confinement {
    blocked: Arc<Mutex<Vec<Blocked>>>,
    task: tokio::task::JoinHandle<()>,
    reports: tokio::task::JoinHandle<()>,
}

impl Confinement {
    /// Enables request interception on `page` for every URL, before anything is loaded.
    // Long: one interception task decides every request kind.
    pub(crate) async fn start(page: &Page, origins: Origins) -> Result<Confinement> {
        let mut paused = page
            .event_listener::<EventRequestPaused>()
            .await
            .map_err(cdp("confine"))?;
        let pattern = RequestPattern::builder()
            .url_pattern("*")
            .request_stage(RequestStage::Request)
            .build();
        let responses = [RequestPattern::builder()
            .url_pattern("*")
            .resource_type(ResourceType::Document)
            .request_stage(RequestStage::Response)
            .build()];
        page.execute(EnableParams::builder().pattern(pattern).patterns(responses).build())
            .await
            .map_err(cdp("confine"))?;
        let csp = connect_policy(&origins);
        let mut refused = page
            .event_listener::<EventBindingCalled>()
            .await
            .map_err(cdp("confine"))?;
        page.execute(AddBindingParams::new(BINDING))
            .await
            .map_err(cdp("confine"))?;
        page.evaluate_on_new_document(REPORT_JS).await.map_err(cdp("confine"))?;
        let blocked = Arc::new(Mutex::new(Vec::new()));
        let log = blocked.clone();
        let log2 = blocked.clone();
        let reports = tokio::spawn(async move {
            while let Some(ev) = refused.next().await {
                if ev.name != BINDING {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(&ev.payload).unwrap_or_default();
                let url = v["url"].as_str().unwrap_or("").to_string();
                let directive = v["directive"].as_str().unwrap_or("").to_string();
                tracing::warn!(%url, %directive, "the page's policy refused a connection off the allowed origins");
                if let Ok(mut b) = log2.lock() {
                    b.push(Blocked {
                        url,
                        resource: format!("Policy({directive})"),
                        reason: "refused in the page by the connect-src policy of the allowed origins".into(),
                    });
                }
            }
        });
        let page = page.clone();
        let task = tokio::spawn(async move {
            while let Some(ev) = paused.next().await {
                let url = ev.request.url.clone();
                if matches!(ev.response_status_code, Some(300..=399)) {
                    // A redirect renders nothing: it goes on, and where it leads is checked as a request.
                    if let Err(e) = page.execute(ContinueResponseParams::new(ev.request_id.clone())).await {
                        tracing::debug!(error = %e, "response interception: the page is gone");
                    }
                    continue;
                }
                if let Some(code) = ev.response_status_code.filter(|_| ev.response_error_reason.is_none()) {
                    // A document's response (its request was allowed): served again with the
                    // policy added (headers changed in place are not parsed again for CSP).
                    let served = async {
                        let body = page
                            .execute(GetResponseBodyParams::new(ev.request_id.clone()))
                            .await?
                            .result;
                        let body = if body.base64_encoded {
                            body.body
                        } else {
                            base64::engine::general_purpose::STANDARD.encode(body.body.as_bytes())
                        };
                        let mut headers = ev.response_headers.clone().unwrap_or_default();
                        headers.push(HeaderEntry::new("Content-Security-Policy", csp.clone()));
                        let mut p = FulfillRequestParams::new(ev.request_id.clone(), code);
                        p.response_phrase = ev.response_status_text.clone().filter(|t| !t.is_empty());
                        p.response_headers = Some(headers);
                        p.body = Some(body.into());
                        page.execute(p).await.map(|_| ())
                    };
                    if let Err(e) = served.await {
                        // Fail closed: a document without the policy could open WebSockets anywhere.
                        tracing::warn!(%url, error = %e, "could not add the connect-src policy; refusing the response");
                        let _ = page
                            .execute(FailRequestParams::new(
                                ev.request_id.clone(),
                                ErrorReason::BlockedByClient,
                            ))
                            .await;
                    }
                    continue;
                }
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
        Ok(Confinement { blocked, task, reports })
    }

    /// The requests blocked so far.
    pub(crate) fn blocked(&self) -> Vec<Blocked> {
        self.blocked.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Drop for Confinement {
    fn drop(&mut self) {
        self.task.abort();
        self.reports.abort();
    }
}

/// `connect-src` of the allowed origins (each also as ws:/wss:), so that fetches, beacons,
/// EventSource and WebSockets cannot leave them.
fn connect_policy(origins: &Origins) -> String {
    let mut srcs = vec!["'self'".to_string()];
    for o in origins.list() {
        srcs.push(o.clone());
        if let Some(rest) = o.strip_prefix("http://") {
            srcs.push(format!("ws://{rest}"));
        } else if let Some(rest) = o.strip_prefix("https://") {
            srcs.push(format!("wss://{rest}"));
        }
    }
    format!("connect-src {}", srcs.join(" "))
}
