//! The walk of `kamera bench session`: the pages an agent working a few orders visits on the local
//! site, observed once up front on real Chromium, and how a method's answer is read from logits.

use anyhow::Result;
use kamera_agent::Llm;
use kamera_browser::{Browser, ChromiumBrowser, ChromiumConfig, Content, Origins, Server};
use serde::Serialize;

/// One step of the walk: a page, and a question asked on it.
#[derive(Debug, Clone, Serialize)]
pub struct WalkStep {
    pub path: String,
    pub question: Option<String>,
    pub answer: Option<String>,
}

/// A walk over the site as an agent that works a few orders: first it opens each order's pages
/// (the list, the order, its shipment), then it goes back and forth over them (order, shipment,
/// the list, the next order) answering a status question on each pass, with a detour to the
/// catalogue now and then. The window holds about half of the working set, so revisits evict,
/// relocate and recall pages instead of hitting them.
pub fn walk(seed: u64, n: usize, orders: usize) -> Vec<WalkStep> {
    let data = kamera_site::data(seed);
    let orders = &data.orders[..orders.clamp(1, data.orders.len())];
    let visit = |p: &str| WalkStep {
        path: p.to_string(),
        question: None,
        answer: None,
    };
    let ask = |p: &str, order: &kamera_site::Order| WalkStep {
        path: p.to_string(),
        question: Some(format!("What is the shipping status of order {}?", order.id)),
        answer: Some(order.status.clone()),
    };
    let mut out = vec![visit("/"), visit("/orders")];
    for o in orders {
        out.push(visit(&format!("/orders/{}", o.id)));
        out.push(visit(&format!("/shipping/{}", o.tracking)));
    }
    let mut pass = 0;
    while out.len() < n {
        for (i, o) in orders.iter().enumerate() {
            out.push(visit("/orders"));
            out.push(visit(&format!("/orders/{}", o.id)));
            out.push(visit(&format!("/shipping/{}", o.tracking)));
            if (pass + i) % 2 == 0 {
                out.push(ask(&format!("/orders/{}", o.id), o));
            }
        }
        if pass % 2 == 1 {
            out.push(visit("/catalogue"));
        }
        pass += 1;
    }
    out.truncate(n);
    out
}

/// A page as observed: its chunk text and its viewport screenshot (PNG).
pub struct Page {
    pub text: String,
    pub png: Vec<u8>,
}

/// Observes every page of the walk once on real Chromium at a `viewport` of [width, height].
pub async fn observe_pages(seed: u64, walk: &[WalkStep], viewport: [u32; 2]) -> Result<Vec<Page>> {
    let server = Server::start(Content::Memory(kamera_site::generate(seed))).await?;
    let origin = server.origin();
    let mut cfg = ChromiumConfig::new(Origins::new(std::slice::from_ref(&origin))?);
    [cfg.width, cfg.height] = viewport;
    let mut browser = ChromiumBrowser::launch(cfg).await?;
    let mut out = Vec::new();
    for w in walk {
        browser.navigate(&server.url(&w.path)).await?;
        let obs = browser.observe().await?;
        out.push(Page {
            text: kamera_agent::chunk_text(&obs, &origin),
            png: obs.screenshot_png,
        });
    }
    browser.close().await?;
    Ok(out)
}

pub fn answer_of(llm: &Llm, logits: &[f32], choices: &[String]) -> Result<String> {
    // The choice whose first token the model finds most likely.
    let mut best = (f32::NEG_INFINITY, String::new());
    for c in choices {
        let t = llm.tokens(c, false)?;
        if let Some(&first) = t.first()
            && logits[first as usize] > best.0
        {
            best = (logits[first as usize], c.clone());
        }
    }
    Ok(best.1)
}
