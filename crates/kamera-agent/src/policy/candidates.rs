//! The page's actions as the model ranks them: each valid action written in words, with its
//! element described by kind, text and the label beside it (`click button "Submit" [3]`,
//! `type "keli" into text field near "Username" [1]`), and the texts a `type` may carry taken
//! from the task (its quoted strings, as written and in upper and lower case) and from what the
//! model writes itself. Describing the target in the candidate lets the model's
//! likelihood match the goal's words against the element's, instead of guessing at a number.

use kamera_browser::{Action, Element, Observation};

/// Most characters of a label taken from the line before an element.
const MAX_LABEL_CHARS: usize = 40;

/// One action the page allows, and how the model reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub action: Action,
    pub text: String,
}

/// The quoted strings of `goal` (straight or curly double quotes) in order, each trimmed and
/// with the text before it (back to the quote before); an unclosed quote opens no string.
pub fn goal_quotes(goal: &str) -> Vec<(String, String)> {
    let norm = goal.replace(['\u{201c}', '\u{201d}'], "\"");
    let parts: Vec<&str> = norm.split('"').collect();
    // Odd parts are quoted, but the last part after an unclosed quote is not.
    (1..parts.len().saturating_sub(1))
        .step_by(2)
        .map(|i| (parts[i - 1].to_string(), parts[i].trim().to_string()))
        .collect()
}

/// The quoted strings of `goal` ([`goal_quotes`]), each as written and, where they differ, in
/// upper and lower case, without repeats.
pub fn goal_spans(goal: &str) -> Vec<String> {
    let mut spans: Vec<String> = Vec::new();
    for (_, s) in goal_quotes(goal) {
        if !s.is_empty() && s.chars().count() <= crate::schema::MAX_FREE_CHARS {
            for v in [s.clone(), s.to_uppercase(), s.to_lowercase()] {
                if !spans.contains(&v) {
                    spans.push(v);
                }
            }
        }
    }
    spans
}

/// Whether `e` is a radio button (its line in the page text says `input type=radio`, or its
/// ARIA role does).
fn radio(e: &Element, obs: &Observation) -> bool {
    let marker = format!("[{}] input type=radio ", e.id);
    e.role == "radio" || obs.text.lines().any(|l| l.trim_start().starts_with(&marker))
}

/// What kind of element `e` is, in words.
fn kind<'e>(e: &'e Element, obs: &Observation) -> &'e str {
    if radio(e, obs) {
        return "radio button";
    }
    if !e.role.is_empty() && e.role != e.tag {
        return &e.role;
    }
    match e.tag.as_str() {
        "a" => "link",
        "select" => "list",
        "textarea" => "textarea",
        "input" if e.checked.is_some() => "checkbox",
        "input" if e.editable => "text field",
        "input" => "input",
        t => t,
    }
}

/// The short text line just before `e`'s line in the page text (a field's label), if any.
pub fn label(e: &Element, obs: &Observation) -> Option<String> {
    let marker = format!("[{}] ", e.id);
    let mut prev: Option<&str> = None;
    for line in obs.text.lines().map(str::trim) {
        if line.starts_with(&marker) {
            let prev = prev?;
            return (!prev.starts_with('[') && prev.chars().count() <= MAX_LABEL_CHARS).then(|| prev.replace('"', "'"));
        }
        if !line.is_empty() {
            prev = Some(line);
        }
    }
    None
}

/// `e` in words: kind, text in quotes, or the label beside it when it has no text of its own
/// (a line before a button with text is as often unrelated as not).
pub fn describe(e: &Element, obs: &Observation) -> String {
    let text = e.text.replace('"', "'");
    let mut d = kind(e, obs).to_string();
    if !text.is_empty() {
        d.push_str(&format!(" \"{text}\""));
    } else if let Some(l) = label(e, obs) {
        d.push_str(&format!(" near \"{l}\""));
    }
    if e.checked == Some(true) {
        d.push_str(" (checked)");
    }
    d
}

/// Whether `e` is a link to the page it is on (a menu entry of the current page): following it
/// only reloads the page, and clears what its form holds.
fn links_here(e: &Element, obs: &Observation) -> bool {
    let path = obs
        .url
        .split_once("://")
        .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
        .unwrap_or("/");
    e.tag == "a" && !e.href.is_empty() && (e.href == obs.url || (e.href.starts_with('/') && e.href == path))
}

