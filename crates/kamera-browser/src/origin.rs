//! The allowed-origins check every navigation passes.

use url::Url;

use crate::error::{Error, Result};

/// Origins (`scheme://host:port`) a run may visit. Anything else, `file:`, `chrome:`,
/// `javascript:` and `data:` included, is refused.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Origins {
    allowed: Vec<String>,
}

impl Origins {
    /// Allows each of `origins` (URLs; only their origin counts).
    pub fn new<S: AsRef<str>>(origins: &[S]) -> Result<Origins> {
        let mut allowed = Vec::new();
        for o in origins {
            let u = Url::parse(o.as_ref()).map_err(|e| Error::Invalid {
                op: "Origins::new",
                detail: format!("{:?} is not a URL: {e}", o.as_ref()),
            })?;
            let origin = u.origin();
            if !origin.is_tuple() {
                return Err(Error::Invalid {
                    op: "Origins::new",
                    detail: format!("{:?} has no http(s) origin", o.as_ref()),
                });
            }
            allowed.push(origin.ascii_serialization());
        }
        Ok(Origins { allowed })
    }

    /// The allowed origins, serialized.
    pub fn list(&self) -> &[String] {
        &self.allowed
    }

    /// Ok when `url` is http(s) on an allowed origin; `about:blank` is allowed too.
    pub fn check(&self, url: &str) -> Result<()> {
        if url == "about:blank" {
            return Ok(());
        }
        let refused = |reason: String| Error::Refused {
            url: url.to_string(),
            reason,
        };
        let u = Url::parse(url).map_err(|e| refused(format!("not a URL ({e})")))?;
        if !matches!(u.scheme(), "http" | "https") {
            return Err(refused(format!("scheme {}: is never allowed", u.scheme())));
        }
        let origin = u.origin().ascii_serialization();
        if self.allowed.contains(&origin) {
            Ok(())
        } else {
            Err(refused(format!(
                "origin {origin} is not in the allowed origins {:?}",
                self.allowed
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_origins() {
        let o = Origins::new(&["http://127.0.0.1:8080/"]).unwrap();
        assert!(o.check("http://127.0.0.1:8080/orders?x=1").is_ok());
        assert!(o.check("http://127.0.0.1:8081/").is_err());
        assert!(o.check("file:///etc/passwd").is_err());
        assert!(o.check("chrome://settings").is_err());
        assert!(o.check("javascript:alert(1)").is_err());
        assert!(o.check("about:blank").is_ok());
        assert!(Origins::new(&["file:///tmp"]).is_err());
    }
}
