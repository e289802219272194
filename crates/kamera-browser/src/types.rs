//! Observations and actions: what a browser shows and what an agent does.

use serde::{Deserialize, Serialize};

/// One interactive element of an observation, addressed by its id in the page text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Element {
    /// The id shown as `[id]` in the page text.
    pub id: u32,
    /// Lower-case tag name (`a`, `button`, `input`, ...).
    pub tag: String,
    /// The element's HTML `id` attribute, when it has one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub html_id: String,
    /// Visible text, value or placeholder (trimmed, short).
    #[serde(default)]
    pub text: String,
    /// Link target, for links.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub href: String,
    /// Centre of the element's box, in CSS pixels of the viewport.
    pub x: f64,
    pub y: f64,
}

/// What the agent sees after a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub url: String,
    pub title: String,
    /// Compact page text: visible text lines, interactive elements as `[id] tag "text"`.
    pub text: String,
    pub elements: Vec<Element>,
    /// The viewport screenshot (PNG). Traces store it by sha256 under resources/.
    #[serde(skip)]
    pub screenshot_png: Vec<u8>,
}

impl Observation {
    /// The element with `id`.
    pub fn element(&self, id: u32) -> Option<&Element> {
        self.elements.iter().find(|e| e.id == id)
    }

    /// The first element whose HTML id is `html_id`.
    pub fn by_html_id(&self, html_id: &str) -> Option<&Element> {
        self.elements.iter().find(|e| e.html_id == html_id)
    }

    /// The first element whose text equals `text` (trimmed; exact case first, then any case), else
    /// the first whose text contains it (any case).
    pub fn by_text(&self, text: &str) -> Option<&Element> {
        let exact = text.trim();
        let t = exact.to_lowercase();
        self.elements
            .iter()
            .find(|e| e.text.trim() == exact)
            .or_else(|| self.elements.iter().find(|e| e.text.trim().to_lowercase() == t))
            .or_else(|| self.elements.iter().find(|e| e.text.to_lowercase().contains(&t)))
    }
}

/// One browser action. `Done` ends the episode with an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    ClickXy {
        x: f64,
        y: f64,
    },
    Click {
        id: u32,
    },
    /// Focus element `id` (when given) and type `text`.
    Type {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u32>,
        text: String,
    },
    /// A key by its DOM name: `Enter`, `Tab`, `Escape`, `Backspace`, `ArrowDown`, ...
    Key {
        key: String,
    },
    Scroll {
        dy: f64,
    },
    Navigate {
        url: String,
    },
    Back,
    Wait {
        ms: u64,
    },
    Done {
        answer: String,
    },
}

impl Action {
    /// Short human form for tables and logs.
    pub fn label(&self) -> String {
        match self {
            Action::ClickXy { x, y } => format!("click ({x:.0},{y:.0})"),
            Action::Click { id } => format!("click [{id}]"),
            Action::Type { id: Some(id), text } => format!("type [{id}] {text:?}"),
            Action::Type { id: None, text } => format!("type {text:?}"),
            Action::Key { key } => format!("key {key}"),
            Action::Scroll { dy } => format!("scroll {dy:.0}"),
            Action::Navigate { url } => format!("navigate {url}"),
            Action::Back => "back".into(),
            Action::Wait { ms } => format!("wait {ms}ms"),
            Action::Done { answer } => format!("done {answer:?}"),
        }
    }
}
