//! Attaching to a Chromium started apart (with `--remote-debugging-port` on loopback), by its
//! `ws://` endpoint and by `http://HOST:PORT`: the run observes and acts, its tabs are confined
//! (a clicked popup to another origin is blocked and counted, the other origin's server sees no
//! connection), dialogs are answered, each run has its own cookies, and the browser outlives it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kamera_browser::{Action, Browser, BrowserOptions, ChromiumBrowser, ChromiumConfig, Content, Origins, Server};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// A Chromium of its own on an ephemeral DevTools port: the process, its `ws://` endpoint, its
/// profile (network prediction off, as the README asks of a remote browser).
fn start_chromium() -> anyhow::Result<(Child, String, tempfile::TempDir)> {
    let profile = tempfile::tempdir()?;
    std::fs::create_dir_all(profile.path().join("Default"))?;
    std::fs::write(
        profile.path().join("Default/Preferences"),
        r#"{"net":{"network_prediction_options":2}}"#,
    )?;
    let mut cmd = Command::new("/usr/bin/chromium");
    cmd.args([
        "--headless",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        "--no-first-run",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        // A tab the page opens must not throttle the run's own tab behind it.
        "--disable-background-timer-throttling",
        "--disable-renderer-backgrounding",
        "--disable-backgrounding-occluded-windows",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .arg("about:blank")
    .stderr(Stdio::piped())
    .stdout(Stdio::null());
    if std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    }) {
        cmd.arg("--no-sandbox");
    }
    let mut child = cmd.spawn()?;
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(ws) = line.strip_prefix("DevTools listening on ") {
                let _ = tx.send(ws.trim().to_string());
            }
        }
    });
    let ws = rx.recv_timeout(Duration::from_secs(20))?;
    Ok((child, ws, profile))
}

/// A loopback server that counts connections (with or without a request).
async fn counting() -> anyhow::Result<(String, Arc<Mutex<Vec<String>>>)> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let origin = format!("http://{}", l.local_addr()?);
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf))
                .await
                .ok()
                .and_then(|r| r.ok())
                .unwrap_or(0);
            log2.lock().unwrap().push(
                String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string(),
            );
        }
    });
    Ok((origin, log))
}

async fn attach(url: &str, site: &Server) -> anyhow::Result<ChromiumBrowser> {
    let mut cfg = ChromiumConfig::new(Origins::new(&[site.origin()])?);
    cfg.options = BrowserOptions {
        browser_url: Some(url.to_string()),
        ..Default::default()
    };
    Ok(ChromiumBrowser::launch(cfg).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_attaches_to_a_chromium_started_apart() -> anyhow::Result<()> {
    let (mut chromium, ws, _profile) = start_chromium()?;
    let http = ws
        .strip_prefix("ws://")
        .and_then(|r| r.split('/').next())
        .map(|hp| format!("http://{hp}"))
        .expect("host:port");
    let (evil, evil_log) = counting().await?;
    let mut pages = BTreeMap::new();
    pages.insert(
        "/".to_string(),
        format!(
            "<html><head><title>Remote</title><link rel=\"preconnect\" href=\"{evil}\"></head><body>\
             <button id=\"go\" onclick=\"window.open('{evil}/popup')\">Go</button>\
             <button id=\"ask\" onclick=\"window.answer = confirm('Sure?')\">Ask</button>\
             <button id=\"login\" onclick=\"document.cookie = 'sid=1; Max-Age=600; path=/'\">Login</button>\
             </body></html>"
        )
        .into_bytes(),
    );
    let site = Server::start(Content::Memory(pages)).await?;

    // By the ws:// endpoint.
    let mut b = attach(&ws, &site).await?;
    assert!(b.is_attached() && b.pid().is_none());
    b.navigate(&site.url("/")).await?;
    let obs = b.observe().await?;
    assert_eq!(obs.title, "Remote");
    let id = |h: &str| obs.by_html_id(h).expect(h).id;
    b.act(&Action::Click { id: id("go") }).await?;
    b.act(&Action::Click { id: id("ask") }).await?;
    b.act(&Action::Click { id: id("login") }).await?;
    b.act(&Action::Wait { ms: 700 }).await?;
    assert_eq!(
        b.eval("window.answer").await?,
        serde_json::json!(false),
        "the dialog was answered"
    );
    assert_eq!(b.eval("document.cookie").await?, serde_json::json!("sid=1"));
    let blocked = b.blocked();
    b.close().await?;
    assert!(
        blocked.iter().any(|x| x.url == format!("{evil}/popup")),
        "the popup was not counted as blocked: {blocked:?}"
    );

    // By http://HOST:PORT, after the first run let go: a context of its own (no cookie).
    let mut b = attach(&http, &site).await?;
    b.navigate(&site.url("/")).await?;
    assert_eq!(
        b.eval("document.cookie").await?,
        serde_json::json!(""),
        "each run has its own cookies"
    );
    b.close().await?;
    drop(b);

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(chromium.try_wait()?.is_none(), "the attached browser keeps running");
    chromium.kill()?;
    let _ = chromium.wait();
    let hits = evil_log.lock().unwrap().clone();
    assert!(hits.is_empty(), "the other origin saw connections: {hits:?}");

    // A bad endpoint is a clear error, not a hang.
    let e = attach("http://127.0.0.1:9", &site)
        .await
        .err()
        .expect("no browser there");
    assert!(e.to_string().contains("127.0.0.1:9"), "{e}");
    Ok(())
}

/// An attached run's downloads go to its folder (set for the run's browser context) and are
/// listed; an attached run without a folder has its downloads refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_run_keeps_its_downloads() -> anyhow::Result<()> {
    let (mut chromium, ws, profile) = start_chromium()?;
    let mut pages = BTreeMap::new();
    pages.insert(
        "/".to_string(),
        b"<html><body><a id=\"dl\" href=\"/data.txt\" download>Get the data</a></body></html>".to_vec(),
    );
    pages.insert("/data.txt".to_string(), b"remote bytes\n".to_vec());
    let site = Server::start(Content::Memory(pages)).await?;
    let folder = tempfile::tempdir()?;
    let mut cfg = ChromiumConfig::new(Origins::new(&[site.origin()])?);
    cfg.options = BrowserOptions {
        browser_url: Some(ws.clone()),
        downloads: Some(folder.path().to_path_buf()),
        ..Default::default()
    };
    let mut b = ChromiumBrowser::launch(cfg).await?;
    b.navigate(&site.url("/")).await?;
    let obs = b.observe().await?;
    let dl = obs.by_html_id("dl").expect("dl").id;
    b.act(&Action::Click { id: dl }).await?;
    let got = b.downloads();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].filename, "data.txt");
    assert_eq!(std::fs::read(folder.path().join("data.txt"))?, b"remote bytes\n");
    b.close().await?;

    // Another run on the same browser, no folder: refused, nothing written.
    let mut b = attach(&ws, &site).await?;
    b.navigate(&site.url("/")).await?;
    let obs = b.observe().await?;
    b.act(&Action::Click {
        id: obs.by_html_id("dl").expect("dl").id,
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(b.downloads().is_empty());
    b.close().await?;
    assert_eq!(
        std::fs::read_dir(folder.path())?.count(),
        1,
        "only the first run's file"
    );
    let home_dl = std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join("Downloads/data.txt"));
    assert!(!home_dl.is_some_and(|p| p.exists()), "the refused download was saved");
    drop(profile);
    chromium.kill()?;
    let _ = chromium.wait();
    Ok(())
}
