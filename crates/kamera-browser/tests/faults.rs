//! Browser faults on real Chromium: the browser killed in the middle of an action, a page whose
//! server never answers, a script that never yields, floods of dialogs and tabs. Each ends in a
//! typed error within the call timeout (or does not stall the next call), and closing leaves no
//! process of that browser (found by its profile directory in their command lines) and no profile.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kamera_browser::{Action, Browser, ChromiumBrowser, ChromiumConfig, Content, Error, Origins, Server};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// One Chromium at a time: the timings below assume the machine is not running four.
static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const TIMEOUT: Duration = Duration::from_secs(4);

use kamera_browser::processes_of;

/// Closes and drops `b`, then waits (up to 5 s) for its processes and its profile to be gone.
async fn close_and_count(mut b: ChromiumBrowser) -> (Vec<u32>, bool, PathBuf) {
    let profile = b.profile_dir().to_path_buf();
    assert!(!processes_of(&profile).is_empty() || b.pid().is_some());
    let _ = b.close().await;
    drop(b);
    let t0 = Instant::now();
    loop {
        let left = processes_of(&profile);
        if (left.is_empty() && !profile.exists()) || t0.elapsed() > Duration::from_secs(5) {
            return (left, profile.exists(), profile);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn site(pages: &[(&str, &str)]) -> anyhow::Result<Server> {
    let map = pages
        .iter()
        .map(|(p, html)| (p.to_string(), html.as_bytes().to_vec()))
        .collect();
    Ok(Server::start(Content::Memory(map)).await?)
}

async fn launch(origins: &[&str]) -> anyhow::Result<ChromiumBrowser> {
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "chromium missing: run scripts/install-chromium.sh"
    );
    let mut cfg = ChromiumConfig::new(Origins::new(origins)?);
    cfg.timeout = TIMEOUT;
    Ok(ChromiumBrowser::launch(cfg).await?)
}

const HOME: &str = "<html><head><title>Home</title></head><body><h1>Home</h1><a href=\"/\">Home</a></body></html>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_in_the_middle_of_an_action_is_a_typed_error_and_cleans_up() -> anyhow::Result<()> {
    let _one = ONE.lock().await;
    let server = site(&[("/", HOME)]).await?;
    let mut b = launch(&[&server.origin()]).await?;
    b.navigate(&server.url("/")).await?;
    b.observe().await?;
    let pid = b.pid().expect("the browser process");
    assert!(processes_of(b.profile_dir()).len() > 1, "the browser and its helpers");
    // SIGKILL 300 ms into a 1.5 s action (the wait, then the checks that follow it).
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
    });
    let t0 = Instant::now();
    let e = b.act(&Action::Wait { ms: 1500 }).await.unwrap_err();
    assert!(killer.join().expect("killer").map(|s| s.success()).unwrap_or(false));
    eprintln!("act after SIGKILL: {e} ({:.1} s)", t0.elapsed().as_secs_f64());
    assert!(
        matches!(&e, Error::Crashed { status, .. } if status.contains("9")),
        "{e:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(1500) + TIMEOUT,
        "{:?}",
        t0.elapsed()
    );
    // Every later call says so at once.
    let t1 = Instant::now();
    let e = b.observe().await.unwrap_err();
    assert!(matches!(e, Error::Crashed { op: "observe", .. }), "{e:?}");
    assert!(t1.elapsed() < Duration::from_millis(100));
    let (left, profile_left, profile) = close_and_count(b).await;
    assert!(left.is_empty(), "processes left: {left:?}");
    assert!(!profile_left, "profile left: {}", profile.display());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_never_answers_times_out_and_the_browser_goes_on() -> anyhow::Result<()> {
    let _one = ONE.lock().await;
    // Accepts connections, reads the request, never answers.
    let hung = TcpListener::bind("127.0.0.1:0").await?;
    let hung_origin = format!("http://127.0.0.1:{}", hung.local_addr()?.port());
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = hung.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            h.lock().unwrap().push(s);
        }
    });
    let server = site(&[("/", HOME)]).await?;
    let mut b = launch(&[&server.origin(), &hung_origin]).await?;
    b.navigate(&server.url("/")).await?;
    let t0 = Instant::now();
    let e = b.navigate(&format!("{hung_origin}/slow")).await.unwrap_err();
    eprintln!("hung page: {e} ({:.1} s)", t0.elapsed().as_secs_f64());
    assert!(matches!(e, Error::Timeout { op: "navigate", .. }), "{e:?}");
    assert!(t0.elapsed() < TIMEOUT + Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(!held.lock().unwrap().is_empty(), "the request reached the hung server");
    // The browser is still usable.
    b.navigate(&server.url("/")).await?;
    assert_eq!(b.observe().await?.title, "Home");
    let (left, profile_left, _) = close_and_count(b).await;
    assert!(
        left.is_empty() && !profile_left,
        "left: {left:?}, profile {profile_left}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_never_yields_times_out() -> anyhow::Result<()> {
    let _one = ONE.lock().await;
    let server = site(&[
        ("/", HOME),
        (
            "/loop",
            "<html><head><title>Busy</title></head><body>busy<script>for (;;) {}</script></body></html>",
        ),
    ])
    .await?;
    let mut b = launch(&[&server.origin()]).await?;
    b.navigate(&server.url("/")).await?;
    let t0 = Instant::now();
    let nav = b.navigate(&server.url("/loop")).await;
    let t_nav = t0.elapsed();
    let t1 = Instant::now();
    let obs = b.observe().await;
    let t_obs = t1.elapsed();
    eprintln!(
        "infinite loop: navigate {nav:?} ({t_nav:?}), observe {:?} ({t_obs:?})",
        obs.as_ref().err()
    );
    for (what, r, t) in [("navigate", nav.err(), t_nav), ("observe", obs.err(), t_obs)] {
        assert!(matches!(r, Some(Error::Timeout { .. })), "{what}: {r:?}");
        assert!(t < TIMEOUT * 2 + Duration::from_secs(2), "{what}: {t:?}");
    }
    let (left, profile_left, _) = close_and_count(b).await;
    assert!(
        left.is_empty() && !profile_left,
        "left: {left:?}, profile {profile_left}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_dialogs_and_tabs_do_not_stall_the_browser() -> anyhow::Result<()> {
    let _one = ONE.lock().await;
    let alerts = "<html><head><title>Alerts</title></head><body>\
        <button id=\"more\" onclick=\"for (let i = 0; i < 100; i++) { confirm('c' + i); prompt('p' + i); }\">More</button>\
        <script>for (let i = 0; i < 300; i++) alert('a' + i);\
        window.onbeforeunload = (e) => { e.preventDefault(); e.returnValue = 'stay'; };</script></body></html>";
    let tabs = "<html><head><title>Tabs</title></head><body>\
        <button id=\"open\" onclick=\"for (let i = 0; i < 300; i++) window.open('/?' + i);\">Open</button>\
        <script>for (let i = 0; i < 300; i++) window.open('/?auto' + i);</script></body></html>";
    let server = site(&[("/", HOME), ("/alerts", alerts), ("/tabs", tabs)]).await?;
    let mut b = launch(&[&server.origin()]).await?;
    let t0 = Instant::now();
    let stage = |what: &str| eprintln!("{what} at {:?}", t0.elapsed());
    b.navigate(&server.url("/alerts")).await?;
    stage("alerts loaded");
    let obs = b.observe().await?;
    assert_eq!(obs.title, "Alerts");
    let after_load = b.eval("window.__kameraDialogs").await?;
    let more = obs.by_html_id("more").expect("button").id;
    b.act(&Action::Click { id: more }).await?;
    stage("clicked");
    let after_click = b.eval("window.__kameraDialogs").await?;
    // Leaving runs the beforeunload handler: accepted, so the navigation goes on.
    b.navigate(&server.url("/tabs")).await?;
    let dialogs = b.dialogs();
    stage("left");
    let obs = b.observe().await?;
    let open = obs.by_html_id("open").expect("button").id;
    b.act(&Action::Click { id: open }).await?;
    let title = b.observe().await?.title;
    let tabs_open = b.open_tabs().await?;
    let took = t0.elapsed();
    eprintln!(
        "dialogs: {after_load} on load, {after_click} after the click (the hook), {dialogs} over \
         the protocol (the beforeunload); {tabs_open} tabs open; {took:?}"
    );
    assert_eq!(after_load, serde_json::json!(300));
    assert_eq!(after_click, serde_json::json!(500));
    assert_eq!(dialogs, 1, "the beforeunload dialog was answered over the protocol");
    assert_eq!(title, "Tabs");
    assert!(
        tabs_open <= 2,
        "{tabs_open} tabs: the popup blocker allows one per click"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    let (left, profile_left, _) = close_and_count(b).await;
    assert!(
        left.is_empty() && !profile_left,
        "left: {left:?}, profile {profile_left}"
    );
    Ok(())
}
