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

/// The quoted strings of `goal` (straight or curly double quotes), each as written and, where
/// they differ, in upper and lower case, without repeats.
pub fn goal_spans(goal: &str) -> Vec<String> {
    let mut spans: Vec<String> = Vec::new();
    let norm = goal.replace(['\u{201c}', '\u{201d}'], "\"");
    let parts: Vec<&str> = norm.split('"').collect();
    // Odd parts are quoted, but the last part after an unclosed quote is not.
    for (i, part) in parts.iter().enumerate().take(parts.len().saturating_sub(1)) {
        let s = part.trim();
        if i % 2 == 1 && !s.is_empty() && s.chars().count() <= crate::schema::MAX_FREE_CHARS {
            for v in [s.to_string(), s.to_uppercase(), s.to_lowercase()] {
                if !spans.contains(&v) {
                    spans.push(v);
                }
            }
        }
    }
    spans
}

/// Most characters of a fact's label and of its value ([`facts`]).
const MAX_FACT_LABEL: usize = 30;
const MAX_FACT_VALUE: usize = 40;

/// The values of a page's `Label: value` lines (`Tracking number: TRK-51234` gives
/// `TRK-51234`): what a later page may ask to have typed. Element lines (`[N] ...`), headings
/// and lines whose label or value is long or quoted are not facts.
pub fn facts(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with(['[', '#']) {
            continue;
        }
        let Some((label, value)) = line.split_once(": ") else {
            continue;
        };
        let (label, value) = (label.trim(), value.trim());
        let short = |s: &str, n: usize| !s.is_empty() && s.chars().count() <= n;
        let plain = |s: &str| !s.contains(['"', '[', ']', '|']);
        if short(label, MAX_FACT_LABEL)
            && short(value, MAX_FACT_VALUE)
            && plain(label)
            && plain(value)
            && label.starts_with(char::is_alphabetic)
            && !out.iter().any(|v| v == value)
        {
            out.push(value.to_string());
        }
    }
    out
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
fn label(e: &Element, obs: &Observation) -> Option<String> {
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

/// Every action the model may rank on `obs`: click and select on each interactive element; each
/// of `texts` typed into each editable one (unless it already holds it); and press Enter. (An
/// answer is written, not chosen: the policy offers it as a kind of action.)
pub fn candidates(obs: &Observation, texts: &[String]) -> Vec<Candidate> {
    let mut out = Vec::new();
    let mut push = |action: Action, text: String| out.push(Candidate { action, text });
    for e in obs.interactive() {
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
        other => other.label(),
    }
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

    /// `Label: value` lines give their values; element lines, headings, quoted or long ones do not.
    #[test]
    fn facts_are_the_values_of_label_lines() {
        let text = "[1] a \"Home\"\n# Order A-1041\nCustomer: Tomas Ek\nTracking number: TRK-51234\n\
                    Note: \"quoted\"\nA very long label that goes on and on and on: x\nTime: 3\nCustomer: Tomas Ek\n\
                    [7] a \"Track: this\"";
        assert_eq!(facts(text), ["Tomas Ek", "TRK-51234", "3"]);
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
