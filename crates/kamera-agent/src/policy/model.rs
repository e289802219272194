//! The model policy: asks the model for each action under the page's action schema
//! (constrained decoding by default, or ranked, or free JSON with retries), never offering again
//! an action that did nothing on an unchanged page.

use kamera_browser::{Action, Element, Observation};
use serde::{Deserialize, Serialize};

use super::{Mind, NextAction, Policy};
use crate::cache::Use;
use crate::error::{Error, Result};
use crate::llm::{ModelCall, parse_action};
use crate::schema::{ActionSchema, LEAD, MAX_FREE_CHARS, Template};

/// How the model policy turns the model's reply into an action.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decoding {
    /// Greedy decoding under a token mask from the page's [`ActionSchema`]: every reply is a
    /// valid action by construction.
    #[default]
    Constrained,
    /// The page's valid actions ranked by mean token log-likelihood after the prompt; the text
    /// of a chosen `type` or `done` is written greedily after it.
    Ranked,
    /// Free JSON (greedy, then `retries` seeded samples); when no reply is a valid action, ranked.
    Free,
}

/// Asks the model for each action over the window's live context, as [`Decoding`] says
/// (constrained decoding by default). An action already taken on a page that has not changed
/// since (it did nothing) is not offered again.
#[derive(Debug, Clone, Default)]
pub struct ModelPolicy {
    pub decoding: Decoding,
    /// With [`Decoding::Free`]: extra attempts after the first (greedy) one, sampled with fixed seeds.
    pub retries: usize,
    /// The page of the last step ([`PageKey`]) and the actions taken on it since it last changed.
    page: Option<PageKey>,
    tried: Vec<Action>,
}

pub use crate::schema::ACTION_GRAMMAR;

/// What makes two observations the same page for "this action did nothing": the URL and the
/// interactive elements (ids, text, state, position). Not the page text: a countdown line
/// (MiniWoB++'s timer) changes it every second while the page the actions act on stays the same.
#[derive(Debug, Clone, PartialEq)]
struct PageKey {
    url: String,
    elements: Vec<Element>,
}

impl PageKey {
    fn of(obs: &Observation) -> PageKey {
        PageKey {
            url: obs.url.clone(),
            elements: obs.interactive().cloned().collect(),
        }
    }
}

/// Whether `action` is one the page can take: a complete action of the page's schema.
pub fn valid(obs: &Observation, action: &Action) -> bool {
    ActionSchema::for_page(obs).allows(action)
}

impl ModelPolicy {
    /// The instruction after the window's pages: the current page, the goal, the grammar.
    pub fn instruction(obs: &Observation, goal: &str) -> String {
        format!(
            "Current page: {} ({}).\nGoal: {goal}\n{ACTION_GRAMMAR}",
            obs.title, obs.url
        )
    }

    /// A model policy that decodes as `decoding` says.
    pub fn new(decoding: Decoding) -> ModelPolicy {
        ModelPolicy {
            decoding,
            ..ModelPolicy::default()
        }
    }

    /// A free-JSON model policy with `retries` extra attempts per step.
    pub fn with_retries(retries: usize) -> ModelPolicy {
        ModelPolicy {
            decoding: Decoding::Free,
            retries,
            ..ModelPolicy::default()
        }
    }

    /// The page's schema without the actions already taken on it while it stayed the same.
    fn schema(&self, obs: &Observation) -> ActionSchema {
        let mut schema = ActionSchema::for_page(obs);
        schema
            .templates
            .retain(|t| t.tail.is_some() || crate::llm::parse_action(&t.head).map_or(true, |a| !self.stale(&a)));
        schema
    }

    /// Notes the page of this step; a changed page forgets the actions taken on the last one.
    fn seen(&mut self, obs: &Observation) {
        let page = PageKey::of(obs);
        if self.page.as_ref() != Some(&page) {
            self.page = Some(page);
            self.tried.clear();
        }
    }

