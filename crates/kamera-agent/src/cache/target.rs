//! What the action cache keeps of a page and of an action's target: the URL without its
//! volatile parts, a hash of the page's interactive structure, the page a step led to, and a
//! target's features (tag, role, HTML id, text, link path, position) by which it is found again
//! in a later observation, whatever numeric id the page gives it then.

use kamera_browser::{Element, Observation};
use serde::{Deserialize, Serialize};

/// `url` without what changes between runs of the same task: the origin (the site is served on
/// a fresh port each run), the query and the fragment.
pub fn url_key(url: &str, origin: &str) -> String {
    let rest = match url.strip_prefix(origin).filter(|_| !origin.is_empty()) {
        Some(r) => r,
        None => url
            .split_once("://")
            .map_or(url, |(_, r)| r.find('/').map_or("/", |i| &r[i..])),
    };
    let path = rest.split(['?', '#']).next().unwrap_or("");
    if path.is_empty() { "/".into() } else { path.into() }
}

/// A link's path (what [`url_key`] keeps of it), so that links match across ports.
fn href_key(href: &str) -> String {
    if href.is_empty() {
        return String::new();
    }
    url_key(href, "")
}

/// sha256 (hex, first 32 digits) of the interactive elements' tag, role, HTML id, link path,
/// editability and text, in page order: equal for the same page layout, different when a
/// control is added, removed, renamed or moved in the order.
pub fn structure_hash(obs: &Observation) -> String {
    let mut s = String::new();
    for e in obs.interactive() {
        s += &format!(
            "{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1e}",
            e.tag,
            e.role,
            e.html_id,
            href_key(&e.href),
            e.editable,
            e.text.trim()
        );
    }
    crate::trace::sha256_hex(s.as_bytes())[..32].to_string()
}

/// Where a step led: the page's URL key and title.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageSig {
    pub url: String,
    pub title: String,
}

impl PageSig {
    pub fn of(obs: &Observation, origin: &str) -> PageSig {
        PageSig {
            url: url_key(&obs.url, origin),
            title: obs.title.clone(),
        }
    }
}

/// How far (CSS pixels) an unlabeled target may be from where it was recorded and still be taken
/// for the same element: a page laid out as recorded puts it at the same place.
pub const SAME_PLACE_PX: f64 = 2.0;

/// A target's features: its stable selector (HTML id, link path, tag + role + text) and, to
/// choose between equals, its position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub tag: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub role: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub html_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub href: String,
    #[serde(default)]
    pub editable: bool,
    pub x: f64,
    pub y: f64,
}

/// How a target was found again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Every feature but the position is as recorded.
    Same,
    /// By a stable selector, with some features changed (a renamed label, another id).
    Moved,
}

impl Target {
    pub fn of(e: &Element) -> Target {
        Target {
            tag: e.tag.clone(),
            role: e.role.clone(),
            html_id: e.html_id.clone(),
            text: e.text.trim().to_string(),
            href: href_key(&e.href),
            editable: e.editable,
            x: e.x,
            y: e.y,
        }
    }

    /// A short description for a model's prompt: `a link "Orders" to /orders`.
    pub fn describe(&self) -> String {
        let mut d = format!("{} \"{}\"", self.tag, self.text);
        if !self.html_id.is_empty() {
            d += &format!(" (id {})", self.html_id);
        }
        if !self.href.is_empty() {
            d += &format!(" to {}", self.href);
        }
        d
    }

    /// The element of `obs` these features name: by HTML id, then link path, then tag and text,
    /// then text alone (any case), each among elements of the same editability, the nearest to
    /// the recorded position first; a target with none of these (an unlabeled input) only as an
    /// unlabeled element of its tag and role at its recorded position ([`SAME_PLACE_PX`]).
    /// `None`: the target is gone.
    pub fn find(&self, obs: &Observation) -> Option<(u32, Found)> {
        let same_kind = |e: &&Element| e.editable == self.editable;
        let unlabeled = |t: &Target| t.html_id.is_empty() && t.href.is_empty() && t.text.is_empty();
        let rules: [&dyn Fn(&Element) -> bool; 5] = [
            &|e| !self.html_id.is_empty() && e.html_id == self.html_id && e.tag == self.tag,
            &|e| !self.href.is_empty() && href_key(&e.href) == self.href && e.tag == self.tag,
            &|e| !self.text.is_empty() && e.tag == self.tag && e.text.trim() == self.text,
            &|e| e.interactive && !self.text.is_empty() && e.text.trim().eq_ignore_ascii_case(&self.text),
            &|e| {
                unlabeled(self)
                    && unlabeled(&Target::of(e))
                    && e.tag == self.tag
                    && e.role == self.role
                    && self.dist(e) <= SAME_PLACE_PX
            },
        ];
        for rule in rules {
            let best = obs
                .elements
                .iter()
                .filter(same_kind)
                .filter(|e| rule(e))
                .min_by(|a, b| self.dist(a).total_cmp(&self.dist(b)));
            if let Some(e) = best {
                let same = Target {
                    x: self.x,
                    y: self.y,
                    ..Target::of(e)
                } == *self;
                return Some((e.id, if same { Found::Same } else { Found::Moved }));
            }
        }
        None
    }

