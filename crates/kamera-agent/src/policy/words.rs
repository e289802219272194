//! The page's actions in words as a [`Grammar`]: constrained decoding writes the next action
//! greedily under a token mask that keeps it one of the page's [`Candidate`]s, or a `type` into
//! an open field with a text the model writes itself (`type "<text>" into <field> [N]`), or an
//! answer. The reply is an action of the page by construction.

use kamera_browser::{Action, Element, Observation};

use super::candidates::{Candidate, describe};
use crate::schema::{Fit, Grammar, Template, close_shortest, fit_any};

/// What a template's reply becomes.
#[derive(Debug, Clone)]
enum Make {
    Is(Action),
    TypeInto(u32),
    Answer,
}

/// The actions of one step, as replies after `lead`.
#[derive(Debug, Clone)]
pub struct Words {
    lead: String,
    items: Vec<(Template, Make)>,
}

impl Words {
    /// `cands` as literal replies, a free `type` into each of `fields`, and a free answer, each
    /// after `lead` and a space.
    pub fn new(lead: &str, obs: &Observation, cands: &[Candidate], fields: &[&Element]) -> Words {
        let mut items = Vec::new();
        for c in cands {
            let t = Template {
                head: format!("{lead} {}", c.text),
                tail: None,
                ranked: true,
            };
            items.push((t, Make::Is(c.action.clone())));
        }
        for e in fields {
            let t = Template {
                head: format!("{lead} type \""),
                tail: Some(format!("\" into {} [{}]", describe(e, obs), e.id)),
                ranked: true,
            };
            items.push((t, Make::TypeInto(e.id)));
        }
        let answer = Template {
            head: format!("{lead} answer \""),
            tail: Some("\"".into()),
            ranked: true,
        };
        items.push((answer, Make::Answer));
        Words {
            lead: lead.to_string(),
            items,
        }
    }

    /// The same replies less the answer (where the check after an action found the page does
    /// not show what the goal asks for).
    pub fn without_answer(mut self) -> Words {
        self.items.retain(|(_, make)| !matches!(make, Make::Answer));
        self
    }

    /// The action `reply` (a complete one) stands for.
    pub fn action(&self, reply: &str) -> Option<Action> {
        let (t, make) = self.items.iter().find(|(t, _)| t.fit(reply) == Fit::Complete)?;
        let text = || {
            let tail = t.tail.as_deref().unwrap_or_default();
            reply[t.head.len()..reply.len() - tail.len()].trim().to_string()
        };
        Some(match make {
            Make::Is(a) => a.clone(),
            Make::TypeInto(id) => Action::Type {
                id: Some(*id),
                text: text(),
            },
            Make::Answer => Action::Done { answer: text() },
        })
    }
}

impl Grammar for Words {
    fn lead(&self) -> &str {
        &self.lead
    }
    fn fit(&self, reply: &str) -> Fit {
        fit_any(self.items.iter().map(|(t, _)| t), reply)
    }
    fn close(&self, reply: &str) -> Option<String> {
        close_shortest(self.items.iter().map(|(t, _)| t), reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::candidates::candidates;

    fn page() -> Observation {
        serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1/", "title": "t",
            "text": "Name\n[1] input type=text \"\"\n[2] button \"Go\"",
            "elements": [
                {"id": 1, "tag": "input", "text": "", "editable": true, "x": 1.0, "y": 1.0},
                {"id": 2, "tag": "button", "text": "Go", "x": 1.0, "y": 2.0}
            ]
        }))
        .expect("observation")
    }

    /// Literal candidates, free typing into the open field and a free answer are complete
    /// replies with their actions; anything else is dead, and an open reply closes shortest.
    #[test]
    fn replies_in_words_are_the_pages_actions() {
        let obs = page();
        let cands = candidates(&obs, &[]);
        let field = obs.element(1).expect("field");
        let w = Words::new("Next:", &obs, &cands, &[field]);
        assert_eq!(w.action("Next: click button \"Go\" [2]"), Some(Action::Click { id: 2 }));
        assert_eq!(
            w.action("Next: type \"Ada L\" into text field near \"Name\" [1]"),
            Some(Action::Type {
                id: Some(1),
                text: "Ada L".into()
            })
        );
        assert_eq!(
            w.action("Next: answer \"42\""),
            Some(Action::Done { answer: "42".into() })
        );
        assert_eq!(w.fit("Next: type \"Ada"), Fit::Open);
        assert_eq!(w.fit("Next: click button \"Stop\" [2]"), Fit::Dead);
        assert_eq!(w.fit("Next: type \"a\" into button"), Fit::Dead);
        assert_eq!(w.close("Next: cli").as_deref(), Some("Next: click button \"Go\" [2]"));
        assert_eq!(w.action("Next: click button \"Go\" [3]"), None);
    }
}