    /// Whether `action` was already taken on this unchanged page (text actions may be retried).
    fn stale(&self, action: &Action) -> bool {
        !matches!(action, Action::Type { .. } | Action::Done { .. }) && self.tried.contains(action)
    }

    /// The page's valid action the model finds most likely, with generated text where it has one.
    fn ranked(&self, obs: &Observation, mind: &mut Mind<'_>, instruction: &str) -> Result<NextAction> {
        let schema = self.schema(obs);
        let cands: Vec<&Template> = schema.templates.iter().filter(|t| t.ranked).collect();
        let texts: Vec<String> = cands.iter().map(|t| t.head[LEAD.len()..].to_string()).collect();
        let mut call = mind.llm.rank(&mut mind.view, instruction, LEAD, &texts)?;
        let best = call.output.strip_prefix(LEAD).unwrap_or_default().to_string();
        let Some(choice) = cands.iter().zip(&texts).find(|(_, t)| **t == best).map(|(c, _)| *c) else {
            return Err(Error::Policy {
                tries: self.retries + 2,
                last: call.output,
            });
        };
        let mut reply = choice.head.clone();
        if let Some(tail) = &choice.tail {
            // The text, greedily, up to its closing quote.
            let written_call =
                mind.llm
                    .generate_after(&mut mind.view, instruction, &reply, mind.max_new_tokens.max(16), 0)?;
            let written = written_call.output.strip_prefix(&reply).unwrap_or(&written_call.output);
            let text: String = written
                .split('"')
                .next()
                .unwrap_or_default()
                .chars()
                .filter(|c| *c != '\\' && !c.is_control())
                .take(MAX_FREE_CHARS)
                .collect();
            let text = text.trim();
            reply = format!("{reply}{}{tail}", if text.is_empty() { "-" } else { text });
            call.output_tokens.extend(written_call.output_tokens.iter().copied());
            call.timings.decode_ms +=
                written_call.timings.prefill_ms + written_call.timings.decode_ms + written_call.timings.reuse_ms;
        }
        call.output = reply;
        decided(&schema, call)
    }

    /// Constrained decoding over the page's schema.
    fn constrained(&self, obs: &Observation, mind: &mut Mind<'_>, instruction: &str) -> Result<NextAction> {
        let schema = self.schema(obs);
        let call = mind
            .llm
            .generate_constrained(&mut mind.view, instruction, &schema, mind.max_new_tokens.max(24))?;
        decided(&schema, call)
    }
}

impl Policy for ModelPolicy {
    fn next(&mut self, _step: usize, obs: &Observation, mind: &mut Mind<'_>) -> Result<NextAction> {
        let instruction = ModelPolicy::instruction(obs, mind.goal);
        self.seen(obs);
        let mut healing = false;
        if let Some(c) = mind.cache.as_deref_mut() {
            match c.action(mind.goal, obs, mind.origin)? {
                (_, Some(action)) => {
                    self.tried.push(action.clone());
                    return Ok(NextAction { action, model: None });
                }
                (u, None) => healing = u == (Use::Decide { healing: true }),
            }
        }
        let decision = match self.decoding {
            Decoding::Constrained => self.constrained(obs, mind, &instruction)?,
            Decoding::Ranked => self.ranked(obs, mind, &instruction)?,
            Decoding::Free => self.free_or_ranked(obs, mind, &instruction)?,
        };
        if let Some(c) = mind.cache.as_deref_mut() {
            c.record_action(mind.goal, obs, mind.origin, &decision.action, healing);
        }
        self.tried.push(decision.action.clone());
        Ok(decision)
    }
}

