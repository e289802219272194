//! The action schema of a page: every action it can take, written as the JSON the model replies
//! with. Constrained decoding keeps the reply a prefix of one of these, so it is valid by
//! construction; ranking scores them.

use kamera_browser::{Action, Observation};

/// The action grammar shown to the model (what [`ActionSchema`] enforces, element by element).
pub const ACTION_GRAMMAR: &str = r#"Reply with exactly one JSON object and nothing else, one of:
{"action": "click", "id": N}
{"action": "type", "id": N, "text": "..."}
{"action": "select", "id": N, "option": "..."}
{"action": "check", "id": N} / {"action": "uncheck", "id": N}
{"action": "hover", "id": N} / {"action": "scroll_to", "id": N}
{"action": "drag", "from": N, "to": M}
{"action": "key", "key": "Enter"}
{"action": "scroll", "dy": 300}
{"action": "wait_for", "target": "text:...", "ms": 3000}
{"action": "back"}
{"action": "done", "answer": "..."}
N is the number in brackets before an element on the current page."#;

/// Every reply starts like this; the prompt ends with it so the model only fills in the rest.
pub const LEAD: &str = "{\"action\": \"";

/// Most elements whose pairs are offered as `drag` actions (the pairs grow quadratically).
const MAX_DRAG_ELEMENTS: usize = 16;

/// Most characters of a free text (a typed text, an answer, a waited-for target).
pub const MAX_FREE_CHARS: usize = 160;

/// One valid action as JSON: `head`, then (for `type`, `done`, `wait_for`) a free text without
/// quotes, backslashes or control characters, closed by `tail`.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub head: String,
    pub tail: Option<String>,
    /// Offered to likelihood ranking (every click, type, select, check, key Enter, back, scroll,
    /// done); hover, scroll_to, drag, wait_for, Tab and Escape are left to constrained decoding,
    /// where they cost nothing until the model starts writing one.
    pub ranked: bool,
}

/// Where a reply stands against the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// Not a prefix of any valid action.
    Dead,
    /// A prefix of at least one valid action, none complete.
    Open,
    /// A complete valid action.
    Complete,
}

/// What constrained decoding holds a reply to: the text every reply starts with, where a reply
/// stands, and the shortest completion of an open one. [`ActionSchema`] (a page's actions) and
/// [`crate::JsonGrammar`] (a JSON Schema, for extraction) implement it; the token mask of
/// [`crate::Llm::decode_constrained`] asks nothing else.
pub trait Grammar {
    /// What every reply starts with (the prompt ends with it).
    fn lead(&self) -> &str;
    /// Where `reply` (which starts with [`Grammar::lead`]) stands.
    fn fit(&self, reply: &str) -> Fit;
    /// `reply`, open, completed into a complete one by the shortest way.
    fn close(&self, reply: &str) -> Option<String>;
}

impl Grammar for ActionSchema {
    fn lead(&self) -> &str {
        LEAD
    }
    fn fit(&self, reply: &str) -> Fit {
        ActionSchema::fit(self, reply)
    }
    fn close(&self, reply: &str) -> Option<String> {
        ActionSchema::close(self, reply)
    }
}

/// A text after `lead` up to its closing quote, without backslashes or control characters (a
/// text to type or an answer, as the ranked model policy writes it): decoding stops at the quote.
/// With `within`, the text is a non-empty span of that text (a copy of the page, valid by
/// construction).
pub struct QuotedText<'a> {
    pub lead: &'a str,
    pub within: Option<&'a str>,
}

impl Grammar for QuotedText<'_> {
    fn lead(&self) -> &str {
        self.lead
    }
    fn fit(&self, reply: &str) -> Fit {
        let Some(text) = reply.strip_prefix(self.lead) else {
            return Fit::Dead;
        };
        // The free text of a template ([`free_char`]), closed by the quote and nothing after it.
        let (free, closing) = text.split_at(text.find('"').unwrap_or(text.len()));
        let outside = |src: &str| !src.contains(free) || (free.trim().is_empty() && !closing.is_empty());
        match closing {
            _ if !free.chars().all(free_char) || free.chars().count() > MAX_FREE_CHARS => Fit::Dead,
            _ if self.within.is_some_and(outside) => Fit::Dead,
            "" => Fit::Open,
            "\"" => Fit::Complete,
            _ => Fit::Dead,
        }
    }
    fn close(&self, reply: &str) -> Option<String> {
        (self.fit(reply) == Fit::Open).then(|| format!("{reply}\""))
    }
}

