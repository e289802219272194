//! Same-origin frames and open shadow roots on real Chromium: the observation walks into them
//! (ids unique across the page, positions in the top viewport, `text:` targets reach inside), a
//! form inside a frame is typed into and sent by id, a button in a shadow root is clicked by id,
//! by `text:` and by its observed position; a cross-origin frame is listed by origin, not entered.

use std::collections::{BTreeMap, BTreeSet};

use kamera_browser::{Action, Browser, ChromiumBrowser, ChromiumConfig, Content, Observation, Origins, Server};

const FORM: &str = r#"<html><body>
<form onsubmit="parent.log.push('submit:' + document.getElementById('name').value); return false;">
<input id="name" placeholder="Your name"> <button id="send" type="submit">Send</button></form>
<p>Inside the frame</p></body></html>"#;

fn page(other: &str) -> String {
    format!(
        r#"<html><head><title>Frames</title></head><body><h1>Shop</h1>
<iframe id="f" src="/form" style="width: 420px; height: 160px; border: 3px solid #888; margin-left: 30px"></iframe>
<shop-cart></shop-cart>
<iframe id="x" src="{other}/foreign" style="width: 300px; height: 80px"></iframe>
<script>
window.log = [];
customElements.define('shop-cart', class extends HTMLElement {{
  constructor() {{
    super();
    const r = this.attachShadow({{ mode: 'open' }});
    r.innerHTML = '<p>Cart: 2 items</p><button id="checkout">Checkout</button> <span id="note">Gift wrap</span>';
    r.getElementById('checkout').addEventListener('click', () => window.log.push('checkout'));
  }}
}});
</script></body></html>"#
    )
}

fn id(obs: &Observation, html_id: &str) -> u32 {
    obs.by_html_id(html_id)
        .unwrap_or_else(|| panic!("no #{html_id} in {}\n{:#?}", obs.text, obs.elements))
        .id
}

async fn log(b: &mut ChromiumBrowser) -> anyhow::Result<Vec<String>> {
    Ok(serde_json::from_value(b.eval("window.log").await?)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_and_shadow_roots_are_observed_and_acted_on() -> anyhow::Result<()> {
    let mut foreign = BTreeMap::new();
    foreign.insert(
        "/foreign".to_string(),
        b"<html><body><button id=\"foreign\">Foreign</button></body></html>".to_vec(),
    );
    let other = Server::start(Content::Memory(foreign)).await?;
    let mut pages = BTreeMap::new();
    pages.insert("/".to_string(), page(&other.origin()).into_bytes());
    pages.insert("/form".to_string(), FORM.as_bytes().to_vec());
    let site = Server::start(Content::Memory(pages)).await?;
    // Both origins allowed: the other frame loads, and is still not entered (cross-origin).
    let origins = Origins::new(&[site.origin(), other.origin()])?;
    let mut b = ChromiumBrowser::launch(ChromiumConfig::new(origins)).await?;
    b.navigate(&site.url("/")).await?;
    b.act(&Action::Wait { ms: 300 }).await?;
    let obs = b.observe().await?;
    eprintln!("{}", obs.text);

    let ids: Vec<u32> = obs.elements.iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), ids.iter().collect::<BTreeSet<_>>().len(), "ids are unique");
    let (name, send, checkout) = (id(&obs, "name"), id(&obs, "send"), id(&obs, "checkout"));
    assert!(
        obs.by_html_id("foreign").is_none(),
        "a cross-origin frame is not entered"
    );
    assert!(
        obs.text
            .contains(&format!("frame {} (cross-origin: not entered)", other.origin())),
        "a cross-origin frame is listed by origin:\n{}",
        obs.text
    );
    assert!(obs.text.contains("Cart: 2 items") && obs.text.contains("Inside the frame"));
    // `text:` targets reach into the frame and the shadow root.
    assert_eq!(obs.by_text("Checkout").map(|e| e.id), Some(checkout));
    assert_eq!(obs.by_text("Send").map(|e| e.id), Some(send));
    assert!(obs.by_text("Inside the frame").is_some_and(|e| !e.interactive));
    assert!(obs.by_text("Gift wrap").is_some());

    // A form in a frame, by id.
    b.act(&Action::Type {
        id: Some(name),
        text: "Ada".into(),
    })
    .await?;
    b.act(&Action::Click { id: send }).await?;
    assert_eq!(log(&mut b).await?, ["submit:Ada"]);

    // A button in a shadow root: by id, by `text:`, and at its observed position.
    b.act(&Action::Click { id: checkout }).await?;
    let obs = b.observe().await?;
    let by_text = obs.by_text("Checkout").expect("text:Checkout").id;
    b.act(&Action::Click { id: by_text }).await?;
    let obs = b.observe().await?;
    let at = obs.element(id(&obs, "checkout")).expect("checkout").clone();
    b.act(&Action::ClickXy { x: at.x, y: at.y }).await?;
    // The frame's input at its observed position (the frame is offset by margin and border).
    let obs = b.observe().await?;
    let input = obs.element(id(&obs, "name")).expect("name").clone();
    let hit = b
        .eval(&format!(
            "(() => {{ const f = document.elementFromPoint({}, {}); if (!f || f.id !== 'f') return 'missed the frame'; \
               const r = f.getBoundingClientRect(); \
               const e = f.contentDocument.elementFromPoint({} - r.left - f.clientLeft, {} - r.top - f.clientTop); \
               return e ? e.id : 'nothing'; }})()",
            input.x, input.y, input.x, input.y
        ))
        .await?;
    assert_eq!(
        hit,
        serde_json::json!("name"),
        "the observed position of an element in a frame"
    );
    assert_eq!(log(&mut b).await?, ["submit:Ada", "checkout", "checkout", "checkout"]);

    // wait_for reaches inside too.
    for target in ["#checkout", "text:Gift wrap", "#send", "text:Inside the frame"] {
        b.act(&Action::WaitFor {
            target: target.into(),
            ms: 500,
        })
        .await
        .map_err(|e| anyhow::anyhow!("wait_for {target}: {e}"))?;
    }
    b.close().await?;
    Ok(())
}
