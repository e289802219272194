//! Every action on real Chromium: clickable non-link elements and text targets in observations,
//! select, check/uncheck, hover, drag, scroll into view, switch tab, wait for a target, and a
//! clear error for a missing, hidden or unsuitable target.

use kamera_browser::{Action, Browser, ChromiumBrowser, ChromiumConfig, Content, Error, Observation, Origins, Server};

const PAGE: &str = r#"<html><head><title>Actions</title>
<style>.lnk { cursor: pointer; color: blue; } #src, #dst { width: 80px; height: 40px; margin: 8px; }</style>
</head><body>
<p id="q">Pick the word <span class="lnk" id="w1">ipsum</span> or <span class="lnk" id="w2">dolor</span> now.</p>
<div id="tabbable" tabindex="0">Focusable box</div>
<div role="tab" id="tab2">Second tab</div>
<div id="handled">Handled box</div>
<p id="plain">Just some words</p>
<input id="name" placeholder="Name">
<select id="sel"><option>Alice</option><option value="b">Bob</option><option>Carol</option></select>
<label><input type="checkbox" id="cb">Remember me</label>
<label><input type="radio" name="r" id="r1">Red</label>
<div id="hv" style="width: 90px">Hover here</div>
<div id="src">Source</div><div id="dst">Target</div>
<button id="gone">Gone soon</button> <button id="ghost">Ghost soon</button>
<button id="later" onclick="setTimeout(() => { const p = document.createElement('p'); p.textContent = 'Appeared late'; document.body.appendChild(p); }, 300)">Later</button>
<a href="/two" target="_blank" id="newtab">Open two</a>
<div style="height: 2400px"></div><button id="far">Far away</button>
<script>
window.log = [];
document.getElementById('handled').addEventListener('click', () => log.push('handled'));
document.getElementById('w1').addEventListener('click', () => log.push('ipsum'));
document.getElementById('sel').addEventListener('change', (e) => log.push('change:' + e.target.value));
document.getElementById('hv').addEventListener('mouseenter', () => log.push('hover'));
document.getElementById('src').addEventListener('mousedown', () => { window.dragging = true; });
document.addEventListener('mousemove', (e) => { if (window.dragging && e.buttons === 1) window.moves = (window.moves || 0) + 1; });
document.addEventListener('mouseup', (e) => { if (window.dragging) log.push('drop:' + document.elementFromPoint(e.clientX, e.clientY).id); window.dragging = false; });
</script></body></html>"#;

fn id(obs: &Observation, html_id: &str) -> u32 {
    obs.by_html_id(html_id)
        .unwrap_or_else(|| panic!("no #{html_id} in {:#?}", obs.elements))
        .id
}