/// Lines of plain text after `lead` (the model policy's plan): at most `max_lines` lines, each
/// at most [`MAX_LINE_CHARS`] long, no control characters but the line break; complete at a
/// blank line, or when line `max_lines` ends. The lead opens line 1.
pub struct Lines<'a> {
    pub lead: &'a str,
    pub max_lines: usize,
}

/// Most characters of one line of [`Lines`].
pub const MAX_LINE_CHARS: usize = 100;

impl Grammar for Lines<'_> {
    fn lead(&self) -> &str {
        self.lead
    }
    fn fit(&self, reply: &str) -> Fit {
        let Some(text) = reply.strip_prefix(self.lead) else {
            return Fit::Dead;
        };
        if text.chars().any(|c| c.is_control() && c != '\n') {
            return Fit::Dead;
        }
        // A blank line ends the text and nothing may follow it; an empty text is no text.
        if let Some(i) = text.find("\n\n") {
            let done = i + 2 == text.len() && !text[..i].trim().is_empty();
            return if done { Fit::Complete } else { Fit::Dead };
        }
        let lines: Vec<&str> = text.split('\n').collect();
        if lines.len() > self.max_lines + 1 || lines.iter().any(|l| l.chars().count() > MAX_LINE_CHARS) {
            return Fit::Dead;
        }
        if lines.len() == self.max_lines + 1 {
            let done = lines[self.max_lines].is_empty() && !text.trim().is_empty();
            return if done { Fit::Complete } else { Fit::Dead };
        }
        Fit::Open
    }
    fn close(&self, reply: &str) -> Option<String> {
        if self.fit(reply) != Fit::Open {
            return None;
        }
        let body = reply.trim_end_matches([' ', '\n']);
        let closed = if self.max_lines == 1 {
            format!("{body}\n")
        } else {
            format!("{body}\n\n")
        };
        (self.fit(&closed) == Fit::Complete).then_some(closed)
    }
}

/// The valid actions of one page.
#[derive(Debug, Clone, Default)]
pub struct ActionSchema {
    pub templates: Vec<Template>,
}

fn lit(json: String, ranked: bool) -> Template {
    Template {
        head: json,
        tail: None,
        ranked,
    }
}

