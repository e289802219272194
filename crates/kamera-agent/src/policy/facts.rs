//! Facts: the `Label: value` lines of the pages an episode read (`Tracking number: TRK-51234`),
//! kept with the URL of the page each was read on. They are offered as texts to type on other
//! pages, and a field named like one of them (its placeholder or the label before it says
//! `Tracking number`) gets that value alone, as a browser's autofill matches a field's name.
//! The goal names values too (`the password "3hI"`, [`named`]): a field named so gets that one.

use kamera_browser::{Element, Observation};

use super::candidates::{goal_quotes, label};

/// Most characters of a fact's label and of its value.
const MAX_LABEL: usize = 30;
const MAX_VALUE: usize = 40;

/// Most facts of earlier pages offered as texts to type (the latest ones).
const MAX_OFFERED: usize = 6;

/// The `Label: value` lines of a page's text, as label and value: what a later page may ask to
/// have typed. Element lines (`[N] ...`), headings and lines whose label or value is long or
/// quoted are not facts; a value already seen is kept once.
pub fn labelled(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
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
        if short(label, MAX_LABEL)
            && short(value, MAX_VALUE)
            && plain(label)
            && plain(value)
            && label.starts_with(char::is_alphabetic)
            && !out.iter().any(|(_, v)| v == value)
        {
            out.push((label.to_string(), value.to_string()));
        }
    }
    out
}

/// The goal's named values: each quoted string ([`goal_quotes`]) whose preceding word may
/// name a field (`Enter the username "keli" and the password "3hI"` names `keli`
/// `username` and `3hI` `password`), as label and value. The word is taken as written; it
/// names a field only where a field is called so ([`Facts::for_field`]).
pub fn named(goal: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (before, value) in goal_quotes(goal) {
        let word = before
            .split_whitespace()
            .next_back()
            .map(|w| w.trim_end_matches(':'))
            .unwrap_or_default();
        if !value.is_empty()
            && value.chars().count() <= MAX_VALUE
            && word.chars().count() <= MAX_LABEL
            && !word.is_empty()
            && word.chars().all(char::is_alphabetic)
        {
            out.push((word.to_string(), value));
        }
    }
    out
}

/// One fact and the URL of the page it was read on.
#[derive(Debug, Clone)]
struct Fact {
    url: String,
    label: String,
    value: String,
}

/// The facts read off the pages of an episode, in order, and the values the goal names.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    read: Vec<Fact>,
    goal: Vec<(String, String)>,
}

impl Facts {
    /// Notes the values `goal` names ([`named`]), in place of any noted before.
    pub fn note_goal(&mut self, goal: &str) {
        self.goal = named(goal);
    }

    /// Notes the facts on `obs` (a value already noted is kept once, where first read).
    pub fn note(&mut self, obs: &Observation) {
        for (label, value) in labelled(&obs.text) {
            if !self.read.iter().any(|f| f.value == value) {
                self.read.push(Fact {
                    url: obs.url.clone(),
                    label,
                    value,
                });
            }
        }
    }

    /// The latest [`MAX_OFFERED`] values read on other pages than `obs`'s, oldest first.
    pub fn offered(&self, obs: &Observation) -> Vec<String> {
        let other: Vec<&Fact> = self.read.iter().filter(|f| f.url != obs.url).collect();
        other[other.len().saturating_sub(MAX_OFFERED)..]
            .iter()
            .map(|f| f.value.clone())
            .collect()
    }