async fn log(b: &mut ChromiumBrowser) -> anyhow::Result<Vec<String>> {
    Ok(serde_json::from_value(b.eval("window.log").await?)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Long: one Chromium session walks every action kind in turn (a test per action would launch a browser each).
async fn every_action_on_real_chromium() -> anyhow::Result<()> {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "chromium missing: run scripts/install-chromium.sh"
    );
    let mut pages = std::collections::BTreeMap::new();
    pages.insert("/".to_string(), PAGE.as_bytes().to_vec());
    pages.insert(
        "/two".to_string(),
        b"<html><head><title>Two</title></head><body><p>The second page</p></body></html>".to_vec(),
    );
    let server = Server::start(Content::Memory(pages)).await?;
    let mut b = ChromiumBrowser::launch(ChromiumConfig::new(Origins::new(&[server.origin()])?)).await?;
    b.navigate(&server.url("/")).await?;
    let obs = b.observe().await?;

    // Clickable non-links are listed with ids: pointer cursor, tabindex, ARIA role, click listener.
    for (html_id, line) in [
        ("w1", "span \"ipsum\""),
        ("tabbable", "div \"Focusable box\""),
        ("tab2", "div role=tab \"Second tab\""),
        ("handled", "div \"Handled box\""),
        ("sel", "select \"Alice\" options: Alice | Bob | Carol"),
        ("cb", "input type=checkbox \"Remember me\""),
    ] {
        let e = id(&obs, html_id);
        assert!(
            obs.text.contains(&format!("[{e}] {line}")),
            "#{html_id}: {line} not in\n{}",
            obs.text
        );
    }
    // Element state the model's action schema is built from.
    let el = |h: &str| obs.by_html_id(h).unwrap_or_else(|| panic!("#{h}"));
    assert_eq!(el("cb").checked, Some(false));
    assert_eq!(el("sel").options, ["Alice", "Bob", "Carol"]);
    assert!(el("name").editable && !el("cb").editable && !el("w1").editable);
    // A plain paragraph is not listed, but a text target finds it; a listed element wins a tie.
    let plain = obs.by_text("Just some words").expect("text target on a paragraph");
    assert!(!plain.interactive && plain.html_id == "plain", "{plain:?}");
    assert!(!obs.text.contains(&format!("[{}]", plain.id)), "{}", obs.text);
    assert_eq!(obs.by_text("ipsum").map(|e| e.html_id.as_str()), Some("w1"));

    b.act(&Action::Click { id: id(&obs, "w1") }).await?;
    b.act(&Action::Click {
        id: id(&obs, "handled"),
    })
    .await?;
    assert_eq!(log(&mut b).await?, ["ipsum", "handled"]);

    // Select by text, by value, any case; an unknown option names the options.
    let sel = id(&obs, "sel");
    b.act(&Action::Select {
        id: sel,
        option: "carol".into(),
    })
    .await?;
    assert_eq!(b.eval("document.getElementById('sel').value").await?, "Carol");
    b.act(&Action::Select {
        id: sel,
        option: "b".into(),
    })
    .await?;
    assert_eq!(b.eval("document.getElementById('sel').value").await?, "b");
    let e = b
        .act(&Action::Select {
            id: sel,
            option: "Zed".into(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Target { .. }) && e.to_string().contains("\"Bob\""),
        "{e}"
    );
    let e = b
        .act(&Action::Select {
            id: id(&obs, "handled"),
            option: "Bob".into(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Target { .. }) && e.to_string().contains("not a select"),
        "{e}"
    );

    // Check and uncheck (idempotent), through the checkbox or its label text; radios do not uncheck.
    let cb = id(&obs, "cb");
    let checked = "document.getElementById('cb').checked";
    b.act(&Action::Check { id: cb }).await?;
    assert_eq!(b.eval(checked).await?, true);
    b.act(&Action::Check { id: cb }).await?;
    assert_eq!(b.eval(checked).await?, true);
    b.act(&Action::Uncheck { id: cb }).await?;
    assert_eq!(b.eval(checked).await?, false);
    let label = obs.by_text("Remember me").expect("label text").id;
    assert_eq!(label, cb, "the checkbox (listed) matches its label's text first");
    let r1 = id(&obs, "r1");
    b.act(&Action::Check { id: r1 }).await?;
    assert_eq!(b.eval("document.getElementById('r1').checked").await?, true);
    let e = b.act(&Action::Uncheck { id: r1 }).await.unwrap_err();
    assert!(
        matches!(e, Error::Target { .. }) && e.to_string().contains("radio"),
        "{e}"
    );
    let e = b.act(&Action::Check { id: id(&obs, "far") }).await.unwrap_err();
    assert!(matches!(e, Error::Target { .. }), "{e}");

    // Hover (an unlisted element, by text) and drag (press on one, release on the other).
    let hv = obs.by_text("Hover here").expect("hover target").id;
    b.act(&Action::Hover { id: hv }).await?;
    let (src, dst) = (obs.by_text("Source").unwrap().id, obs.by_text("Target").unwrap().id);
    b.act(&Action::Drag { from: src, to: dst }).await?;
    assert_eq!(
        log(&mut b).await?[2..],
        ["change:Carol", "change:b", "hover", "drop:dst"]
    );
    assert!(
        b.eval("window.moves").await?.as_u64().unwrap_or(0) >= 4,
        "moves with the button held"
    );

    // Scroll into view.
    let far = id(&obs, "far");
    b.act(&Action::ScrollTo { id: far }).await?;
    let top = b
        .eval("document.getElementById('far').getBoundingClientRect().top")
        .await?;
    assert!((0.0..600.0).contains(&top.as_f64().unwrap_or(-1.0)), "far at {top}");

    // Wait for a target: one that appears, one that never does (a clear error, bounded).
    b.act(&Action::Click { id: id(&obs, "later") }).await?;
    b.act(&Action::WaitFor {
        target: "text:Appeared late".into(),
        ms: 3000,
    })
    .await?;
    let t0 = std::time::Instant::now();
    let e = b
        .act(&Action::WaitFor {
            target: "#nothing".into(),
            ms: 300,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Target { .. }) && e.to_string().contains("#nothing"),
        "{e}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));

    // A target that vanished or was hidden since the observation is a clear error, not a crash.
    b.eval("document.getElementById('gone').remove(); document.getElementById('ghost').style.display = 'none'; 1")
        .await?;
    let e = b.act(&Action::Click { id: id(&obs, "gone") }).await.unwrap_err();
    assert!(matches!(e, Error::NoElement { .. }), "{e}");
    for a in [
        Action::Click { id: id(&obs, "ghost") },
        Action::Hover { id: id(&obs, "ghost") },
        Action::Type {
            id: Some(id(&obs, "ghost")),
            text: "x".into(),
        },
        Action::Drag {
            from: id(&obs, "ghost"),
            to: dst,
        },
        Action::ScrollTo { id: id(&obs, "ghost") },
    ] {
        let e = b.act(&a).await.unwrap_err();
        assert!(
            matches!(e, Error::Target { .. }) && e.to_string().contains("not visible"),
            "{a:?}: {e}"
        );
    }
    let e = b.act(&Action::Check { id: 999 }).await.unwrap_err();
    assert!(matches!(e, Error::NoElement { .. }), "{e}");

    // Switch tab: a link with target=_blank opens tab 1; tab 7 does not exist.
    b.act(&Action::Click { id: id(&obs, "newtab") }).await?;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    b.act(&Action::SwitchTab { index: 1 }).await?;
    assert_eq!(b.observe().await?.title, "Two");
    let e = b.act(&Action::SwitchTab { index: 7 }).await.unwrap_err();
    assert!(
        matches!(e, Error::Target { .. }) && e.to_string().contains("no tab 7"),
        "{e}"
    );
    b.act(&Action::SwitchTab { index: 0 }).await?;
    assert_eq!(b.observe().await?.title, "Actions");
    b.close().await?;
    Ok(())
}
