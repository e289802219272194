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
        Ok(BrowserOptions {
            profile,
            storage_state: self.storage_state.clone(),
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
        };
        assert_eq!(
            a.options(home).unwrap().profile,
            Some(PathBuf::from("/h/profiles/alice"))
        );
        for bad in ["../x", "a/b", ".hidden", ""] {
            let a = BrowserArgs {
                profile: Some(bad.into()),
                storage_state: None,
            };
            assert!(a.options(home).is_err(), "{bad:?}");
        }
        assert_eq!(BrowserArgs::default().options(home).unwrap(), BrowserOptions::default());
    }
}
