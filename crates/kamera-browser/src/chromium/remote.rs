//! Attaching to a Chromium that runs elsewhere, over its DevTools endpoint (`ws://` or the
//! `http://HOST:PORT` that names it): the run gets a browser context of its own, disposed when
//! it closes (or when its connection drops), and the browser is left running.
//!
//! Confinement is the same as for a launched browser (request interception on the browser
//! target), so while a run is attached every tab of that browser, other contexts' included, is
//! held to the run's allowed origins: give each run its own browser. Network prediction is a
//! setting of the remote browser's profile, not ours to turn off.

use chromiumoxide::Browser as CdpBrowser;
use chromiumoxide::cdp::browser_protocol::target::{CreateBrowserContextParams, DisposeBrowserContextParams};
use chromiumoxide::handler::HandlerConfig;
use chromiumoxide::handler::viewport::Viewport;

use super::launch::{ChromiumConfig, ProfileDir, Started, spawn_handler};
use super::{ChromiumBrowser, with_timeout};
use crate::error::{Error, Result, cdp};

/// Connects to the browser at `url` and opens a browser context for the run.
pub(super) async fn attach(cfg: &ChromiumConfig, url: &str) -> Result<Started> {
    if cfg.options.profile.is_some() {
        return Err(Error::Invalid {
            op: "attach",
            detail: "a profile folder belongs to a launched browser: give --profile or --browser-url, not both (--storage-state works with either)".into(),
        });
    }
    let config = HandlerConfig {
        viewport: Some(Viewport {
            width: cfg.width,
            height: cfg.height,
            device_scale_factor: Some(1.0),
            emulating_mobile: false,
            is_landscape: true,
            has_touch: false,
        }),
        request_timeout: cfg.timeout,
        ..HandlerConfig::default()
    };
    let (browser, handler) = with_timeout("attach", cfg.timeout, async {
        CdpBrowser::connect_with_config(url.to_string(), config)
            .await
            .map_err(|e| Error::Chromium {
                op: "attach",
                detail: format!("no DevTools endpoint at {url}: {e}"),
            })
    })
    .await?;
    let handler = spawn_handler(handler);
    let params = CreateBrowserContextParams::builder().dispose_on_detach(true).build();
    let context = with_timeout("attach", cfg.timeout, async {
        browser.create_browser_context(params).await.map_err(cdp("attach"))
    })
    .await;
    let context = match context {
        Ok(c) => c,
        Err(e) => {
            handler.abort();
            return Err(e);
        }
    };
    tracing::info!(%url, "attached to a running Chromium");
    Ok(Started {
        browser,
        handler,
        profile: ProfileDir::Remote,
        context: Some(context),
    })
}

impl ChromiumBrowser {
    /// Whether this browser was attached to, not launched.
    pub fn is_attached(&self) -> bool {
        matches!(self.profile, ProfileDir::Remote)
    }

    /// Closes the run's tabs (its browser context) and lets go of an attached browser.
    pub(super) async fn detach(&mut self) {
        if let Some(ctx) = self.context.take() {
            let browser = &self.browser;
            let _ = with_timeout("close", self.cfg.timeout, async {
                browser
                    .execute(DisposeBrowserContextParams::new(ctx))
                    .await
                    .map_err(cdp("close"))
            })
            .await;
        }
        self.handler.abort();
    }
}
