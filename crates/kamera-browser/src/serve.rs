//! A small static HTTP/1.1 server on loopback (`127.0.0.1:0`) for the local test site and
//! directories of pages a harness serves (a benchmark suite's). GET and HEAD read the content;
//! a POST (any path, a body of at most [`MAX_BODY`] bytes) is answered with a page saying what
//! was received, its `multipart/form-data` files recorded ([`Server::uploads`]). One request per
//! connection, stopped by a cancellation token.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::upload::{self, MAX_BODY, Upload};

/// Where a server's responses come from.
#[derive(Debug, Clone)]
pub enum Content {
    /// Pages held in memory, by path (`/orders/A-1042`); the query string is ignored.
    Memory(BTreeMap<String, Vec<u8>>),
    /// Files under a directory.
    Dir(PathBuf),
}

impl Content {
    fn get(&self, path: &str) -> Option<Vec<u8>> {
        let path = path.split(['?', '#']).next().unwrap_or("/");
        match self {
            Content::Memory(m) => m
                .get(path)
                .or_else(|| m.get(&format!("{}/", path.trim_end_matches('/'))))
                .cloned(),
            Content::Dir(root) => {
                let rel = Path::new(path.trim_start_matches('/'));
                if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
                    return None;
                }
                let mut p = root.join(rel);
                if p.is_dir() {
                    p = p.join("index.html");
                }
                std::fs::read(p).ok()
            }
        }
    }
}

fn content_type(path: &str) -> &'static str {
    let path = path.split(['?', '#']).next().unwrap_or("");
    match path.rsplit('.').next() {
        Some("css") => "text/css",
        Some("js") => "application/javascript",
        Some("png") => "image/png",
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        Some("gif") => "image/gif",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("csv") => "text/csv; charset=utf-8",
        Some("txt") => "text/plain; charset=utf-8",
        Some("pdf") => "application/pdf",
        _ => "text/html; charset=utf-8",
    }
}

/// A running loopback server; dropping it (or [`Server::stop`]) stops it.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    uploads: Uploads,
}

type Uploads = Arc<Mutex<Vec<Upload>>>;

impl Server {
    /// Serves `content` on `127.0.0.1:0`.
    pub async fn start(content: Content) -> Result<Server> {
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|source| Error::Io {
            op: "Server::start",
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| Error::Io {
            op: "Server::start",
            source,
        })?;
        let stop = CancellationToken::new();
        let content = Arc::new(content);
        let uploads: Uploads = Arc::default();
        let token = stop.clone();
        let log = uploads.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = token.cancelled() => break,
                    acc = listener.accept() => {
                        let Ok((stream, _)) = acc else { continue };
                        let content = content.clone();
                        let log = log.clone();
                        tokio::spawn(async move {
                            if let Err(e) = handle(stream, &content, &log).await {
                                tracing::debug!(error = %e, "loopback server connection");
                            }
                        });
                    }
                }
            }
        });
        tracing::debug!(%addr, "loopback server started");
        Ok(Server { addr, stop, uploads })
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The origin joined with `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.origin(), path)
    }

    /// The files posted to this server so far (`multipart/form-data` file parts), in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.uploads.lock().map(|u| u.clone()).unwrap_or_default()
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn handle(mut stream: TcpStream, content: &Content, uploads: &Uploads) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = if buf.len() < 64 * 1024 {
            stream.read(&mut chunk).await?
        } else {
            0
        };
        if n == 0 {
            break buf.len();
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = upload::parse_head(&String::from_utf8_lossy(&buf[..end]));
    let path = head.path.as_str();
    let (status, kind, body) = match head.method.as_str() {
        "GET" | "HEAD" => match content.get(path) {
            Some(b) => ("200 OK", content_type(path), b),
            None => (
                "404 Not Found",
                "text/html; charset=utf-8",
                b"<html><body><h1>Not found</h1></body></html>".to_vec(),
            ),
        },
        "POST" => match head.content_length {
            None => (
                "411 Length Required",
                "text/plain",
                b"a POST needs a Content-Length".to_vec(),
            ),
            Some(n) if n > MAX_BODY => (
                "413 Content Too Large",
                "text/plain",
                format!("a body of {n} bytes is over this server's {MAX_BODY}").into_bytes(),
            ),
            Some(n) => {
                let mut body = buf.get(end + 4..).unwrap_or_default().to_vec();
                while body.len() < n {
                    let got = stream.read(&mut chunk).await?;
                    if got == 0 {
                        break;
                    }
                    body.extend_from_slice(&chunk[..got]);
                }
                body.truncate(n);
                let bare = path.split(['?', '#']).next().unwrap_or("/");
                let files = upload::files(bare, &head.content_type, &body);
                if let Some(f) = &files {
                    for u in f {
                        tracing::info!(path = bare, filename = %u.filename, bytes = u.bytes, "loopback server: a file was posted");
                    }
                    if let Ok(mut log) = uploads.lock() {
                        log.extend(f.iter().cloned());
                    }
                }
                (
                    "200 OK",
                    "text/html; charset=utf-8",
                    upload::answer(files.as_deref(), body.len()),
                )
            }
        },
        _ => ("405 Method Not Allowed", "text/plain", Vec::new()),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(header.as_bytes()).await?;
    if head.method != "HEAD" {
        stream.write_all(&body).await?;
    }
    stream.shutdown().await
}
