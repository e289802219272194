//! Profiles and storage state on real Chromium: a login (a cookie and a localStorage token the
//! local site's script sets) survives a second launch with the same profile folder and not
//! without it; a Playwright storageState file is written at close and imported at launch.

use std::collections::BTreeMap;

use kamera_browser::{
    Browser, BrowserOptions, ChromiumBrowser, ChromiumConfig, Content, Origins, Server, StorageState,
};

/// `/login` logs in (a cookie kept an hour, a session cookie, a localStorage token); `/` shows.
async fn site() -> anyhow::Result<Server> {
    let mut pages = BTreeMap::new();
    pages.insert(
        "/login".to_string(),
        b"<html><body>logged in<script>document.cookie = 'sid=abc; Max-Age=3600; path=/'; \
          document.cookie = 'tab=1; path=/'; localStorage.setItem('token', 't1');</script></body></html>"
            .to_vec(),
    );
    pages.insert("/".to_string(), b"<html><body>home</body></html>".to_vec());
    Ok(Server::start(Content::Memory(pages)).await?)
}

async fn launch(server: &Server, options: BrowserOptions) -> anyhow::Result<ChromiumBrowser> {
    let mut cfg = ChromiumConfig::new(Origins::new(&[server.origin()])?);
    cfg.options = options;
    Ok(ChromiumBrowser::launch(cfg).await?)
}

/// `(document.cookie, localStorage token)` on the site's home page.
async fn logged_in(b: &mut ChromiumBrowser, server: &Server) -> anyhow::Result<(String, Option<String>)> {
    b.navigate(&server.url("/")).await?;
    let cookie = b.eval("document.cookie").await?.as_str().unwrap_or("").to_string();
    let token = b
        .eval("localStorage.getItem('token')")
        .await?
        .as_str()
        .map(String::from);
    Ok((cookie, token))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_survives_a_second_launch_with_the_same_profile() -> anyhow::Result<()> {
    let server = site().await?;
    let dir = tempfile::tempdir()?;
    let kept = BrowserOptions {
        profile: Some(dir.path().join("profiles/alice")),
        ..Default::default()
    };
    let mut b = launch(&server, kept.clone()).await?;
    assert_eq!(b.profile_dir(), dir.path().join("profiles/alice"));
    let second = launch(&server, kept.clone())
        .await
        .err()
        .expect("the profile is in use");
    assert!(second.to_string().contains("in use by another browser"), "{second}");
    b.navigate(&server.url("/login")).await?;
    b.close().await?;
    assert!(dir.path().join("profiles/alice/Default").is_dir());

    let mut b = launch(&server, kept).await?;
    let (cookie, token) = logged_in(&mut b, &server).await?;
    b.close().await?;
    eprintln!("same profile: cookie {cookie:?}, token {token:?}");
    assert!(cookie.contains("sid=abc"), "the login cookie is gone: {cookie:?}");
    assert_eq!(token.as_deref(), Some("t1"));

    let mut b = launch(&server, BrowserOptions::default()).await?;
    let temp = b.profile_dir().to_path_buf();
    let (cookie, token) = logged_in(&mut b, &server).await?;
    b.close().await?;
    drop(b);
    assert_eq!(cookie, "", "an isolated run starts with no cookie");
    assert_eq!(token, None, "an isolated run starts with no localStorage");
    assert!(!temp.exists(), "an isolated run's profile is removed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_state_is_written_at_close_and_imported_at_launch() -> anyhow::Result<()> {
    let server = site().await?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("state.json");
    let with_state = BrowserOptions {
        storage_state: Some(file.clone()),
        ..Default::default()
    };
    // No file yet: the run starts empty and writes one at close.
    let mut b = launch(&server, with_state.clone()).await?;
    b.navigate(&server.url("/login")).await?;
    b.close().await?;
    let mut state = StorageState::read(&file)?;
    eprintln!("{}", std::fs::read_to_string(&file)?);
    let sid = state
        .cookies
        .iter()
        .find(|c| c.name == "sid")
        .expect("the login cookie");
    assert_eq!(
        (sid.value.as_str(), sid.domain.as_str(), sid.path.as_str()),
        ("abc", "127.0.0.1", "/")
    );
    assert!(sid.expires > 0.0, "a cookie with Max-Age has an expiry");
    let tab = state
        .cookies
        .iter()
        .find(|c| c.name == "tab")
        .expect("the session cookie");
    assert_eq!(tab.expires, -1.0, "a session cookie is written with expires -1");
    assert_eq!(state.local_storage(&server.origin()).len(), 1);
    assert_eq!(state.local_storage(&server.origin())[0].value, "t1");

    // Edited by hand (as a Playwright user would): the next launch imports what the file says.
    state.origins[0].local_storage[0].value = "t2".into();
    state.cookies.retain(|c| c.name == "sid");
    state.write(&file)?;
    let mut b = launch(&server, with_state).await?;
    let (cookie, token) = logged_in(&mut b, &server).await?;
    b.close().await?;
    assert_eq!(cookie, "sid=abc");
    assert_eq!(token.as_deref(), Some("t2"));
    // And written back at its close, the same.
    let again = StorageState::read(&file)?;
    assert_eq!(again.origins, state.origins);
    assert_eq!(again.cookies.len(), 1);
    Ok(())
}
