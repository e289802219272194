//! Navigation confinement at the browser: every request of every tab (the launch page, tabs the
//! page opens by a click or a script, their frames and workers) pauses in the DevTools Fetch
//! domain, enabled on the browser target over a connection of its own, and goes on only when its
//! URL is on an allowed origin; the rest fail as blocked, counted and logged. A tab the page opens
//! is intercepted from its first request, since interception is browser-wide, not per tab.
//!
//! WebSocket handshakes never pass through the Fetch domain: every document response is served
//! with a `Content-Security-Policy: connect-src` of the allowed origins added, so Chromium refuses
//! a connection anywhere else, from the page, its frames and its workers (CSP only adds
//! restrictions to the page's own). The policy refuses fetch, XHR, beacons and EventSource too,
//! in the page, before a request exists: each document of a watched tab reports those refusals
//! through a binding and they are counted with the rest (a worker's are refused, not counted).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine;
use chromiumoxide::Page;
use chromiumoxide::cdp::browser_protocol::fetch::{
    ContinueRequestParams, ContinueResponseParams, EnableParams, EventRequestPaused, FailRequestParams,
    FulfillRequestParams, GetResponseBodyParams, GetResponseBodyReturns, HeaderEntry, RequestPattern, RequestStage,
};
use chromiumoxide::cdp::browser_protocol::network::{ErrorReason, ResourceType};
use chromiumoxide::cdp::js_protocol::runtime::{AddBindingParams, EventBindingCalled};
use chromiumoxide::conn::Connection;
use chromiumoxide::types::{CallId, CdpJsonEventMessage, Command, Message};
use futures::StreamExt;

use crate::error::{Error, Result, cdp};
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

type Log = Arc<Mutex<Vec<Blocked>>>;

/// URLs answered by the confinement itself with an empty page, never sent.
type Stubs = Arc<Mutex<Vec<String>>>;

/// Intercepts every tab's requests until dropped.
pub(crate) struct Confinement {
    blocked: Log,
    stubs: Stubs,
    task: tokio::task::JoinHandle<()>,
    reports: Vec<tokio::task::JoinHandle<()>>,
}

/// A DevTools connection of the confinement's own, to the browser target.
struct Conn {
    conn: Connection<CdpJsonEventMessage>,
}

impl Conn {
    fn send<C: Command>(&mut self, cmd: C) -> Option<CallId> {
        let params = serde_json::to_value(&cmd).ok()?;
        self.conn.submit_command(cmd.identifier(), None, params).ok()
    }
}

impl Confinement {
    /// Enables request interception for every URL of every tab on the browser at `ws` (its
    /// DevTools WebSocket), answered before anything is loaded.
    pub(crate) async fn start(ws: &str, origins: Origins) -> Result<Confinement> {
        let conn = Connection::<CdpJsonEventMessage>::connect(ws)
            .await
            .map_err(cdp("confine"))?;
        let mut conn = Conn { conn };
        let pattern = RequestPattern::builder()
            .url_pattern("*")
            .request_stage(RequestStage::Request)
            .build();
        let responses = [RequestPattern::builder()
            .url_pattern("*")
            .resource_type(ResourceType::Document)
            .request_stage(RequestStage::Response)
            .build()];
        crate::raw::call(
            &mut conn.conn,
            EnableParams::builder().pattern(pattern).patterns(responses).build(),
        )
        .await
        .map_err(refused_to_start)?;
        let blocked: Log = Arc::new(Mutex::new(Vec::new()));
        let stubs: Stubs = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(intercept(conn, origins, blocked.clone(), stubs.clone()));
        Ok(Confinement {
            blocked,
            stubs,
            task,
            reports: Vec::new(),
        })
    }

