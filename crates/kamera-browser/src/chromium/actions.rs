//! The actions of [`ChromiumBrowser`]: real input events (mouse, keys, text) at elements found
//! by the last observation's ids; a missing, hidden or unsuitable target is a clear error.

use std::time::{Duration, Instant};

use chromiumoxide::cdp::browser_protocol::dom::SetFileInputFilesParams;
use chromiumoxide::cdp::browser_protocol::input::{
    DispatchMouseEventParams, DispatchMouseEventType, InsertTextParams, MouseButton,
};
use chromiumoxide::cdp::js_protocol::runtime::{EvaluateParams, RemoteObjectSubtype};
use chromiumoxide::layout::Point;
use serde::Deserialize;

use chromiumoxide::Page;

use super::{ChromiumBrowser, with_timeout};
use crate::dialogs::Dialogs;
use crate::error::{Error, Result, cdp};
use crate::types::Action;

const ACT_JS: &str = include_str!("act.js");

/// Records elements that get click-like listeners (`addEventListener`), so observations can list
/// them; installed on every new document before the page's own scripts.
pub(super) const HOOK_JS: &str = "(() => { if (window.__kameraClickable) return; \
  const seen = new WeakSet(); window.__kameraClickable = seen; \
  const kinds = new Set(['click', 'mousedown', 'mouseup', 'pointerdown', 'pointerup', 'dblclick']); \
  const add = EventTarget.prototype.addEventListener; \
  EventTarget.prototype.addEventListener = function (type, ...rest) { \
    if (kinds.has(type) && this instanceof Element) seen.add(this); \
    return add.call(this, type, ...rest); }; })()";

/// What act.js says about an element.
#[derive(Debug, Default, Deserialize)]
struct Found {
    #[serde(default)]
    err: Option<String>,
    #[serde(default)]
    detail: Option<String>,
    #[serde(default)]
    x: Option<f64>,
    #[serde(default)]
    y: Option<f64>,
    #[serde(default)]
    href: Option<String>,
    #[serde(default)]
    checked: Option<bool>,
    /// `type`: whether the page script typed the text itself (else the protocol types it).
    #[serde(default)]
    inserted: Option<bool>,
}

impl ChromiumBrowser {
    /// Runs act.js's `op` on element `id` of the last observation.
    async fn find(&self, op: &'static str, id: u32, arg: serde_json::Value) -> Result<Found> {
        self.element(op, id)?;
        let js = format!("({ACT_JS})({:?}, {id}, {arg})", op_name(op));
        let v = self.eval_value(op, &js).await?;
        let f: Found = serde_json::from_value(v).map_err(|e| Error::Invalid {
            op,
            detail: format!("page script returned malformed JSON: {e}"),
        })?;
        match f.err.as_deref() {
            None => Ok(f),
            Some("gone") => Err(Error::NoElement { op, id }),
            Some(_) => Err(Error::Target {
                op,
                detail: f
                    .detail
                    .unwrap_or_else(|| format!("element [{id}] cannot take this action")),
            }),
        }
    }

    /// The centre of element `id`, scrolled into view (a hidden element is an error).
    async fn point(&self, op: &'static str, id: u32) -> Result<(Point, Option<String>)> {
        let f = self.find(op, id, serde_json::Value::Null).await?;
        match (f.x, f.y) {
            (Some(x), Some(y)) => Ok((Point::new(x, y), f.href)),
            _ => Err(Error::Invalid {
                op,
                detail: format!("no position for element [{id}]"),
            }),
        }
    }

    async fn mouse(&self, op: &'static str, kind: DispatchMouseEventType, at: Point, pressed: bool) -> Result<()> {
        let moved = kind == DispatchMouseEventType::MouseMoved;
        let params = DispatchMouseEventParams::builder()
            .r#type(kind)
            .x(at.x)
            .y(at.y)
            .button(if pressed || !moved {
                MouseButton::Left
            } else {
                MouseButton::None
            })
            .buttons(if pressed { 1 } else { 0 })
            .click_count(if moved { 0 } else { 1 })
            .build()
            .map_err(|detail| Error::Invalid { op, detail })?;
        let page = &self.page;
        with_timeout(op, self.cfg.timeout, async {
            page.execute(params).await.map_err(cdp(op))?;
            Ok(())
        })
        .await
    }

    async fn click_at(&self, op: &'static str, at: Point) -> Result<()> {
        let page = &self.page;
        with_timeout(op, self.cfg.timeout, async {
            page.click(at).await.map_err(cdp(op))?;
            Ok(())
        })
        .await
    }