fn free(head: String, tail: &str, ranked: bool) -> Template {
    Template {
        head,
        tail: Some(tail.to_string()),
        ranked,
    }
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

impl ActionSchema {
    /// The actions `obs` allows: per interactive element click, hover and scroll_to; type into
    /// editable ones; select one of a select's options; check or uncheck by state; drag between
    /// elements (up to 16 of them); and key (Enter, Tab, Escape), scroll, back, wait_for, done.
    /// Never `upload`: a model does not choose files to send (a page could talk it into sending
    /// any file it can read); uploads are scenario steps from a folder the scenario allows.
    pub fn for_page(obs: &Observation) -> ActionSchema {
        let mut t = Vec::new();
        let els: Vec<_> = obs.interactive().collect();
        for e in &els {
            let id = e.id;
            t.push(lit(format!("{LEAD}click\", \"id\": {id}}}"), true));
            if e.editable {
                t.push(free(format!("{LEAD}type\", \"id\": {id}, \"text\": \""), "\"}", true));
            }
            for o in &e.options {
                let head = format!("{LEAD}select\", \"id\": {id}, \"option\": {}}}", json_str(o));
                t.push(lit(head, true));
            }
            match e.checked {
                Some(false) => t.push(lit(format!("{LEAD}check\", \"id\": {id}}}"), true)),
                Some(true) => t.push(lit(format!("{LEAD}uncheck\", \"id\": {id}}}"), true)),
                None => {}
            }
            t.push(lit(format!("{LEAD}hover\", \"id\": {id}}}"), false));
            t.push(lit(format!("{LEAD}scroll_to\", \"id\": {id}}}"), false));
        }
        if els.len() <= MAX_DRAG_ELEMENTS {
            for a in &els {
                for b in els.iter().filter(|b| b.id != a.id) {
                    let head = format!("{LEAD}drag\", \"from\": {}, \"to\": {}}}", a.id, b.id);
                    t.push(lit(head, false));
                }
            }
        }
        for (key, ranked) in [("Enter", true), ("Tab", false), ("Escape", false)] {
            t.push(lit(format!("{LEAD}key\", \"key\": \"{key}\"}}"), ranked));
        }
        t.push(lit(format!("{LEAD}scroll\", \"dy\": 300}}"), true));
        t.push(lit(format!("{LEAD}scroll\", \"dy\": -300}}"), false));
        t.push(lit(format!("{LEAD}back\"}}"), true));
        t.push(free(
            format!("{LEAD}wait_for\", \"target\": \"text:"),
            "\", \"ms\": 3000}",
            false,
        ));
        t.push(free(format!("{LEAD}done\", \"answer\": \""), "\"}", true));
        ActionSchema { templates: t }
    }

    /// Where `reply` stands: dead, an open prefix, or a complete action.
    pub fn fit(&self, reply: &str) -> Fit {
        fit_any(&self.templates, reply)
    }

    /// The shortest completion of an open `reply` into a valid action (used when the token
    /// budget runs out mid-reply): the rest of the first literal it starts, or the close of its
    /// free text.
    pub fn close(&self, reply: &str) -> Option<String> {
        close_shortest(&self.templates, reply)
    }

    /// Whether `action` is one of this schema's actions.
    pub fn allows(&self, action: &Action) -> bool {
        let text = match action {
            Action::Type { text, .. } => Some(text.as_str()),
            Action::Done { answer } => Some(answer.as_str()),
            Action::WaitFor { target, .. } => target.strip_prefix("text:"),
            _ => None,
        };
        self.templates.iter().any(|t| match (&t.tail, text) {
            (None, _) => crate::llm::parse_action(&t.head).ok().as_ref() == Some(action),
            (Some(tail), Some(text)) => self.action(&format!("{}{text}{tail}", t.head)).as_ref() == Some(action),
            (Some(_), None) => false,
        })
    }

    /// `reply` as an action, when it is a complete one of this schema.
    pub fn action(&self, reply: &str) -> Option<Action> {
        (self.fit(reply) == Fit::Complete)
            .then(|| crate::llm::parse_action(reply).ok())
            .flatten()
    }
}

/// Where `reply` stands against any of `templates`: complete if one is complete, open if one is open.
pub(crate) fn fit_any<'a>(templates: impl IntoIterator<Item = &'a Template>, reply: &str) -> Fit {
    let mut open = false;
    for t in templates {
        match t.fit(reply) {
            Fit::Complete => return Fit::Complete,
            Fit::Open => open = true,
            Fit::Dead => {}
        }
    }
    if open { Fit::Open } else { Fit::Dead }
}

/// The shortest completion of an open `reply` by any of `templates`.
pub(crate) fn close_shortest<'a>(templates: impl IntoIterator<Item = &'a Template>, reply: &str) -> Option<String> {
    templates
        .into_iter()
        .filter(|t| t.fit(reply) == Fit::Open)
        .filter_map(|t| t.close(reply))
        .min_by_key(String::len)
}

/// A character free text may hold (it stays a valid JSON string without escapes).
fn free_char(c: char) -> bool {
    c != '"' && c != '\\' && !c.is_control()
}

impl Template {
    pub(crate) fn fit(&self, s: &str) -> Fit {
        let h = self.head.as_str();
        if s.len() <= h.len() || !s.starts_with(h) {
            return match (h.starts_with(s), s.len() == h.len() && self.tail.is_none()) {
                (false, _) => Fit::Dead,
                (true, true) => Fit::Complete,
                (true, false) => Fit::Open,
            };
        }
        let Some(tail) = &self.tail else {
            return Fit::Dead;
        };
        let rest = &s[h.len()..];
        let (text, closing) = match rest.find('"') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if !text.chars().all(free_char) || text.chars().count() > MAX_FREE_CHARS {
            return Fit::Dead;
        }
        if closing.is_empty() {
            return Fit::Open;
        }
        if text.trim().is_empty() || !tail.starts_with(closing) {
            return Fit::Dead;
        }
        if closing.len() == tail.len() {
            Fit::Complete
        } else {
            Fit::Open
        }
    }