    /// Counts what the connect-src policy refuses in `page`'s documents from now on.
    pub(crate) async fn watch(&mut self, page: &Page) -> Result<()> {
        let mut refused = page
            .event_listener::<EventBindingCalled>()
            .await
            .map_err(cdp("confine"))?;
        page.execute(AddBindingParams::new(BINDING))
            .await
            .map_err(cdp("confine"))?;
        page.evaluate_on_new_document(REPORT_JS).await.map_err(cdp("confine"))?;
        // The document already there reports too.
        let _ = page.evaluate(REPORT_JS).await;
        let log = self.blocked.clone();
        self.reports.push(tokio::spawn(async move {
            while let Some(ev) = refused.next().await {
                if ev.name != BINDING {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(&ev.payload).unwrap_or_default();
                let url = v["url"].as_str().unwrap_or("").to_string();
                let directive = v["directive"].as_str().unwrap_or("").to_string();
                tracing::warn!(%url, %directive, "the page's policy refused a connection off the allowed origins");
                if let Ok(mut b) = log.lock() {
                    b.push(Blocked {
                        url,
                        resource: format!("Policy({directive})"),
                        reason: "refused in the page by the connect-src policy of the allowed origins".into(),
                    });
                }
            }
        }));
        Ok(())
    }

    /// Answers `url` (on an allowed origin) with an empty page, without sending it, until
    /// [`Confinement::unstub`]: a document of that origin where its storage can be reached.
    pub(crate) fn stub(&self, url: &str) {
        if let Ok(mut s) = self.stubs.lock() {
            s.push(url.to_string());
        }
    }

    pub(crate) fn unstub(&self, url: &str) {
        if let Ok(mut s) = self.stubs.lock() {
            s.retain(|u| u != url);
        }
    }

    /// The requests blocked so far.
    pub(crate) fn blocked(&self) -> Vec<Blocked> {
        self.blocked.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

fn refused_to_start(detail: String) -> Error {
    Error::Chromium {
        op: "confine",
        detail: format!("request interception on the browser target: {detail}"),
    }
}

impl Drop for Confinement {
    fn drop(&mut self) {
        self.task.abort();
        for r in &self.reports {
            r.abort();
        }
    }
}

/// The interception loop: decides each paused request; a document's response is fetched
/// (`GetResponseBody`, answered later on the same connection) and served again with the policy.
async fn intercept(mut conn: Conn, origins: Origins, log: Log, stubs: Stubs) {
    let csp = connect_policy(&origins);
    // Documents whose bodies were asked for, by the call that asked.
    let mut bodies: HashMap<CallId, EventRequestPaused> = HashMap::new();
    while let Some(msg) = conn.conn.next().await {
        match msg {
            Ok(Message::Event(ev)) if ev.method.as_ref() == "Fetch.requestPaused" => {
                let Ok(ev) = serde_json::from_value::<EventRequestPaused>(ev.params) else {
                    tracing::warn!("an unreadable Fetch.requestPaused event");
                    continue;
                };
                if matches!(ev.response_status_code, Some(300..=399)) {
                    // A redirect renders nothing: it goes on, and where it leads is checked as a request.
                    conn.send(ContinueResponseParams::new(ev.request_id.clone()));
                } else if ev.response_status_code.is_some() && ev.response_error_reason.is_none() {
                    // A document's response (its request was allowed): served again with the
                    // policy added (headers changed in place are not parsed again for CSP).
                    if let Some(id) = conn.send(GetResponseBodyParams::new(ev.request_id.clone())) {
                        bodies.insert(id, ev);
                    }
                } else if stubs.lock().is_ok_and(|s| s.contains(&ev.request.url)) {
                    let mut p = FulfillRequestParams::new(ev.request_id, 200);
                    p.response_headers = Some(vec![HeaderEntry::new("Content-Type", "text/html")]);
                    p.body = Some(base64::engine::general_purpose::STANDARD.encode("<html></html>").into());
                    conn.send(p);
                } else {
                    decide(&mut conn, &origins, &log, ev);
                }
            }
            Ok(Message::Response(r)) => {
                let Some(ev) = bodies.remove(&r.id) else { continue };
                let body = r
                    .result
                    .and_then(|v| serde_json::from_value::<GetResponseBodyReturns>(v).ok());
                match body {
                    Some(body) => {
                        conn.send(serve_with_policy(&ev, body, &csp));
                    }
                    None => {
                        // Fail closed: a document without the policy could open WebSockets anywhere.
                        tracing::warn!(url = %ev.request.url, error = ?r.error, "could not add the connect-src policy; refusing the response");
                        conn.send(FailRequestParams::new(ev.request_id, ErrorReason::BlockedByClient));
                    }
                }
            }
            Ok(Message::Event(_)) => {}
            Err(e) => tracing::trace!(error = %e, "confinement connection"),
        }
    }
    tracing::debug!("confinement: the browser closed the connection");
}

/// Lets a request on the allowed origins go on; fails (and logs) the rest.
fn decide(conn: &mut Conn, origins: &Origins, log: &Log, ev: EventRequestPaused) {
    let url = ev.request.url.clone();
    match origins.check(&url) {
        Ok(()) => {
            conn.send(ContinueRequestParams::new(ev.request_id));
        }
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
            conn.send(FailRequestParams::new(ev.request_id, ErrorReason::BlockedByClient));
        }
    }
}

/// The document response of `ev` with `body`, the connect-src policy added to its headers.
fn serve_with_policy(ev: &EventRequestPaused, body: GetResponseBodyReturns, csp: &str) -> FulfillRequestParams {
    let body = if body.base64_encoded {
        body.body
    } else {
        base64::engine::general_purpose::STANDARD.encode(body.body.as_bytes())
    };
    let mut headers = ev.response_headers.clone().unwrap_or_default();
    headers.push(HeaderEntry::new("Content-Security-Policy", csp.to_string()));
    let mut p = FulfillRequestParams::new(ev.request_id.clone(), ev.response_status_code.unwrap_or(200));
    p.response_phrase = ev.response_status_text.clone().filter(|t| !t.is_empty());
    p.response_headers = Some(headers);
    p.body = Some(body.into());
    p
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