/// Every action the model may rank on `obs`: click and select on each interactive element; each
/// of `texts` typed into each editable one (unless it already holds it); press Enter. A link to
/// the page itself is not offered. On a page
/// that lists nothing to act on (a dead end: "Not found"), go back alone. (An answer is
/// written, not chosen: the policy offers it as a kind of action.)
pub fn candidates(obs: &Observation, texts: &[String]) -> Vec<Candidate> {
    let mut out = Vec::new();
    if obs.interactive().next().is_none() {
        // Nothing to act on, nothing to press Enter in: the way on is back.
        out.push(Candidate {
            action: Action::Back,
            text: "go back".into(),
        });
        return out;
    }
    let mut push = |action: Action, text: String| out.push(Candidate { action, text });
    for e in obs.interactive().filter(|e| !links_here(e, obs)) {
        let d = describe(e, obs);
        let id = e.id;
        // A checkbox or radio button is clicked like anything else (a click toggles it; its
        // description says whether it is checked): one verb for all, which a small model
        // ranks better than `check` against `click` (and than `select` for a radio button:
        // Qwen2.5-0.5B ranks `click` first on click-option's "Select S4 and click Submit").
        push(Action::Click { id }, format!("click {d} [{id}]"));
        if e.editable {
            for t in texts.iter().filter(|t| **t != e.text) {
                let action = Action::Type {
                    id: Some(id),
                    text: t.clone(),
                };
                push(action, format!("type \"{t}\" into {d} [{id}]"));
            }
        }
        for o in &e.options {
            let action = Action::Select { id, option: o.clone() };
            push(action, format!("select \"{}\" in {d} [{id}]", o.replace('"', "'")));
        }
    }
    push(Action::Key { key: "Enter".into() }, "press Enter".into());
    out
}

/// The ids of `obs`'s interactive elements that `prev` (the page of the action before, at
/// `prev_url`) had too, with the same tag, text and link target, when `obs` is at another URL:
/// what a followed link carried over (the site's menu, its footer). Empty when the URL is the
/// same (a page that changed in place, as every MiniWoB++ task does, carries nothing over).
pub fn carried_over(prev_url: &str, prev: &[Element], obs: &Observation) -> Vec<u32> {
    if prev_url == obs.url {
        return Vec::new();
    }
    obs.interactive()
        .filter(|e| {
            prev.iter()
                .any(|p| p.tag == e.tag && p.text == e.text && p.href == e.href)
        })
        .map(|e| e.id)
        .collect()
}

/// The element `action` acts on, if any.
fn target(action: &Action) -> Option<u32> {
    match action {
        Action::Click { id } | Action::Select { id, .. } | Action::Type { id: Some(id), .. } => Some(*id),
        _ => None,
    }
}

/// `cands` less the actions on `carried` elements, where an action on an element of the page's
/// own is left: a link was followed for what the new page adds, and going back through the
/// menu it carried over (most often to the page just left) undoes that step. A page with
/// nothing of its own keeps every action.
pub fn page_own_first(cands: Vec<Candidate>, carried: &[u32]) -> Vec<Candidate> {
    let carried_target = |c: &Candidate| target(&c.action).is_some_and(|id| carried.contains(&id));
    let own = |c: &Candidate| target(&c.action).is_some() && !carried_target(c);
    if cands.iter().any(own) {
        cands.into_iter().filter(|c| !carried_target(c)).collect()
    } else {
        cands
    }
}

/// An action in the words of [`candidates`], for the history of what was done (`obs` is the
/// page it was taken on).
pub fn words(action: &Action, obs: &Observation) -> String {
    let el = |id: u32| {
        obs.element(id)
            .map_or_else(|| format!("[{id}]"), |e| format!("{} [{id}]", describe(e, obs)))
    };
    match action {
        Action::Click { id } => format!("click {}", el(*id)),
        Action::Check { id } => format!("check {}", el(*id)),
        Action::Uncheck { id } => format!("uncheck {}", el(*id)),
        Action::Type { id: Some(id), text } => format!("type \"{text}\" into {}", el(*id)),
        Action::Select { id, option } => format!("select \"{option}\" in {}", el(*id)),
        Action::Key { key } => format!("press {key}"),
        Action::Done { answer } => format!("answer \"{answer}\""),
        Action::Back => "go back".into(),
        other => other.label(),
    }
}

