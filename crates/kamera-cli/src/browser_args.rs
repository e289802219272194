//! The browser flags of `kamera run` and `kamera record`: a profile kept between runs, a
//! Playwright storageState file, a running Chromium to attach to.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::Args;
use kamera_browser::BrowserOptions;

#[derive(Args, Clone, Default)]
pub struct BrowserArgs {
    /// Keep cookies and localStorage between runs in the browser profile NAME
    /// ($KAMERA_HOME/profiles/NAME, created on first use; one run at a time may use it). Without
    /// it every run starts from an empty temporary profile, removed at the end.
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// A Playwright storageState JSON file (cookies and each origin's localStorage): imported
    /// when the browser starts, if the file exists, and written back when the run ends.
    #[arg(long, value_name = "FILE")]
    storage_state: Option<PathBuf>,
    /// Attach to a running Chromium instead of launching one: its DevTools endpoint,
    /// ws://HOST:PORT/devtools/browser/ID or http://HOST:PORT (a Chromium started with
    /// --remote-debugging-port). The run works in a browser context of its own, closed at the
    /// end; the browser keeps running. While attached, every tab of that browser is held to the
    /// run's allowed origins: give each run its own browser. Not with --profile.
    #[arg(long, value_name = "URL", conflicts_with = "profile")]
    browser_url: Option<String>,
}

impl BrowserArgs {
    /// The options for a run whose Kamera home is `home`.
    pub fn options(&self, home: &Path) -> Result<BrowserOptions> {
        let profile = match &self.profile {
            Some(name) => {
                let ok = !name.is_empty()
                    && !name.starts_with('.')
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
                if !ok {
                    bail!(
                        "--profile {name:?}: a profile name is letters, digits, '.', '_' and '-' (not starting with '.')"
                    );
                }
                Some(home.join("profiles").join(name))
            }
            None => None,
        };
        if let Some(url) = &self.browser_url
            && !["ws://", "wss://", "http://", "https://"]
                .iter()
                .any(|s| url.starts_with(s))
        {
            bail!(
                "--browser-url {url:?}: a DevTools endpoint is ws://HOST:PORT/devtools/browser/ID or http://HOST:PORT"
            );
        }
        Ok(BrowserOptions {
            profile,
            storage_state: self.storage_state.clone(),
            browser_url: self.browser_url.clone(),
            // The run's trace folder decides (kamera-harness's run_scenario).
            downloads: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_lives_under_the_home_and_its_name_is_checked() {
        let home = Path::new("/h");
        let a = BrowserArgs {
            profile: Some("alice".into()),
            storage_state: None,
            browser_url: None,
        };
        assert_eq!(
            a.options(home).unwrap().profile,
            Some(PathBuf::from("/h/profiles/alice"))
        );
        for bad in ["../x", "a/b", ".hidden", ""] {
            let a = BrowserArgs {
                profile: Some(bad.into()),
                storage_state: None,
                browser_url: None,
            };
            assert!(a.options(home).is_err(), "{bad:?}");
        }
        assert_eq!(BrowserArgs::default().options(home).unwrap(), BrowserOptions::default());
    }
}
