//! kamera-browser's public API: the loopback server, origins, Chromium (when installed), replay.

use kamera_browser::{Action, Browser, ChromiumBrowser, ChromiumConfig, Content, Error, Origins, Server};

/// Fails with what to do when Debian's chromium is missing.
fn require_chromium() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "chromium missing: run scripts/install-chromium.sh"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_chromium_names_the_install_script() {
    let mut cfg = ChromiumConfig::new(Origins::default());
    cfg.executable = "/nonexistent/chromium".into();
    let e = ChromiumBrowser::launch(cfg).await.err().expect("must fail");
    assert!(matches!(e, Error::ChromiumMissing { .. }));
    assert!(e.to_string().contains("scripts/install-chromium.sh"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_observes_clicks_and_refuses() -> anyhow::Result<()> {
    require_chromium();
    let mut pages = std::collections::BTreeMap::new();
    pages.insert(
        "/".to_string(),
        b"<html><head><title>T</title></head><body><h1>Hello</h1><p>Some <b>bold</b> text</p>\
          <button id=\"b\" onclick=\"document.title='clicked'\">Press</button></body></html>"
            .to_vec(),
    );
    let server = Server::start(Content::Memory(pages)).await?;
    let mut b = ChromiumBrowser::launch(ChromiumConfig::new(Origins::new(&[server.origin()])?)).await?;
    b.navigate(&server.url("/")).await?;
    let obs = b.observe().await?;
    assert_eq!(obs.title, "T");
    assert!(
        obs.text.contains("# Hello") && obs.text.contains("Some bold text"),
        "{}",
        obs.text
    );
    assert!(obs.screenshot_png.starts_with(b"\x89PNG"));
    let id = obs.by_html_id("b").expect("button").id;
    b.act(&Action::Click { id }).await?;
    assert_eq!(b.eval("document.title").await?, serde_json::json!("clicked"));
    let e = b.navigate("file:///etc/passwd").await.unwrap_err();
    assert!(matches!(e, Error::Refused { .. }), "{e}");
    let e = b.act(&Action::Click { id: 999 }).await.unwrap_err();
    assert!(matches!(e, Error::NoElement { .. }), "{e}");
    b.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_page_is_a_timeout_not_a_hang() -> anyhow::Result<()> {
    require_chromium();
    let mut pages = std::collections::BTreeMap::new();
    pages.insert(
        "/".to_string(),
        b"<html><body><p>spinning</p><script>setTimeout(() => { for (;;) {} }, 50)</script></body></html>".to_vec(),
    );
    let server = Server::start(Content::Memory(pages)).await?;
    let mut cfg = ChromiumConfig::new(Origins::new(&[server.origin()])?);
    cfg.timeout = std::time::Duration::from_secs(2);
    let mut b = ChromiumBrowser::launch(cfg).await?;
    let t0 = std::time::Instant::now();
    let _ = b.navigate(&server.url("/")).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let e = b.observe().await.expect_err("the page never answers");
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(15));
    b.close().await?;
    Ok(())
}

/// A tab the page opens and the agent switches to is set up as the launch tab is: its dialogs
/// are answered by the hook, in the document there and in the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tab_switched_to_has_its_dialogs_answered() -> anyhow::Result<()> {
    let mut pages = std::collections::BTreeMap::new();
    pages.insert(
        "/".to_string(),
        b"<html><head><title>Home</title></head><body>\
          <button id=\"open\" onclick=\"window.open('/popup')\">Open</button></body></html>"
            .to_vec(),
    );
    pages.insert(
        "/popup".to_string(),
        b"<html><head><title>Popup</title></head><body>\
          <button id=\"ask\" onclick=\"window.answer = confirm('Sure?')\">Ask</button>\
          <a id=\"next\" href=\"/next\">Next</a></body></html>"
            .to_vec(),
    );
    pages.insert(
        "/next".to_string(),
        b"<html><head><title>Next</title></head><body><script>alert('on load')</script><p>Next</p></body></html>"
            .to_vec(),
    );
    let server = Server::start(Content::Memory(pages)).await?;
    let mut b = ChromiumBrowser::launch(ChromiumConfig::new(Origins::new(&[server.origin()])?)).await?;
    b.navigate(&server.url("/")).await?;
    let obs = b.observe().await?;
    b.act(&Action::Click {
        id: obs.by_html_id("open").expect("open").id,
    })
    .await?;
    b.act(&Action::Wait { ms: 500 }).await?;
    b.act(&Action::SwitchTab { index: 1 }).await?;
    let obs = b.observe().await?;
    assert_eq!(obs.title, "Popup");
    b.act(&Action::Click {
        id: obs.by_html_id("ask").expect("ask").id,
    })
    .await?;
    assert_eq!(b.eval("window.answer").await?, serde_json::json!(false));
    assert_eq!(
        b.eval("window.__kameraDialogs").await?,
        serde_json::json!(1),
        "the hook answered"
    );
    b.act(&Action::SwitchTab { index: 0 }).await?;
    assert_eq!(b.observe().await?.title, "Home");
    b.close().await?;
    Ok(())
}

/// An action waits for the navigation it started (a script's, a form's, by click or Enter) and
/// for nothing else: a click that changes no page returns at once (it waited a fixed 1.5 s
/// before the navigation events were watched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_waits_for_the_navigation_it_started_and_no_longer() -> anyhow::Result<()> {
    require_chromium();
    let mut pages = std::collections::BTreeMap::new();
    pages.insert(
        "/".to_string(),
        b"<html><head><title>Start</title></head><body>\
          <button id=\"stay\" onclick=\"document.title='stayed'\">Stay</button>\
          <button id=\"go\" onclick=\"location.href='/two'\">Go</button>\
          <a id=\"frag\" href=\"#below\">Below</a>\
          <form action=\"/two\" method=\"get\"><input id=\"q\" name=\"q\"><button id=\"send\">Search</button></form>\
          <p id=\"below\">Below</p></body></html>"
            .to_vec(),
    );
    pages.insert(
        "/two".to_string(),
        b"<html><head><title>Two</title></head><body><p>The second page</p></body></html>".to_vec(),
    );
    let server = Server::start(Content::Memory(pages)).await?;
    let mut b = ChromiumBrowser::launch(ChromiumConfig::new(Origins::new(&[server.origin()])?)).await?;
    let home = server.url("/");
    async fn start(b: &mut ChromiumBrowser, home: &str) -> kamera_browser::Result<kamera_browser::Observation> {
        b.navigate(home).await?;
        b.observe_text().await
    }
    let obs = start(&mut b, &home).await?;
    assert!(obs.screenshot_png.is_empty(), "observe_text takes no screenshot");
    let id = |obs: &kamera_browser::Observation, html: &str| obs.by_html_id(html).expect(html).id;

    // No navigation: done at once (a generous bound for a loaded 2-core host; 1.5 s before).
    for html in ["stay", "frag"] {
        let t0 = std::time::Instant::now();
        b.act(&Action::Click { id: id(&obs, html) }).await?;
        let took = t0.elapsed();
        assert!(took < std::time::Duration::from_millis(800), "#{html}: {took:?}");
    }
    assert_eq!(b.eval("document.title").await?, serde_json::json!("stayed"));
    assert_eq!(b.eval("location.hash").await?, serde_json::json!("#below"));

    // A script's navigation, a form sent by its button and by Enter: the next page is in.
    let obs = start(&mut b, &home).await?;
    b.act(&Action::Click { id: id(&obs, "go") }).await?;
    assert_eq!(b.observe_text().await?.title, "Two");
    let obs = start(&mut b, &home).await?;
    b.act(&Action::Click { id: id(&obs, "send") }).await?;
    assert_eq!(b.observe_text().await?.title, "Two");
    let obs = start(&mut b, &home).await?;
    b.act(&Action::Type {
        id: Some(id(&obs, "q")),
        text: "abc".into(),
    })
    .await?;
    b.act(&Action::Key { key: "Enter".into() }).await?;
    let obs = b.observe().await?;
    assert_eq!(obs.title, "Two");
    assert!(obs.url.ends_with("/two?q=abc"), "{}", obs.url);
    assert!(obs.screenshot_png.starts_with(b"\x89PNG"));
    b.close().await?;
    Ok(())
}

/// Back returns to the page before once it is in, whether Chromium loads it again or restores it
/// from its back/forward cache, and waits for no more than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_returns_once_the_page_before_is_in() -> anyhow::Result<()> {
    require_chromium();
    let page = |title: &str, body: &str| {
        format!("<html><head><title>{title}</title></head><body>{body}</body></html>").into_bytes()
    };
    let next = |to: &str| format!("<a id=\"next\" href=\"{to}\">Next</a>");
    let pages = std::collections::BTreeMap::from([
        ("/".to_string(), page("One", &next("/two"))),
        ("/two".to_string(), page("Two", &next("/three"))),
        ("/three".to_string(), page("Three", "<p>The end</p>")),
    ]);
    let server = Server::start(Content::Memory(pages)).await?;
    let mut b = ChromiumBrowser::launch(ChromiumConfig::new(Origins::new(&[server.origin()])?)).await?;
    b.navigate(&server.url("/")).await?;
    for title in ["One", "Two"] {
        let obs = b.observe_text().await?;
        assert_eq!(obs.title, title);
        b.act(&Action::Click {
            id: obs.by_html_id("next").expect("next").id,
        })
        .await?;
    }
    assert_eq!(b.observe_text().await?.title, "Three");
    for title in ["Two", "One"] {
        let t0 = std::time::Instant::now();
        b.act(&Action::Back).await?;
        let took = t0.elapsed();
        eprintln!("back to {title}: {took:?}");
        assert_eq!(b.observe_text().await?.title, title);
        assert!(
            took < std::time::Duration::from_millis(800),
            "back to {title}: {took:?}"
        );
    }
    b.close().await?;
    Ok(())
}
