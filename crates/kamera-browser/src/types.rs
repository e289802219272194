//! Observations and actions: what a browser shows and what an agent does.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One interactive element of an observation, addressed by its id in the page text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Element {
    /// The id shown as `[id]` in the page text.
    pub id: u32,
    /// Lower-case tag name (`a`, `button`, `input`, `span`, ...).
    pub tag: String,
    /// The ARIA role, when the element has one (`button`, `tab`, `checkbox`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub role: String,
    /// Whether the element is interactive (listed as `[id]` in the page text): a link, button or
    /// form control, an ARIA widget role, a click handler, `cursor: pointer` or a tabindex. Other
    /// visible elements with text are kept too (unlisted) so that a `text:` target can match them.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub interactive: bool,
    /// The element's HTML `id` attribute, when it has one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub html_id: String,
    /// Visible text, value or placeholder (trimmed, short).
    #[serde(default)]
    pub text: String,
    /// Checked or not, for checkboxes, radio buttons and switches (ARIA `aria-checked` too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<bool>,
    /// The options' texts, for a `<select>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Whether text can be typed into it (a text-like input, a textarea, contenteditable, an
    /// ARIA textbox).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub editable: bool,
    /// Link target, for links.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub href: String,
    /// Centre of the element's box, in CSS pixels of the viewport.
    pub x: f64,
    pub y: f64,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// What the agent sees after a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub url: String,
    pub title: String,
    /// Compact page text: visible text lines, interactive elements as `[id] tag "text"`.
    pub text: String,
    pub elements: Vec<Element>,
    /// The viewport screenshot (PNG), empty from [`crate::Browser::observe_text`]. Traces store
    /// it by sha256 under resources/.
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

    /// The interactive elements (those listed as `[id]` in the page text).
    pub fn interactive(&self) -> impl Iterator<Item = &Element> {
        self.elements.iter().filter(|e| e.interactive)
    }

    /// The element whose text is `text`, as Playwright's text locators match: equal (trimmed,
    /// exact case, then any case), then containing it (any case); at each level an interactive
    /// element before any other visible element, and among those the one with the shortest text.
    pub fn by_text(&self, text: &str) -> Option<&Element> {
        let exact = text.trim();
        if exact.is_empty() {
            return None;
        }
        let t = exact.to_lowercase();
        let levels: [&dyn Fn(&Element) -> bool; 3] = [
            &|e| e.text.trim() == exact,
            &|e| e.text.trim().to_lowercase() == t,
            &|e| e.text.to_lowercase().contains(&t),
        ];
        levels.iter().find_map(|matches| {
            [true, false].into_iter().find_map(|interactive| {
                self.elements
                    .iter()
                    .filter(|e| e.interactive == interactive && matches(e))
                    .min_by_key(|e| e.text.len())
            })
        })
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
    /// Choose the option of select `id` whose text (or value) is `option`.
    Select {
        id: u32,
        option: String,
    },
    /// Check a checkbox, radio button or switch (or the one a label or container holds); nothing
    /// happens when it is checked already.
    Check {
        id: u32,
    },
    /// Uncheck a checkbox or switch; nothing happens when it is unchecked already.
    Uncheck {
        id: u32,
    },
    /// Move the mouse over element `id`.
    Hover {
        id: u32,
    },
    /// Press the mouse on element `from`, move to element `to`, release.
    Drag {
        from: u32,
        to: u32,
    },
    /// Scroll element `id` into view.
    ScrollTo {
        id: u32,
    },
    /// Drive tab `index` (0 is the first, in order of opening) from now on.
    SwitchTab {
        index: usize,
    },
    /// Set the files of file input `id` (or of the file input a label or container holds) to the
    /// one file at `path`, on the machine the browser runs on, as a user choosing it would; the
    /// page sees `change`. Not offered to the model policy: a scenario names the file, inside a
    /// folder it allows.
    Upload {
        id: u32,
        path: PathBuf,
    },
    /// Wait until a visible element matches `target` (`#html-id`, `[id]` or `text:Visible text`),
    /// at most `ms` milliseconds.
    WaitFor {
        target: String,
        ms: u64,
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
            Action::Select { id, option } => format!("select [{id}] {option:?}"),
            Action::Check { id } => format!("check [{id}]"),
            Action::Uncheck { id } => format!("uncheck [{id}]"),
            Action::Hover { id } => format!("hover [{id}]"),
            Action::Drag { from, to } => format!("drag [{from}] -> [{to}]"),
            Action::ScrollTo { id } => format!("scroll to [{id}]"),
            Action::SwitchTab { index } => format!("switch to tab {index}"),
            Action::Upload { id, path } => format!(
                "upload [{id}] {}",
                path.file_name()
                    .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
            ),
            Action::WaitFor { target, ms } => format!("wait for {target:?} ({ms}ms)"),
            Action::Navigate { url } => format!("navigate {url}"),
            Action::Back => "back".into(),
            Action::Wait { ms } => format!("wait {ms}ms"),
            Action::Done { answer } => format!("done {answer:?}"),
        }
    }
}