/// A page of the local site's layout at `url` for tests: its two menu links (`Home` [1],
/// `Orders` [2]), then `own` links (text, href) from [3].
#[cfg(test)]
pub fn site_page(url: &str, own: &[(&str, &str)]) -> Observation {
    let mut els = vec![
        serde_json::json!({"id": 1, "tag": "a", "text": "Home", "href": "/", "x": 1.0, "y": 1.0}),
        serde_json::json!({"id": 2, "tag": "a", "text": "Orders", "href": "/orders", "x": 2.0, "y": 1.0}),
    ];
    for (i, (text, href)) in own.iter().enumerate() {
        els.push(serde_json::json!({"id": 3 + i, "tag": "a", "text": text, "href": href, "x": 1.0, "y": 5.0}));
    }
    serde_json::from_value(serde_json::json!({"url": url, "title": "t", "text": "", "elements": els}))
        .expect("observation")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login_page(user_value: &str) -> Observation {
        serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1/miniwob/login-user.html", "title": "Login",
            "text": format!("Enter the username \"keli\" and the password \"3hI\" and press login.\nUsername\n[1] input type=text \"{user_value}\"\nPassword\n[2] input type=password \"\"\n[3] button \"Login\""),
            "elements": [
                {"id": 1, "tag": "input", "text": user_value, "editable": true, "x": 1.0, "y": 1.0},
                {"id": 2, "tag": "input", "text": "", "editable": true, "x": 1.0, "y": 2.0},
                {"id": 3, "tag": "button", "text": "Login", "x": 1.0, "y": 3.0}
            ]
        }))
        .expect("observation")
    }

    /// Quoted strings come out as written and in both cases, once each; unquoted text does not.
    #[test]
    fn goal_spans_are_the_quoted_strings_in_each_case() {
        assert_eq!(
            goal_spans("Enter the username \"keli\" and the password \"3hI\" into the fields."),
            ["keli", "KELI", "3hI", "3HI", "3hi"]
        );
        assert_eq!(goal_spans("Type \u{201c}Ab\u{201d} please"), ["Ab", "AB", "ab"]);
        assert!(goal_spans("Click the button.").is_empty());
        assert!(goal_spans("an \"unclosed quote").is_empty());
    }

    /// A radio button is described as one, a checkbox as one; both are clicked.
    #[test]
    fn radio_buttons_are_told_from_checkboxes() {
        let obs: Observation = serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1/miniwob/click-option.html", "title": "Click Option",
            "text": "Select S4 and click Submit.\n[1] input type=radio \"3hIU\"\n[2] input type=radio \"S4\"\n[3] input type=checkbox \"ok\"\n[4] button \"Submit\"",
            "elements": [
                {"id": 1, "tag": "input", "text": "3hIU", "checked": false, "x": 1.0, "y": 1.0},
                {"id": 2, "tag": "input", "text": "S4", "checked": true, "x": 1.0, "y": 2.0},
                {"id": 3, "tag": "input", "text": "ok", "checked": false, "x": 1.0, "y": 3.0},
                {"id": 4, "tag": "button", "text": "Submit", "x": 1.0, "y": 4.0}
            ]
        }))
        .expect("observation");
        let texts: Vec<String> = candidates(&obs, &[]).into_iter().map(|c| c.text).collect();
        assert_eq!(
            texts,
            [
                "click radio button \"3hIU\" [1]",
                "click radio button \"S4\" (checked) [2]",
                "click checkbox \"ok\" [3]",
                "click button \"Submit\" [4]",
                "press Enter"
            ]
        );
        assert_eq!(words(&Action::Click { id: 1 }, &obs), "click radio button \"3hIU\" [1]");
    }

    /// A page reached by a link: the menu it shares with the page before is carried over, and
    /// its own link is ranked alone; on the same URL nothing is carried over; a page with only
    /// the menu keeps it.
    #[test]
    fn a_followed_link_ranks_the_new_pages_own_elements() {
        let page = site_page;
        let list = page("http://s/orders", &[("View A-1", "/orders/A-1")]);
        let order = page("http://s/orders/A-1", &[("Track this shipment", "/shipping")]);
        let prev: Vec<Element> = list.interactive().cloned().collect();
        assert_eq!(carried_over(&list.url, &prev, &order), [1, 2]);
        assert!(carried_over(&order.url, &prev, &order).is_empty(), "same URL");
        let texts: Vec<String> = page_own_first(candidates(&order, &[]), &[1, 2])
            .into_iter()
            .map(|c| c.text)
            .collect();
        assert_eq!(texts, ["click link \"Track this shipment\" [3]", "press Enter"]);
        let status = page("http://s/shipping/T-1", &[]);
        let carried = carried_over(&order.url, &order.interactive().cloned().collect::<Vec<_>>(), &status);
        assert_eq!(carried, [1, 2]);
        assert_eq!(
            page_own_first(candidates(&status, &[]), &carried).len(),
            3,
            "only the menu: kept"
        );
    }

    /// A link to the current page (by path or whole URL) is not offered; others are.
    #[test]
    fn a_link_to_the_page_itself_is_not_offered() {
        let obs: Observation = serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1:8080/shipping", "title": "t", "text": "",
            "elements": [
                {"id": 1, "tag": "a", "text": "Orders", "href": "/orders", "x": 1.0, "y": 1.0},
                {"id": 2, "tag": "a", "text": "Shipping status", "href": "/shipping", "x": 2.0, "y": 1.0},
                {"id": 3, "tag": "a", "text": "Again", "href": "http://127.0.0.1:8080/shipping", "x": 3.0, "y": 1.0},
                {"id": 4, "tag": "a", "text": "Top", "href": "#top", "x": 4.0, "y": 1.0}
            ]
        }))
        .expect("observation");
        let ids: Vec<Action> = candidates(&obs, &[]).into_iter().map(|c| c.action).collect();
        assert_eq!(
            ids,
            [
                Action::Click { id: 1 },
                Action::Click { id: 4 },
                Action::Key { key: "Enter".into() }
            ]
        );
    }

    /// A page that lists nothing to act on (a dead end) offers going back alone.
    #[test]
    fn a_dead_end_offers_going_back() {
        let obs: Observation = serde_json::from_value(serde_json::json!({
            "url": "http://s/shipping/A-1", "title": "", "text": "# Not found", "elements": []
        }))
        .expect("observation");
        let cands = candidates(&obs, &[]);
        let texts: Vec<&str> = cands.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, ["go back"]);
        assert_eq!(cands[0].action, Action::Back);
        assert_eq!(words(&Action::Back, &obs), "go back");
        assert!(super::super::valid(&obs, &Action::Back));
    }

    /// Fields are described by the label line before them; buttons by their text.
    #[test]
    fn elements_are_described_by_kind_text_and_label() {
        let obs = login_page("");
        let d: Vec<String> = obs.interactive().map(|e| describe(e, &obs)).collect();
        assert_eq!(
            d,
            [
                "text field near \"Username\"",
                "text field near \"Password\"",
                "button \"Login\""
            ]
        );
    }

    /// Every candidate is a valid action of the page; a field that already holds a text is not
    /// offered it again.
    #[test]
    fn candidates_are_valid_and_skip_texts_already_typed() {
        let spans = goal_spans("the username \"keli\"");
        let obs = login_page("keli");
        let cands = candidates(&obs, &spans);
        for c in &cands {
            assert!(super::super::valid(&obs, &c.action), "{c:?}");
        }
        let texts: Vec<&str> = cands.iter().map(|c| c.text.as_str()).collect();
        assert!(texts.contains(&"type \"keli\" into text field near \"Password\" [2]"));
        assert!(texts.contains(&"click button \"Login\" [3]"));
        assert!(!cands.iter().any(|c| c.action
            == Action::Type {
                id: Some(1),
                text: "keli".into()
            }));
        assert_eq!(
            words(
                &Action::Type {
                    id: Some(2),
                    text: "3hI".into()
                },
                &obs
            ),
            "type \"3hI\" into text field near \"Password\" [2]"
        );
    }
}
