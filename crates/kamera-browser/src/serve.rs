//! A small static HTTP/1.1 server on loopback (`127.0.0.1:0`) for the local test site and
//! directories of pages a harness serves (a benchmark suite's). GET and HEAD only, one request
//! per connection, stopped by a cancellation token.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

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
        _ => "text/html; charset=utf-8",
    }
}

/// A running loopback server; dropping it (or [`Server::stop`]) stops it.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
}

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
        let token = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = token.cancelled() => break,
                    acc = listener.accept() => {
                        let Ok((stream, _)) = acc else { continue };
                        let content = content.clone();
                        tokio::spawn(async move {
                            if let Err(e) = handle(stream, &content).await {
                                tracing::debug!(error = %e, "loopback server connection");
                            }
                        });
                    }
                }
            }
        });
        tracing::debug!(%addr, "loopback server started");
        Ok(Server { addr, stop })
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The origin joined with `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.origin(), path)
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

async fn handle(mut stream: TcpStream, content: &Content) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 2048];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 64 * 1024 {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
    let (status, body) = match (method, content.get(path)) {
        ("GET" | "HEAD", Some(b)) => ("200 OK", b),
        ("GET" | "HEAD", None) => (
            "404 Not Found",
            b"<html><body><h1>Not found</h1></body></html>".to_vec(),
        ),
        _ => ("405 Method Not Allowed", Vec::new()),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        content_type(path),
        body.len()
    );
    stream.write_all(header.as_bytes()).await?;
    if method != "HEAD" {
        stream.write_all(&body).await?;
    }
    stream.shutdown().await
}