impl ModelPolicy {
    fn free_or_ranked(&self, obs: &Observation, mind: &mut Mind<'_>, instruction: &str) -> Result<NextAction> {
        for attempt in 0..=self.retries {
            let call = mind.llm.generate_after(
                &mut mind.view,
                instruction,
                LEAD,
                mind.max_new_tokens.max(24),
                attempt as u64,
            )?;
            match parse_action(&call.output) {
                Ok(action) if valid(obs, &action) && !self.stale(&action) => {
                    return Ok(NextAction {
                        action,
                        model: Some(call),
                    });
                }
                Ok(_) => tracing::debug!(attempt, output = %call.output, "model action is not one the page allows now"),
                Err(e) => tracing::debug!(attempt, error = %e, output = %call.output, "model output is not an action"),
            }
        }
        self.ranked(obs, mind, instruction)
    }
}

/// The schema's action for a model call's reply (a reply it cannot read is a policy error).
fn decided(schema: &ActionSchema, call: ModelCall) -> Result<NextAction> {
    let action = schema.action(&call.output).ok_or_else(|| Error::Policy {
        tries: 1,
        last: call.output.clone(),
    })?;
    Ok(NextAction {
        action,
        model: Some(call),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the old grammar allowed stays valid; what the page lacks is not.
    #[test]
    fn validity_is_the_schema() {
        let obs: Observation = serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1/", "title": "t", "text": "",
            "elements": [
                {"id": 1, "tag": "button", "text": "Go", "x": 1.0, "y": 1.0},
                {"id": 2, "tag": "input", "text": "", "editable": true, "x": 1.0, "y": 1.0}
            ]
        }))
        .expect("observation");
        for a in [
            Action::Click { id: 1 },
            Action::Type {
                id: Some(2),
                text: "hi".into(),
            },
            Action::Key { key: "Enter".into() },
            Action::Scroll { dy: 300.0 },
            Action::Back,
            Action::Done { answer: "x".into() },
            Action::Drag { from: 1, to: 2 },
        ] {
            assert!(valid(&obs, &a), "{a:?}");
        }
        for a in [
            Action::Click { id: 3 },
            Action::Type {
                id: Some(1),
                text: "hi".into(),
            },
            Action::Check { id: 2 },
            Action::Navigate {
                url: "http://x/".into(),
            },
        ] {
            assert!(!valid(&obs, &a), "{a:?}");
        }
    }

    /// Actions already taken on an unchanged page are not offered again; text actions are.
    #[test]
    fn actions_that_did_nothing_are_not_repeated() {
        let mut p = ModelPolicy::with_retries(0);
        p.tried = vec![Action::Scroll { dy: 300.0 }, Action::Click { id: 2 }];
        assert!(p.stale(&Action::Scroll { dy: 300.0 }));
        assert!(p.stale(&Action::Click { id: 2 }));
        assert!(!p.stale(&Action::Click { id: 3 }));
        p.tried.push(Action::Done { answer: "x".into() });
        assert!(!p.stale(&Action::Done { answer: "x".into() }));
    }

    /// A page whose text changes only in a countdown line (MiniWoB++'s timer) is the same page:
    /// a click that did nothing stays stale. A changed element makes it a new page.
    #[test]
    fn a_ticking_timer_does_not_make_a_new_page() {
        let page = |timer: u32, button: &str| -> Observation {
            serde_json::from_value(serde_json::json!({
                "url": "http://127.0.0.1/miniwob/click-test.html", "title": "t",
                "text": format!("Click the button.\n[1] button \"{button}\"\nTime left: {timer} / 10sec"),
                "elements": [
                    {"id": 1, "tag": "button", "text": button, "x": 5.0, "y": 5.0},
                    {"id": 2, "tag": "div", "text": format!("Time left: {timer} / 10sec"),
                     "interactive": false, "x": 5.0, "y": 90.0}
                ]
            }))
            .expect("observation")
        };
        let mut p = ModelPolicy::default();
        p.seen(&page(9, "Go"));
        p.tried.push(Action::Click { id: 1 });
        p.seen(&page(8, "Go"));
        assert!(
            p.stale(&Action::Click { id: 1 }),
            "the timer ticked; the page did not change"
        );
        p.seen(&page(7, "Gone"));
        assert!(!p.stale(&Action::Click { id: 1 }), "the button changed: a new page");
    }
}