    pub(crate) fn close(&self, s: &str) -> Option<String> {
        if s.len() < self.head.len() {
            return match &self.tail {
                None => Some(self.head.clone()),
                // A free text must not be empty: close it with a placeholder.
                Some(tail) => Some(format!("{}-{tail}", self.head)),
            };
        }
        let tail = self.tail.as_ref()?;
        let rest = &s[self.head.len()..];
        match rest.find('"') {
            None if rest.trim().is_empty() => Some(format!("{s}-{tail}")),
            None => Some(format!("{s}{tail}")),
            Some(i) => Some(format!("{}{tail}", &s[..self.head.len() + i])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quoted text is open until its closing quote, complete at it, dead after it or with a
    /// backslash or control character; an open one closes with the quote.
    #[test]
    fn quoted_texts_end_at_their_quote() {
        let g = QuotedText {
            lead: "say \"",
            within: None,
        };
        assert_eq!(g.fit("say \"hello"), Fit::Open);
        assert_eq!(g.fit("say \"hello\""), Fit::Complete);
        assert_eq!(g.fit("say \"\""), Fit::Complete);
        assert_eq!(g.fit("say \"hello\" x"), Fit::Dead);
        assert_eq!(g.fit("say \"a\\b"), Fit::Dead);
        assert_eq!(g.fit("say \"a\nb"), Fit::Dead);
        assert_eq!(g.fit("shout"), Fit::Dead);
        assert_eq!(g.fit(&format!("say \"{}", "x".repeat(MAX_FREE_CHARS + 1))), Fit::Dead);
        assert_eq!(g.close("say \"hello").as_deref(), Some("say \"hello\""));
        assert_eq!(g.close("say \"hello\""), None);
        let span = QuotedText {
            lead: "say \"",
            within: Some("Status: Awaiting pickup\nLast hub: Gdansk"),
        };
        assert_eq!(span.fit("say \"Await"), Fit::Open);
        assert_eq!(span.fit("say \"Awaiting pickup\""), Fit::Complete);
        assert_eq!(span.fit("say \"Send return request"), Fit::Dead, "not on the page");
        assert_eq!(span.fit("say \"pickup Last"), Fit::Dead, "across a line");
        assert_eq!(span.fit("say \"\""), Fit::Dead, "empty");
        assert_eq!(span.fit("say \" \""), Fit::Dead, "blank");
    }

    /// Lines up to a blank line or the last allowed line's end; nothing after the blank line,
    /// no control characters, no over-long line, no empty text.
    #[test]
    fn lines_end_at_a_blank_line_or_the_last_line() {
        let g = Lines {
            lead: "P:\n1.",
            max_lines: 5,
        };
        assert_eq!(g.fit("P:\n1. Open the orders"), Fit::Open);
        assert_eq!(g.fit("P:\n1. Open the orders.\n2. Read"), Fit::Open);
        assert_eq!(g.fit("P:\n1. Open the orders.\n2. Read it.\n\n"), Fit::Complete);
        assert_eq!(g.fit("P:\n1. Open.\n\nmore"), Fit::Dead);
        assert_eq!(g.fit("P:\n1.\n\n"), Fit::Dead, "an empty text");
        assert_eq!(g.fit("P:\n1. a\tb"), Fit::Dead);
        assert_eq!(g.fit(&format!("P:\n1. {}", "x".repeat(MAX_LINE_CHARS + 1))), Fit::Dead);
        assert_eq!(g.fit("Q:\n1. x"), Fit::Dead);
        let five = "P:\n1. a\n2. b\n3. c\n4. d\n5. e\n";
        assert_eq!(g.fit(five), Fit::Complete);
        assert_eq!(g.fit(&format!("{five}6")), Fit::Dead);
        assert_eq!(
            g.close("P:\n1. Open the orders\n").as_deref(),
            Some("P:\n1. Open the orders\n\n")
        );
        assert_eq!(g.close("P:\n1. "), None, "nothing written: nothing to close");
        assert_eq!(g.close(five), None);
        let one = Lines {
            lead: "T:",
            max_lines: 1,
        };
        assert_eq!(one.fit("T: open it"), Fit::Open);
        assert_eq!(one.fit("T: open it\n"), Fit::Complete);
        assert_eq!(one.fit("T:\n"), Fit::Dead);
        assert_eq!(one.close("T: open it ").as_deref(), Some("T: open it\n"));
    }

    fn page() -> Observation {
        serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1/", "title": "t", "text": "",
            "elements": [
                {"id": 1, "tag": "button", "text": "Go", "x": 1.0, "y": 1.0},
                {"id": 2, "tag": "input", "text": "", "editable": true, "x": 1.0, "y": 1.0},
                {"id": 3, "tag": "select", "text": "A", "options": ["A", "B \"quoted\""], "x": 1.0, "y": 1.0},
                {"id": 4, "tag": "input", "text": "Remember", "checked": false, "x": 1.0, "y": 1.0},
                {"id": 12, "tag": "div", "text": "plain", "interactive": false, "x": 1.0, "y": 1.0}
            ]
        }))
        .expect("observation")
    }

