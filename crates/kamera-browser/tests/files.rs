//! Files on real Chromium: an upload through a file input reaches the loopback server (exact
//! name and bytes) and the page shows its answer; a download lands in the run's folder with its
//! exact bytes and is listed; without a folder downloads are refused; an upload to an element
//! that is no file input, or of a missing file, is a clear error.

use std::collections::BTreeMap;
use std::path::Path;

use kamera_browser::{
    Action, Browser, BrowserOptions, ChromiumBrowser, ChromiumConfig, Content, Error, Observation, Origins, Server,
};

const FORM: &str = r#"<html><head><title>Send a file</title></head><body>
<form method="post" enctype="multipart/form-data" action="/upload">
<input type="text" name="note" id="note" value="hello">
<input type="file" name="f" id="f">
<label id="lab" for="f2">Attach here</label><input type="file" name="f2" id="f2" style="display:none">
<button id="send">Send</button>
</form>
<p id="plain">Nothing to upload here</p>
<a href="/report.csv" download id="dl">Download the report</a>
<script>window.changes = 0; document.getElementById('f').addEventListener('change', () => window.changes++);</script>
</body></html>"#;

const CSV: &[u8] = b"invoice,amount\nA-1042,19.99\nA-1043,5.00\n";

fn id(obs: &Observation, html_id: &str) -> u32 {
    obs.by_html_id(html_id)
        .unwrap_or_else(|| panic!("no #{html_id} in {:#?}", obs.elements))
        .id
}

async fn site() -> anyhow::Result<Server> {
    let mut pages = BTreeMap::new();
    pages.insert("/".to_string(), FORM.as_bytes().to_vec());
    pages.insert("/report.csv".to_string(), CSV.to_vec());
    Ok(Server::start(Content::Memory(pages)).await?)
}