    /// Carries out `action` (everything but the navigation bookkeeping around it).
    pub(super) async fn perform(&mut self, action: &Action) -> Result<()> {
        match action {
            Action::ClickXy { x, y } => self.click_at("click", Point::new(*x, *y)).await?,
            Action::Click { id } => {
                let (at, href) = self.point("click", *id).await?;
                // A link off the allowed origins is refused before anything is clicked.
                if let Some(href) = href.filter(|h| !h.starts_with("javascript:")) {
                    self.cfg.origins.check(&href)?;
                }
                self.click_at("click", at).await?;
            }
            Action::Type { id, text } => {
                if let Some(id) = id {
                    // Focused, checked to keep the focus, and typed in one page script.
                    let f = self.find("type", *id, serde_json::Value::String(text.clone())).await?;
                    if f.inserted == Some(true) {
                        return Ok(());
                    }
                }
                let page = &self.page;
                with_timeout("type", self.cfg.timeout, async {
                    page.execute(InsertTextParams::new(text.clone()))
                        .await
                        .map_err(cdp("type"))?;
                    Ok(())
                })
                .await?;
            }
            Action::Select { id, option } => {
                self.find("select", *id, serde_json::Value::String(option.clone()))
                    .await?;
            }
            Action::Check { id } => self.set_checked(*id, true).await?,
            Action::Uncheck { id } => self.set_checked(*id, false).await?,
            Action::Hover { id } => {
                let (at, _) = self.point("hover", *id).await?;
                self.mouse("hover", DispatchMouseEventType::MouseMoved, at, false)
                    .await?;
            }
            Action::Drag { from, to } => self.drag(*from, *to).await?,
            Action::ScrollTo { id } => {
                self.point("scroll_to", *id).await?;
            }
            Action::Scroll { dy } => {
                self.eval_value("scroll", &format!("window.scrollBy(0, {dy})")).await?;
            }
            Action::Key { key } => self.key(key).await?,
            Action::SwitchTab { index } => self.switch_tab(*index).await?,
            Action::WaitFor { target, ms } => self.wait_for(target, *ms).await?,
            Action::Upload { id, path } => self.upload(*id, path).await?,
            Action::Navigate { url } => self.goto(url).await?,
            Action::Back => {
                self.eval_value("back", "history.back()").await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Action::Wait { ms } => tokio::time::sleep(Duration::from_millis(*ms)).await,
            Action::Done { .. } => {}
        }
        Ok(())
    }

    /// Clicks a checkbox, radio or switch (or its label) when its state is not `on` yet, and
    /// checks that the click changed it.
    async fn set_checked(&self, id: u32, on: bool) -> Result<()> {
        let op = if on { "check" } else { "uncheck" };
        let f = self.find(op, id, serde_json::Value::Bool(on)).await?;
        if f.checked == Some(on) {
            return Ok(());
        }
        let (Some(x), Some(y)) = (f.x, f.y) else {
            return Err(Error::Invalid {
                op,
                detail: format!("no position for element [{id}]"),
            });
        };
        self.click_at(op, Point::new(x, y)).await?;
        let after = self.find(op, id, serde_json::Value::Bool(on)).await?;
        if after.checked != Some(on) {
            return Err(Error::Target {
                op,
                detail: format!("clicking element [{id}] did not {op} it"),
            });
        }
        Ok(())
    }

    /// Sets the files of the file input `id` is (or that a label or container `id` holds) to the
    /// file at `path` (`DOM.setFileInputFiles`): the page gets `input` and `change` as from a
    /// user's choice. A missing file or a target that is no file input is an error naming it.
    async fn upload(&self, id: u32, path: &std::path::Path) -> Result<()> {
        let op = "upload";
        let file = |detail: String| Error::File {
            op,
            path: path.to_path_buf(),
            detail,
        };
        let abs = std::fs::canonicalize(path).map_err(|e| file(format!("no such file: {e}")))?;
        if !abs.is_file() {
            return Err(file("not a regular file".into()));
        }
        let el = self.element(op, id)?;
        let js = format!("({UPLOAD_JS})({id})");
        let page = &self.page;
        let found = with_timeout(op, self.cfg.timeout, async {
            let params = EvaluateParams::builder()
                .expression(js)
                .return_by_value(false)
                .build()
                .map_err(|detail| Error::Invalid { op, detail })?;
            let r = page.execute(params).await.map_err(cdp(op))?.result;
            if let Some(x) = r.exception_details {
                return Err(Error::Invalid {
                    op,
                    detail: format!("page script threw: {}", x.text),
                });
            }
            Ok(r.result)
        })
        .await?;
        let object_id = match (found.subtype, found.object_id) {
            (Some(RemoteObjectSubtype::Node), Some(object_id)) => object_id,
            _ => {
                let why = found.value.as_ref().and_then(|v| v.as_str()).unwrap_or("").to_string();
                if why == "gone" {
                    return Err(Error::NoElement { op, id });
                }
                return Err(Error::Target {
                    op,
                    detail: format!(
                        "element [{id}] ({} {:?}) is not a file input and holds none{}",
                        el.tag,
                        el.text.trim(),
                        if why.is_empty() {
                            String::new()
                        } else {
                            format!(" ({why})")
                        }
                    ),
                });
            }
        };
        let params = SetFileInputFilesParams::builder()
            .file(abs.display().to_string())
            .object_id(object_id)
            .build()
            .map_err(|detail| Error::Invalid { op, detail })?;
        with_timeout(op, self.cfg.timeout, async {
            page.execute(params).await.map_err(cdp(op))?;
            Ok(())
        })
        .await
    }

    /// Presses the mouse on `from`, moves it in steps to `to` and releases it there (what
    /// jQuery UI's draggables and sortables, and most drag handlers, listen to).
    async fn drag(&self, from: u32, to: u32) -> Result<()> {
        let (a, _) = self.point("drag", from).await?;
        self.mouse("drag", DispatchMouseEventType::MouseMoved, a, false).await?;
        self.mouse("drag", DispatchMouseEventType::MousePressed, a, true)
            .await?;
        // The target's position after the press (pressing may scroll or lift the source).
        let (b, _) = self.point("drag", to).await?;
        const STEPS: usize = 8;
        for i in 1..=STEPS {
            let t = i as f64 / STEPS as f64;
            let p = Point::new(a.x + (b.x - a.x) * t, a.y + (b.y - a.y) * t);
            self.mouse("drag", DispatchMouseEventType::MouseMoved, p, true).await?;
            tokio::time::sleep(Duration::from_millis(16)).await;
        }
        self.mouse("drag", DispatchMouseEventType::MouseReleased, b, false)
            .await
    }

    /// Waits until a visible element matches `target` (`#html-id`, `[id]`, or `text:` / plain
    /// visible text), polling, for at most `ms`.
    async fn wait_for(&self, target: &str, ms: u64) -> Result<()> {
        let js = format!("({FIND_JS})({})", serde_json::Value::String(target.to_string()));
        let t0 = Instant::now();
        loop {
            if self.eval_value("wait_for", &js).await? == serde_json::Value::Bool(true) {
                return Ok(());
            }
            if t0.elapsed() >= Duration::from_millis(ms) {
                return Err(Error::Target {
                    op: "wait_for",
                    detail: format!("no visible element matches {target:?} after {ms} ms"),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Makes tab `index` (in order of opening) the page later calls drive.
    async fn switch_tab(&mut self, index: usize) -> Result<()> {
        // A tab the last action opened may not be listed yet: look again for a while (an action
        // no longer waits a fixed time after a click).
        let t0 = Instant::now();
        let pages = loop {
            let pages = self.tab_pages().await?;
            if index < self.tabs.len() || t0.elapsed() >= Duration::from_millis(1500) {
                break pages;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        let Some(target) = self.tabs.get(index) else {
            return Err(Error::Target {
                op: "switch_tab",
                detail: format!("no tab {index}: {} open (tabs count from 0)", self.tabs.len()),
            });
        };
        let page = pages
            .into_iter()
            .find(|p| p.target_id() == target)
            .ok_or(Error::Target {
                op: "switch_tab",
                detail: format!("tab {index} closed"),
            })?;
        with_timeout("switch_tab", self.cfg.timeout, async {
            page.bring_to_front().await.map_err(cdp("switch_tab"))?;
            Ok(())
        })
        .await?;
        if !self.set_up.contains(page.target_id()) {
            self.set_up_tab(&page).await?;
        }
        self.page = page;
        self.last = None;
        Ok(())
    }

    /// The browser's pages, with the tabs in order of first sight brought up to date.
    async fn tab_pages(&mut self) -> Result<Vec<Page>> {
        let browser = &self.browser;
        let pages = with_timeout("switch_tab", self.cfg.timeout, async {
            browser.pages().await.map_err(cdp("switch_tab"))
        })
        .await?;
        for p in &pages {
            if self.tabs.contains(p.target_id()) {
                continue;
            }
            // Chromium's own pages (a new-tab page's helpers, devtools) are not tabs the user opened.
            let url = with_timeout("switch_tab", self.cfg.timeout, async {
                p.url().await.map_err(cdp("switch_tab"))
            })
            .await?
            .unwrap_or_default();
            if !url.starts_with("chrome") && !url.starts_with("devtools:") {
                self.tabs.push(p.target_id().clone());
            }
        }
        self.tabs.retain(|t| pages.iter().any(|p| p.target_id() == t));
        Ok(pages)
    }
}

/// Whether a visible element matches `target`, in the document, its open shadow roots and its
/// same-origin frames.
impl ChromiumBrowser {
    /// Sets a tab the page opened up as the launch tab is: its dialogs answered, the click hook
    /// and the policy's reports in every document (the one there now included).
    async fn set_up_tab(&mut self, page: &Page) -> Result<()> {
        self.dialogs.push(Dialogs::start(page).await?);
        self.confinement.watch(page).await?;
        with_timeout("switch_tab", self.cfg.timeout, async {
            page.evaluate_on_new_document(HOOK_JS)
                .await
                .map_err(cdp("switch_tab"))?;
            for js in [crate::dialogs::HOOK_JS, HOOK_JS] {
                page.evaluate(js).await.map_err(cdp("switch_tab"))?;
            }
            Ok(())
        })
        .await?;
        self.set_up.push(page.target_id().clone());
        Ok(())
    }
}

/// The file input that element `kid` is, or that it labels or holds; else a string saying why
/// not (`gone`: no such element any more).
const UPLOAD_JS: &str = "(kid) => { \
  const find = (root) => { const hit = root.querySelector(`[data-kid=\"${kid}\"]`); if (hit) return hit; \
    for (const e of root.querySelectorAll('*')) { let inner = null; \
      if (e.shadowRoot) inner = find(e.shadowRoot); \
      if (!inner && (e.tagName === 'IFRAME' || e.tagName === 'FRAME')) { let d = null; try { d = e.contentDocument; } catch (_) {} \
        if (d) inner = find(d); } \
      if (inner) return inner; } \
    return null; }; \
  const el = find(document); \
  if (!el) return 'gone'; \
  const isFile = (e) => !!e && e.tagName === 'INPUT' && e.type === 'file'; \
  if (isFile(el)) return el.disabled ? 'it is disabled' : el; \
  if (el.tagName === 'LABEL' && isFile(el.control)) return el.control; \
  const inner = el.querySelector('input[type=file]'); \
  if (inner) return inner; \
  const lab = el.closest('label'); \
  return lab && isFile(lab.control) ? lab.control : ''; }";

const FIND_JS: &str = "(target) => { \
  const roots = []; \
  const collect = (r) => { roots.push(r); for (const e of r.querySelectorAll('*')) { \
    if (e.shadowRoot) collect(e.shadowRoot); \
    if (e.tagName === 'IFRAME' || e.tagName === 'FRAME') { let d = null; try { d = e.contentDocument; } catch (_) {} \
      if (d && d.body) collect(d); } } }; \
  collect(document); \
  const visible = (e) => { if (!e) return false; const st = e.ownerDocument.defaultView.getComputedStyle(e); \
    if (st.display === 'none' || st.visibility === 'hidden' || Number(st.opacity) === 0) return false; \
    const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; }; \
  const t = target.trim(); \
  if (t.startsWith('#')) return roots.some((r) => visible(r.getElementById(t.slice(1)))); \
  const m = /^\\[(\\d+)\\]$/.exec(t); \
  if (m) return roots.some((r) => visible(r.querySelector(`[data-kid=\"${m[1]}\"]`))); \
  const want = (t.startsWith('text:') ? t.slice(5) : t).trim().toLowerCase(); \
  return want.length > 0 && roots.some((r) => { const b = r.body !== undefined ? r.body : r; \
    return !!b && (b.innerText !== undefined ? b.innerText : b.textContent).toLowerCase().includes(want); }); }";

/// act.js's name for an operation.
fn op_name(op: &'static str) -> &'static str {
    match op {
        "click" | "hover" | "drag" | "scroll_to" => "point",
        "type" => "focus",
        "check" | "uncheck" => "checkable",
        other => other,
    }
}