    /// The value for field `e` of `obs`: the value the goal names by the field's name (its
    /// placeholder or shown text, else the label line before it), else the latest fact read on
    /// another page whose label is that name; names compared without case.
    pub fn for_field(&self, e: &Element, obs: &Observation) -> Option<&str> {
        if !e.editable {
            return None;
        }
        let names: Vec<String> = [Some(e.text.clone()), label(e, obs)]
            .into_iter()
            .flatten()
            .map(|n| n.trim().to_lowercase())
            .filter(|n| !n.is_empty())
            .collect();
        let called = |label: &str| names.contains(&label.to_lowercase());
        let goal = self.goal.iter().find(|(label, _)| called(label)).map(|(_, v)| v);
        let read = self.read.iter().rev().find(|f| f.url != obs.url && called(&f.label));
        goal.or(read.map(|f| &f.value)).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Label: value` lines give their label and value; element lines, headings, quoted or long
    /// ones do not.
    #[test]
    fn facts_are_the_label_lines() {
        let text = "[1] a \"Home\"\n# Order A-1041\nCustomer: Tomas Ek\nTracking number: TRK-51234\n\
                    Note: \"quoted\"\nA very long label that goes on and on and on: x\nTime: 3\nCustomer: Tomas Ek\n\
                    [7] a \"Track: this\"";
        let values: Vec<String> = labelled(text).into_iter().map(|(_, v)| v).collect();
        assert_eq!(values, ["Tomas Ek", "TRK-51234", "3"]);
        assert_eq!(labelled(text)[1].0, "Tracking number");
    }

    /// A quoted string after a word is named by it; after punctuation, a number or at the
    /// start it is not.
    #[test]
    fn the_goal_names_values_by_the_word_before_them() {
        assert_eq!(
            named("Enter the username \"keli\" and the password \u{201c}3hI\u{201d} and press login."),
            [("username".into(), "keli".into()), ("password".into(), "3hI".into())]
        );
        assert_eq!(named("Label: \"x\""), [("Label".to_string(), "x".to_string())]);
        assert!(named("\"x\" first, then (\"y\"), then 3 \"z\", then \"open").is_empty());
    }

    /// A field called as the goal names a value gets it, before a fact of another page.
    #[test]
    fn a_field_the_goal_names_gets_its_value() {
        let mut facts = Facts::default();
        facts.note(&page("http://s/a", "Password: old", serde_json::json!([])));
        facts.note_goal("Enter the username \"keli\" and the password \"3hI\" and press login.");
        let form = page(
            "http://s/login",
            "Username\n[1] input type=text \"\"\nPassword\n[2] input type=password \"\"\n[3] input type=text \"Email\"",
            serde_json::json!([field(1, ""), field(2, ""), field(3, "Email")]),
        );
        let el = |id: u32| form.element(id).expect("element");
        assert_eq!(facts.for_field(el(1), &form), Some("keli"));
        assert_eq!(facts.for_field(el(2), &form), Some("3hI"), "the goal's, not the page's");
        assert_eq!(facts.for_field(el(3), &form), None);
    }

    /// A text field `[id]` showing `text`, one line below the one before.
    fn field(id: u32, text: &str) -> serde_json::Value {
        serde_json::json!({"id": id, "tag": "input", "text": text, "editable": true, "x": 1.0, "y": f64::from(id)})
    }

    fn page(url: &str, text: &str, elements: serde_json::Value) -> Observation {
        serde_json::from_value(serde_json::json!({"url": url, "title": "t", "text": text, "elements": elements}))
            .expect("observation")
    }

    /// A field whose placeholder (or label line) is a fact's label read on another page gets
    /// that value; other fields, and facts of the same page, get none.
    #[test]
    fn a_field_named_like_a_fact_gets_its_value() {
        let mut facts = Facts::default();
        facts.note(&page(
            "http://s/orders/A-1",
            "# Order A-1\nCustomer: Tomas Ek\nTracking number: TRK-51234",
            serde_json::json!([]),
        ));
        let form = page(
            "http://s/shipping",
            "# Shipping status\n[1] input type=text \"Tracking number\"\nName\n[2] input type=text \"\"\n[3] button \"Track\"",
            serde_json::json!([
                field(1, "Tracking number"),
                field(2, ""),
                {"id": 3, "tag": "button", "text": "Track", "x": 1.0, "y": 3.0}
            ]),
        );
        let el = |id: u32| form.element(id).expect("element");
        assert_eq!(facts.for_field(el(1), &form), Some("TRK-51234"));
        assert_eq!(facts.for_field(el(2), &form), None, "labelled Name: no such fact");
        assert_eq!(facts.for_field(el(3), &form), None, "not a field");
        assert_eq!(facts.offered(&form), ["Tomas Ek", "TRK-51234"]);
        let same = page("http://s/orders/A-1", "", serde_json::json!([]));
        assert!(
            facts.offered(&same).is_empty(),
            "facts of this same page are not offered"
        );
    }
}
