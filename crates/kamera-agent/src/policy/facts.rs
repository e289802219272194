//! Facts: the `Label: value` lines of the pages an episode read (`Tracking number: TRK-51234`),
//! kept with the URL of the page each was read on. They are offered as texts to type on other
//! pages, and a field named like one of them (its placeholder or the label before it says
//! `Tracking number`) gets that value alone, as a browser's autofill matches a field's name.

use kamera_browser::{Element, Observation};

use super::candidates::label;

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

/// One fact and the URL of the page it was read on.
#[derive(Debug, Clone)]
struct Fact {
    url: String,
    label: String,
    value: String,
}

/// The facts read off the pages of an episode, in order.
#[derive(Debug, Clone, Default)]
pub struct Facts(Vec<Fact>);

impl Facts {
    /// Notes the facts on `obs` (a value already noted is kept once, where first read).
    pub fn note(&mut self, obs: &Observation) {
        for (label, value) in labelled(&obs.text) {
            if !self.0.iter().any(|f| f.value == value) {
                self.0.push(Fact {
                    url: obs.url.clone(),
                    label,
                    value,
                });
            }
        }
    }

    /// The latest [`MAX_OFFERED`] values read on other pages than `obs`'s, oldest first.
    pub fn offered(&self, obs: &Observation) -> Vec<String> {
        let other: Vec<&Fact> = self.0.iter().filter(|f| f.url != obs.url).collect();
        other[other.len().saturating_sub(MAX_OFFERED)..]
            .iter()
            .map(|f| f.value.clone())
            .collect()
    }

    /// The value for field `e` of `obs`: the latest fact read on another page whose label is the
    /// field's name (its placeholder or shown text, else the label line before it), compared
    /// without case.
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
        self.0
            .iter()
            .rev()
            .find(|f| f.url != obs.url && names.contains(&f.label.to_lowercase()))
            .map(|f| f.value.as_str())
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
                {"id": 1, "tag": "input", "text": "Tracking number", "editable": true, "x": 1.0, "y": 1.0},
                {"id": 2, "tag": "input", "text": "", "editable": true, "x": 1.0, "y": 2.0},
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
