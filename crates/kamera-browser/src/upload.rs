//! What the loopback [`crate::Server`] does with a POST: the request read whole (bounded), a
//! `multipart/form-data` body cut into its parts, each file part recorded as an [`Upload`], and
//! a small page saying what was received.

use serde::{Deserialize, Serialize};

/// The largest request body the server reads; a larger one is answered 413.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// One file a form posted to the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upload {
    /// The request path it was posted to (`/upload`).
    pub path: String,
    /// The form field's name (`attachment`).
    pub field: String,
    /// The file name the browser sent (no folder).
    pub filename: String,
    /// The part's `Content-Type`, when it has one.
    pub content_type: String,
    /// The file's size in bytes.
    pub bytes: usize,
    /// The file's bytes.
    #[serde(skip)]
    pub content: Vec<u8>,
}

/// A request's head: its method, path and the headers the server reads.
#[derive(Debug, Default)]
pub(crate) struct Head {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) content_length: Option<usize>,
    pub(crate) content_type: String,
}

/// Parses the request line and headers (`head` without the blank line).
pub(crate) fn parse_head(head: &str) -> Head {
    let mut lines = head.split("\r\n");
    let mut parts = lines.next().unwrap_or("").split_whitespace();
    let mut h = Head {
        method: parts.next().unwrap_or("").to_string(),
        path: parts.next().unwrap_or("/").to_string(),
        ..Head::default()
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            h.content_length = value.parse().ok();
        } else if name.eq_ignore_ascii_case("content-type") {
            h.content_type = value.to_string();
        }
    }
    h
}

/// The file parts of a `multipart/form-data` body posted to `path` with `content_type`; `None`
/// when the body is not multipart (or has no boundary). Parts without a `filename` (plain
/// fields) are left out; a file input left empty (an empty filename) too.
pub(crate) fn files(path: &str, content_type: &str, body: &[u8]) -> Option<Vec<Upload>> {
    let (kind, params) = content_type.split_once(';').unwrap_or((content_type, ""));
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let boundary = params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
    })?;
    if boundary.is_empty() {
        return None;
    }
    let delim = format!("--{boundary}").into_bytes();
    let mut out = Vec::new();
    // Each part runs from after a delimiter line to the CRLF before the next delimiter.
    let mut at = find(body, &delim, 0)?;
    loop {
        let start = at + delim.len();
        if body[start..].starts_with(b"--") {
            break;
        }
        let Some(next) = find(body, &[b"\r\n".as_slice(), &delim].concat(), start) else {
            break;
        };
        let part = body[start..next].strip_prefix(b"\r\n").unwrap_or(&body[start..next]);
        if let Some(u) = file_part(path, part) {
            out.push(u);
        }
        at = next + 2;
    }
    Some(out)
}

/// A part's headers and content, as an upload when it is a file part.
fn file_part(path: &str, part: &[u8]) -> Option<Upload> {
    let split = find(part, b"\r\n\r\n", 0)?;
    let headers = String::from_utf8_lossy(&part[..split]);
    let content = &part[split + 4..];
    let mut field = String::new();
    let mut filename = None;
    let mut content_type = String::new();
    for line in headers.split("\r\n") {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case("content-disposition") {
            for p in value.split(';').skip(1) {
                let Some((k, v)) = p.split_once('=') else { continue };
                let v = v.trim().trim_matches('"').to_string();
                match k.trim() {
                    "name" => field = v,
                    "filename" => filename = Some(v),
                    _ => {}
                }
            }
        } else if name.trim().eq_ignore_ascii_case("content-type") {
            content_type = value.trim().to_string();
        }
    }
    let filename = filename.filter(|f| !f.is_empty())?;
    Some(Upload {
        path: path.to_string(),
        field,
        filename,
        content_type,
        bytes: content.len(),
        content: content.to_vec(),
    })
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > hay.len() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

/// The page answering a POST: what was received, one line each (`received NAME (N bytes)`).
pub(crate) fn answer(files: Option<&[Upload]>, body_len: usize) -> Vec<u8> {
    let lines = match files {
        Some([]) => "<p>received no file</p>".to_string(),
        Some(files) => files
            .iter()
            .map(|u| {
                format!(
                    "<p class=\"received\">received {} ({} bytes)</p>",
                    escape(&u.filename),
                    u.bytes
                )
            })
            .collect(),
        None => format!("<p>received a form of {body_len} bytes</p>"),
    };
    format!(
        "<html><head><title>Received</title></head><body><h1>Upload received</h1>{lines}<p><a href=\"/\">Home</a></p></body></html>"
    )
    .into_bytes()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    const CT: &str = "multipart/form-data; boundary=----WebKitFormBoundaryAbC";

    fn body(parts: &[&[u8]]) -> Vec<u8> {
        let mut b = Vec::new();
        for p in parts {
            b.extend_from_slice(b"------WebKitFormBoundaryAbC\r\n");
            b.extend_from_slice(p);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(b"------WebKitFormBoundaryAbC--\r\n");
        b
    }

    #[test]
    fn file_parts_with_their_exact_bytes() {
        let b = body(&[
            b"Content-Disposition: form-data; name=\"note\"\r\n\r\nhello",
            b"Content-Disposition: form-data; name=\"f\"; filename=\"a b.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n\r\n--x\r\n\x00\xff",
            b"Content-Disposition: form-data; name=\"g\"; filename=\"\"\r\nContent-Type: application/octet-stream\r\n\r\n",
        ]);
        let f = files("/upload", CT, &b).unwrap();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].field.as_str(), f[0].filename.as_str()), ("f", "a b.bin"));
        assert_eq!(f[0].content, b"\r\n--x\r\n\x00\xff");
        assert_eq!(f[0].bytes, 9);
        assert_eq!(f[0].content_type, "application/octet-stream");
    }

    #[test]
    fn not_multipart_or_malformed_is_no_panic() {
        assert!(files("/", "application/x-www-form-urlencoded", b"a=1").is_none());
        assert!(files("/", "multipart/form-data", b"x").is_none());
        assert_eq!(
            files("/", CT, b"------WebKitFormBoundaryAbC\r\ntruncated"),
            Some(vec![])
        );
        assert_eq!(
            files("/", "multipart/form-data; boundary=\"q\"", b"--q--"),
            Some(vec![])
        );
        let page = String::from_utf8(answer(Some(&[]), 0)).unwrap();
        assert!(page.contains("received no file"));
    }

    #[test]
    fn head_fields() {
        let h = parse_head("POST /upload?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 42\r\nContent-Type: text/plain");
        assert_eq!((h.method.as_str(), h.path.as_str()), ("POST", "/upload?x=1"));
        assert_eq!(h.content_length, Some(42));
        assert_eq!(h.content_type, "text/plain");
    }
}