    /// Every template, completed, parses to an action the page allows; unlisted elements get none.
    #[test]
    fn every_template_is_a_valid_action() {
        let obs = page();
        let schema = ActionSchema::for_page(&obs);
        for t in &schema.templates {
            let done = t.close(LEAD).expect("closes");
            assert_eq!(schema.fit(&done), Fit::Complete, "{done}");
            let a = schema.action(&done).unwrap_or_else(|| panic!("{done}"));
            let ids: Vec<u32> = match &a {
                Action::Click { id } | Action::Check { id } | Action::Hover { id } | Action::ScrollTo { id } => {
                    vec![*id]
                }
                Action::Type { id: Some(id), .. } | Action::Select { id, .. } => vec![*id],
                Action::Drag { from, to } => vec![*from, *to],
                _ => vec![],
            };
            assert!(ids.iter().all(|i| (1..=4).contains(i)), "{a:?}");
        }
        let select = format!("{LEAD}select\", \"id\": 3, \"option\": \"B \\\"quoted\\\"\"}}");
        assert_eq!(
            schema.action(&select),
            Some(Action::Select {
                id: 3,
                option: "B \"quoted\"".into()
            })
        );
        assert_eq!(
            schema.fit(&format!("{LEAD}uncheck\", \"id\": 4}}")),
            Fit::Dead,
            "unchecked box"
        );
        assert_eq!(
            schema.fit(&format!("{LEAD}type\", \"id\": 1")),
            Fit::Dead,
            "a button takes no text"
        );
        assert_eq!(
            schema.fit(&format!("{LEAD}click\", \"id\": 12}}")),
            Fit::Dead,
            "unlisted"
        );
    }

    /// Prefixes stay open, free text refuses quotes and backslashes, and closes where it ends.
    #[test]
    fn replies_are_judged_prefix_by_prefix() {
        let schema = ActionSchema::for_page(&page());
        let typed = format!("{LEAD}type\", \"id\": 2, \"text\": \"hello world\"}}");
        for i in LEAD.len()..typed.len() {
            assert_eq!(schema.fit(&typed[..i]), Fit::Open, "{}", &typed[..i]);
        }
        assert_eq!(schema.fit(&typed), Fit::Complete);
        assert_eq!(
            schema.action(&typed),
            Some(Action::Type {
                id: Some(2),
                text: "hello world".into()
            })
        );
        assert_eq!(
            schema.fit(&format!("{LEAD}type\", \"id\": 2, \"text\": \"a\\")),
            Fit::Dead
        );
        assert_eq!(
            schema.fit(&format!("{LEAD}type\", \"id\": 2, \"text\": \"\"}}")),
            Fit::Dead,
            "empty text"
        );
        assert_eq!(schema.fit(&format!("{LEAD}clack")), Fit::Dead);
        let cut = format!("{LEAD}done\", \"answer\": \"Awaiting pick");
        assert_eq!(schema.close(&cut).as_deref(), Some(format!("{cut}\"}}").as_str()));
        assert_eq!(
            schema.close(&format!("{LEAD}cl")),
            Some(format!("{LEAD}click\", \"id\": 1}}"))
        );
    }
}
