//! Playwright's storageState JSON: a browser's cookies and each origin's localStorage, the file
//! `--storage-state` imports at launch and exports at close.
//!
//! ```json
//! { "cookies": [{ "name": "sid", "value": "1", "domain": "127.0.0.1", "path": "/",
//!                 "expires": -1, "httpOnly": true, "secure": false, "sameSite": "Lax" }],
//!   "origins": [{ "origin": "http://127.0.0.1:8080",
//!                 "localStorage": [{ "name": "token", "value": "abc" }] }] }
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Cookies and localStorage, as Playwright's `storageState()` writes them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StorageState {
    #[serde(default)]
    pub cookies: Vec<StoredCookie>,
    #[serde(default)]
    pub origins: Vec<OriginStorage>,
}

/// One cookie.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredCookie {
    pub name: String,
    pub value: String,
    pub domain: String,
    #[serde(default = "root")]
    pub path: String,
    /// Unix time in seconds; -1 for a session cookie.
    #[serde(default = "session", serialize_with = "seconds")]
    pub expires: f64,
    #[serde(default)]
    pub http_only: bool,
    #[serde(default)]
    pub secure: bool,
    /// `Strict`, `Lax` or `None`.
    #[serde(default = "lax")]
    pub same_site: String,
}

/// One origin's localStorage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OriginStorage {
    /// `scheme://host:port`.
    pub origin: String,
    #[serde(default)]
    pub local_storage: Vec<NameValue>,
}

/// One localStorage item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NameValue {
    pub name: String,
    pub value: String,
}

fn root() -> String {
    "/".into()
}
fn session() -> f64 {
    -1.0
}
fn lax() -> String {
    "Lax".into()
}

/// Whole seconds as an integer (`-1`, as Playwright writes a session cookie), else as they are.
fn seconds<S: serde::Serializer>(v: &f64, s: S) -> std::result::Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        s.serialize_i64(*v as i64)
    } else {
        s.serialize_f64(*v)
    }
}

impl StorageState {
    /// Reads a storageState file.
    pub fn read(path: &Path) -> Result<StorageState> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            op: "storage state",
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Invalid {
            op: "storage state",
            detail: format!("{} is not a storageState file: {e}", path.display()),
        })
    }

    /// Writes it (pretty JSON), replacing the file whole.
    pub fn write(&self, path: &Path) -> Result<()> {
        let io = |source| Error::Io {
            op: "storage state",
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_vec_pretty(self).unwrap_or_default();
        std::fs::write(&tmp, json).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// The localStorage items of `origin`, if any.
    pub fn local_storage(&self, origin: &str) -> &[NameValue] {
        self.origins
            .iter()
            .find(|o| o.origin.trim_end_matches('/') == origin.trim_end_matches('/'))
            .map(|o| o.local_storage.as_slice())
            .unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_playwrights_format_and_writes_it_back() {
        let json = r#"{"cookies":[{"name":"sid","value":"1","domain":"127.0.0.1","path":"/",
            "expires":-1,"httpOnly":true,"secure":false,"sameSite":"Lax"}],
            "origins":[{"origin":"http://127.0.0.1:8080","localStorage":[{"name":"t","value":"a"}]}]}"#;
        let s: StorageState = serde_json::from_str(json).unwrap();
        assert!(s.cookies[0].http_only);
        assert_eq!(s.local_storage("http://127.0.0.1:8080/")[0].value, "a");
        let back: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(back, serde_json::from_str::<serde_json::Value>(json).unwrap());
    }
}