    fn dist(&self, e: &Element) -> f64 {
        (e.x - self.x).hypot(e.y - self.y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(elements: serde_json::Value) -> Observation {
        serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1:4000/x?y=1#z", "title": "t", "text": "", "elements": elements
        }))
        .expect("observation")
    }

    #[test]
    fn urls_lose_origin_query_and_fragment() {
        assert_eq!(
            url_key("http://127.0.0.1:4000/orders?x=1#a", "http://127.0.0.1:4000"),
            "/orders"
        );
        assert_eq!(url_key("http://127.0.0.1:5000/", "http://127.0.0.1:4000"), "/");
        assert_eq!(url_key("http://h:1", ""), "/");
    }

    /// A renamed link is found by its path; a changed field by its id; nothing else is guessed.
    #[test]
    fn targets_are_found_by_stable_features() {
        let before = page(serde_json::json!([
            {"id": 1, "tag": "a", "text": "Home", "href": "http://127.0.0.1:4000/", "x": 1.0, "y": 1.0},
            {"id": 2, "tag": "a", "text": "Orders", "href": "http://127.0.0.1:4000/orders", "x": 50.0, "y": 1.0},
            {"id": 3, "tag": "input", "html_id": "q", "text": "Tracking number", "editable": true, "x": 5.0, "y": 40.0}
        ]));
        let after = page(serde_json::json!([
            {"id": 1, "tag": "a", "text": "Purchases", "href": "http://127.0.0.1:4001/orders", "x": 1.0, "y": 1.0},
            {"id": 2, "tag": "a", "text": "Home", "href": "http://127.0.0.1:4001/", "x": 60.0, "y": 1.0},
            {"id": 3, "tag": "button", "text": "Find", "x": 5.0, "y": 40.0},
            {"id": 4, "tag": "input", "html_id": "code", "text": "Tracking number", "editable": true, "x": 80.0, "y": 40.0}
        ]));
        let orders = Target::of(before.element(2).unwrap());
        assert_eq!(orders.find(&before), Some((2, Found::Same)));
        assert_eq!(orders.find(&after), Some((1, Found::Moved)));
        let field = Target::of(before.element(3).unwrap());
        assert_eq!(field.find(&after), Some((4, Found::Moved)));
        let gone = Target {
            text: "Track this shipment".into(),
            href: "/track".into(),
            ..orders
        };
        assert_eq!(gone.find(&after), None);
        assert_ne!(structure_hash(&before), structure_hash(&after));
    }

    /// An unlabeled field (no id, text or link) is found only at its recorded place, and only
    /// among unlabeled elements of its tag and role.
    #[test]
    fn unlabeled_targets_are_found_at_their_place_only() {
        let before = page(serde_json::json!([
            {"id": 1, "tag": "input", "role": "textbox", "editable": true, "x": 10.0, "y": 40.0},
            {"id": 2, "tag": "input", "role": "textbox", "editable": true, "x": 10.0, "y": 80.0}
        ]));
        let second = Target::of(before.element(2).unwrap());
        assert_eq!(second.find(&before), Some((2, Found::Same)));
        let moved = page(serde_json::json!([
            {"id": 1, "tag": "input", "role": "textbox", "editable": true, "x": 10.0, "y": 40.0},
            {"id": 2, "tag": "input", "role": "textbox", "editable": true, "x": 10.0, "y": 95.0}
        ]));
        assert_eq!(second.find(&moved), None, "not guessed when the layout moved");
        let labeled = page(serde_json::json!([
            {"id": 5, "tag": "input", "role": "textbox", "html_id": "q", "editable": true, "x": 10.0, "y": 80.0}
        ]));
        assert_eq!(second.find(&labeled), None, "a labeled element is not an unlabeled one");
    }
}
