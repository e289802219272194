//! Cookies and localStorage in and out of a running [`ChromiumBrowser`], as Playwright's
//! storageState: cookies over the browser's Storage domain, localStorage over DOMStorage by
//! storage key (no page of the origin needs to be open).

use std::path::Path;

use chromiumoxide::cdp::browser_protocol::dom_storage::{
    GetDomStorageItemsParams, SerializedStorageKey, SetDomStorageItemParams, StorageId,
};
use chromiumoxide::cdp::browser_protocol::network::{CookieParam, CookieSameSite, TimeSinceEpoch};
use chromiumoxide::cdp::browser_protocol::storage::{GetCookiesParams, SetCookiesParams};
use chromiumoxide::cdp::browser_protocol::target::CreateTargetParams;

use chromiumoxide::Page;

use super::{ChromiumBrowser, with_timeout};
use crate::error::{Error, Result, cdp};
use crate::storage::{NameValue, OriginStorage, StorageState, StoredCookie};

impl ChromiumBrowser {
    /// The browser's cookies and the localStorage of every allowed origin (and of every origin
    /// imported by [`ChromiumBrowser::set_storage_state`]); origins with none are left out.
    pub async fn storage_state(&self) -> Result<StorageState> {
        let browser = &self.browser;
        let cookies = with_timeout("storage_state", self.cfg.timeout, async {
            let get = GetCookiesParams {
                browser_context_id: self.context.clone(),
            };
            let r = browser.execute(get).await.map_err(cdp("storage_state"))?;
            Ok(r.result.cookies)
        })
        .await?;
        let cookies = cookies
            .into_iter()
            .map(|c| StoredCookie {
                name: c.name,
                value: c.value,
                domain: c.domain,
                path: c.path,
                expires: if c.session { -1.0 } else { c.expires },
                http_only: c.http_only,
                secure: c.secure,
                same_site: c
                    .same_site
                    .map(|s| s.as_ref().to_string())
                    .unwrap_or_else(|| "Lax".into()),
            })
            .collect();
        let mut origins = Vec::new();
        let mut names: Vec<String> = self.cfg.origins.list().to_vec();
        names.extend(
            self.imported
                .iter()
                .filter(|o| !names.contains(o))
                .cloned()
                .collect::<Vec<_>>(),
        );
        for origin in names {
            let page = self.origin_page("storage_state", &origin).await?;
            let items = with_timeout("storage_state", self.cfg.timeout, async {
                let r = page
                    .execute(GetDomStorageItemsParams::new(storage_id(&origin)))
                    .await
                    .map_err(cdp("storage_state"));
                let _ = page.close().await;
                Ok(r?.result.entries)
            })
            .await?;
            let local_storage: Vec<NameValue> = items
                .into_iter()
                .filter_map(|e| {
                    let mut it = e.inner().clone().into_iter();
                    Some(NameValue {
                        name: it.next()?,
                        value: it.next()?,
                    })
                })
                .collect();
            if !local_storage.is_empty() {
                origins.push(OriginStorage { origin, local_storage });
            }
        }
        Ok(StorageState { cookies, origins })
    }

    /// Sets `state`'s cookies and localStorage (added to what the profile holds).
    pub async fn set_storage_state(&mut self, state: &StorageState) -> Result<()> {
        let cookies: Vec<CookieParam> = state
            .cookies
            .iter()
            .map(|c| {
                let mut p = CookieParam::new(c.name.clone(), c.value.clone());
                p.domain = Some(c.domain.clone());
                p.path = Some(c.path.clone());
                p.secure = Some(c.secure);
                p.http_only = Some(c.http_only);
                p.same_site = match c.same_site.as_str() {
                    "Strict" => Some(CookieSameSite::Strict),
                    "None" => Some(CookieSameSite::None),
                    _ => Some(CookieSameSite::Lax),
                };
                p.expires = (c.expires >= 0.0).then(|| TimeSinceEpoch::new(c.expires));
                p
            })
            .collect();
        if !cookies.is_empty() {
            let browser = &self.browser;
            with_timeout("set_storage_state", self.cfg.timeout, async {
                let mut set = SetCookiesParams::new(cookies);
                set.browser_context_id = self.context.clone();
                browser.execute(set).await.map_err(cdp("set_storage_state"))?;
                Ok(())
            })
            .await?;
        }
        for o in &state.origins {
            let origin = o.origin.trim_end_matches('/').to_string();
            if o.local_storage.is_empty() {
                continue;
            }
            if let Err(e) = self.cfg.origins.check(&format!("{origin}/")) {
                // The run may never go there: nothing to set.
                tracing::info!(%origin, error = %e, "storage state: localStorage of an origin off the allowed ones left out");
                continue;
            }
            let page = self.origin_page("set_storage_state", &origin).await?;
            let sets = o
                .local_storage
                .iter()
                .map(|item| SetDomStorageItemParams::new(storage_id(&origin), item.name.clone(), item.value.clone()));
            let r = with_timeout("set_storage_state", self.cfg.timeout, async {
                for set in sets {
                    page.execute(set).await.map_err(cdp("set_storage_state"))?;
                }
                Ok(())
            })
            .await;
            let _ = page.close().await;
            r?;
            if !self.imported.contains(&origin) {
                self.imported.push(origin);
            }
        }
        Ok(())
    }

    /// A new tab showing an empty document of `origin` (answered by the confinement, never
    /// sent to the site): DOMStorage reaches an origin's localStorage through a frame of it.
    async fn origin_page(&self, op: &'static str, origin: &str) -> Result<Page> {
        let url = format!("{origin}/.kamera-storage-{}", std::process::id());
        self.confinement.stub(&url);
        let browser = &self.browser;
        let mut target = CreateTargetParams::new(url.as_str());
        target.browser_context_id = self.context.clone();
        let page = with_timeout(op, self.cfg.timeout, async {
            browser.new_page(target).await.map_err(cdp(op))
        })
        .await;
        self.confinement.unstub(&url);
        page
    }

    pub(super) async fn import_state_file(&mut self, path: &Path) -> Result<()> {
        let state = StorageState::read(path)?;
        self.set_storage_state(&state).await
    }

    pub(super) async fn export_state_file(&self, path: &Path) -> Result<()> {
        let state = self.storage_state().await.map_err(|e| Error::Chromium {
            op: "storage_state",
            detail: format!("exporting to {}: {e}", path.display()),
        })?;
        state.write(path)
    }
}

/// The localStorage area of `origin` (`scheme://host:port`, its storage key with a `/`).
fn storage_id(origin: &str) -> StorageId {
    let mut id = StorageId::new(true);
    id.storage_key = Some(SerializedStorageKey::new(format!("{}/", origin.trim_end_matches('/'))));
    id
}