async fn launch(server: &Server, downloads: Option<&Path>) -> anyhow::Result<ChromiumBrowser> {
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "chromium missing: run scripts/install-chromium.sh"
    );
    let mut cfg = ChromiumConfig::new(Origins::new(&[server.origin()])?);
    cfg.options = BrowserOptions {
        downloads: downloads.map(Path::to_path_buf),
        ..Default::default()
    };
    Ok(ChromiumBrowser::launch(cfg).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_reaches_the_server() -> anyhow::Result<()> {
    let server = site().await?;
    let dir = tempfile::tempdir()?;
    // Bytes a text-only path would mangle: CR LF, a boundary-like line, NUL, high bytes.
    let mut content = b"line one\r\n--not-a-boundary\r\n".to_vec();
    content.extend((0u8..=255).cycle().take(3000));
    let file = dir.path().join("évidence 1.bin");
    std::fs::write(&file, &content)?;

    let mut b = launch(&server, None).await?;
    b.navigate(&server.url("/")).await?;
    let obs = b.observe().await?;
    let f = id(&obs, "f");
    b.act(&Action::Upload {
        id: f,
        path: file.clone(),
    })
    .await?;
    assert_eq!(b.eval("window.changes").await?, 1, "the page saw no change event");
    assert_eq!(
        b.eval("document.getElementById('f').files[0].name").await?,
        "évidence 1.bin"
    );
    assert!(server.uploads().is_empty(), "nothing is posted before the form is sent");
    b.act(&Action::Click { id: id(&obs, "send") }).await?;

    let ups = server.uploads();
    assert_eq!(ups.len(), 1, "{ups:?}");
    assert_eq!(ups[0].path, "/upload");
    assert_eq!(ups[0].field, "f");
    assert_eq!(ups[0].filename, "évidence 1.bin");
    assert_eq!(ups[0].bytes, content.len());
    assert!(ups[0].content == content, "the server got other bytes");
    // The agent sees the server's answer.
    let after = b.observe().await?;
    assert!(after.url.ends_with("/upload"), "{}", after.url);
    assert!(
        after
            .text
            .contains(&format!("received évidence 1.bin ({} bytes)", content.len())),
        "{}",
        after.text
    );

    // Through a label for a hidden file input, the way styled upload buttons are built.
    b.navigate(&server.url("/")).await?;
    let obs = b.observe().await?;
    let small = dir.path().join("note.txt");
    std::fs::write(&small, b"hi")?;
    b.act(&Action::Upload {
        id: id(&obs, "lab"),
        path: small,
    })
    .await?;
    b.act(&Action::Click { id: id(&obs, "send") }).await?;
    let ups = server.uploads();
    assert_eq!(ups.len(), 2, "{ups:?}");
    assert_eq!(
        (ups[1].field.as_str(), ups[1].filename.as_str(), ups[1].bytes),
        ("f2", "note.txt", 2)
    );

    // Errors: an element that is no file input (named), a missing file (named), no such id.
    b.navigate(&server.url("/")).await?;
    let obs = b.observe().await?;
    let e = b
        .act(&Action::Upload {
            id: id(&obs, "send"),
            path: file.clone(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Target { .. })
            && e.to_string().contains("not a file input")
            && e.to_string().contains("Send"),
        "{e}"
    );
    let missing = dir.path().join("no-such.pdf");
    let e = b
        .act(&Action::Upload {
            id: f,
            path: missing.clone(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::File { path, .. } if *path == missing) && e.to_string().contains("no-such.pdf"),
        "{e}"
    );
    let e = b
        .act(&Action::Upload {
            id: 9999,
            path: file.clone(),
        })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoElement { id: 9999, .. }), "{e}");
    assert_eq!(b.eval("document.getElementById('f').files.length").await?, 0);
    assert_eq!(server.uploads().len(), 2);
    b.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_lands_in_the_folder() -> anyhow::Result<()> {
    let server = site().await?;
    let dir = tempfile::tempdir()?;
    let folder = dir.path().join("downloads");
    let mut b = launch(&server, Some(&folder)).await?;
    b.navigate(&server.url("/")).await?;
    let obs = b.observe().await?;
    let dl = id(&obs, "dl");
    b.act(&Action::Click { id: dl }).await?;
    let got = b.downloads();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].filename, "report.csv");
    assert_eq!(got[0].url, server.url("/report.csv"));
    assert_eq!(got[0].bytes, CSV.len() as u64);
    assert_eq!(got[0].path, std::path::absolute(folder.join("report.csv"))?);
    assert_eq!(std::fs::read(&got[0].path)?, CSV);
    assert_eq!(Browser::downloads(&b), got);
    // Again: a second file beside it, the first kept.
    b.act(&Action::Click { id: dl }).await?;
    let got = b.downloads();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[1].filename, "report (1).csv");
    assert_eq!(std::fs::read(&got[1].path)?, CSV);
    let mut names: Vec<String> = std::fs::read_dir(&folder)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    assert_eq!(names, ["report (1).csv", "report.csv"]);
    b.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_are_refused_without_a_folder() -> anyhow::Result<()> {
    let server = site().await?;
    let user_dl = std::env::var_os("HOME").map(|h| Path::new(&h).join("Downloads/report.csv"));
    let was = user_dl.as_ref().is_some_and(|p| p.exists());
    let mut b = launch(&server, None).await?;
    b.navigate(&server.url("/")).await?;
    let obs = b.observe().await?;
    b.act(&Action::Click { id: id(&obs, "dl") }).await?;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(b.downloads().is_empty());
    // Nothing in the profile, nor in the user's Downloads folder.
    let written = walk(b.profile_dir())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "csv" || e == "crdownload"))
        .collect::<Vec<_>>();
    assert!(written.is_empty(), "{written:?}");
    assert_eq!(user_dl.as_ref().is_some_and(|p| p.exists()), was, "{user_dl:?}");
    b.close().await?;
    Ok(())
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The server's answers to a POST that is not a file upload: a plain form is answered (nothing
/// recorded), a body over the bound is 413 without being read, a GET is as before.
#[tokio::test]
async fn the_server_answers_other_posts() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = site().await?;
    let ask = |req: String| {
        let addr = server.origin().trim_start_matches("http://").to_string();
        async move {
            let mut s = tokio::net::TcpStream::connect(addr).await?;
            s.write_all(req.as_bytes()).await?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await?;
            anyhow::Ok(String::from_utf8_lossy(&out).into_owned())
        }
    };
    let form = ask(
        "POST /search HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 7\r\n\r\nq=hello"
            .into(),
    )
    .await?;
    assert!(
        form.starts_with("HTTP/1.1 200") && form.contains("received a form of 7 bytes"),
        "{form}"
    );
    let big = ask(format!(
        "POST /upload HTTP/1.1\r\nContent-Type: multipart/form-data; boundary=x\r\nContent-Length: {}\r\n\r\n",
        kamera_browser::MAX_BODY + 1
    ))
    .await?;
    assert!(big.starts_with("HTTP/1.1 413"), "{big}");
    let none = ask("POST /upload HTTP/1.1\r\n\r\n".into()).await?;
    assert!(none.starts_with("HTTP/1.1 411"), "{none}");
    let get = ask("GET /report.csv HTTP/1.1\r\n\r\n".into()).await?;
    assert!(
        get.starts_with("HTTP/1.1 200") && get.contains("text/csv") && get.ends_with("A-1043,5.00\n"),
        "{get}"
    );
    assert!(server.uploads().is_empty());
    Ok(())
}
