//! The model policy: writes a plan before the first page ([`plan`], pinned in the window), then
//! asks the model for each action among the page's actions written in words (ranked by
//! likelihood by default, or greedy under a token mask, or free JSON with retries). Each prompt
//! carries a recorded example from another task ([`example`]), what was done so far and whether
//! each action changed the page (the check after each action). It never offers again an action
//! already taken on this same page (it did nothing, or it would go round a loop), the last action
//! right after itself, or typing into a field that already holds what it typed. Texts to type are
//! the task's own quoted strings ([`candidates::goal_spans`]), the facts read on earlier pages
//! ([`candidates::facts`]) and what the model writes.

use kamera_browser::{Action, Element, Observation};
use serde::{Deserialize, Serialize};

use super::words::Words;
use super::{Mind, NextAction, Planned, Policy, candidates, example, plan, restricted};
use crate::cache::Use;
use crate::error::{Error, Result};
use crate::llm::{CallTimings, ModelCall, parse_action};
use crate::schema::{ActionSchema, LEAD, MAX_FREE_CHARS, QuotedText};

/// How a ranked step's reply is written: one of the page's actions in words.
const RANKED_FORM: &str = "Reply with the next action for this task, one of: click <element> [N], \
type \"<text>\" into <element> [N], select \"<option>\" in <element> [N], press Enter, \
answer \"<text>\" (when the goal asks for an answer). \
N is the number in brackets before the element on the current page.";

/// How the model policy turns the model's reply into an action.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decoding {
    /// Greedy decoding of the action in words under a token mask of the page's actions
    /// ([`Words`]): every reply is a valid action by construction; texts to type are the model's.
    Constrained,
    /// The kind of action (click, type, select, press, answer) ranked by likelihood, then the
    /// page's actions of that kind in words by mean token log-likelihood; the texts offered to
    /// type are the task's quoted strings, facts read on earlier pages and one the model writes,
    /// an answer is written. The default: it measured better than greedy decoding and than
    /// [`Decoding::Restricted`] (bench/agent/README.md).
    #[default]
    Ranked,
    /// As [`Decoding::Ranked`], each choice weighed by the model's probability restricted to the
    /// choices ([`restricted`]: renormalised where their tokens branch) instead of the mean
    /// token log-likelihood.
    Restricted,
    /// Free JSON (greedy, then `retries` seeded samples); when no reply is a valid action, ranked.
    Free,
}

/// Asks the model for each action over the window's live context, as [`Decoding`] says
/// (ranked by default). An action already taken on a page that has not changed
/// since (it did nothing) is not offered again.
#[derive(Debug, Clone, Default)]
pub struct ModelPolicy {
    pub decoding: Decoding,
    /// With [`Decoding::Free`]: extra attempts after the first (greedy) one, sampled with fixed seeds.
    pub retries: usize,
    /// Whether the model writes a plan before the first page ([`super::plan`]; on with
    /// [`ModelPolicy::new`] and [`ModelPolicy::with_retries`]).
    pub plan: bool,
    /// The page of this step ([`PageKey`]).
    page: Option<PageKey>,
    /// Every action of the episode, the page it was taken on and whether it changed it: what
    /// was tried on this page, typed, or done last all derive from it.
    history: Vec<Taken>,
    /// The facts read off the pages of the episode ([`candidates::facts`]) and the URL of the
    /// page each was read on, in order: offered as texts to type on other pages.
    facts: Vec<(String, String)>,
}

/// Most facts of earlier pages offered as texts to type (the latest ones).
const MAX_FACTS: usize = 6;

/// One action of the episode as the next prompts recall it.
#[derive(Debug, Clone)]
struct Taken {
    action: Action,
    words: String,
    /// The page it was taken on.
    page: PageKey,
    /// Whether the page was different at the next step (unknown until then).
    changed: Option<bool>,
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

/// The lines every instruction opens with: the current page and the goal.
fn page_and_goal(obs: &Observation, goal: &str) -> String {
    format!("Current page: {} ({}).\nGoal: {goal}\n", obs.title, obs.url)
}

/// Whether `action` is one the page can take: a complete action of the page's schema.
pub fn valid(obs: &Observation, action: &Action) -> bool {
    ActionSchema::for_page(obs).allows(action)
}

impl ModelPolicy {
    /// The instruction after the window's pages: the current page, the goal, the grammar.
    pub fn instruction(obs: &Observation, goal: &str) -> String {
        format!("{}{ACTION_GRAMMAR}", page_and_goal(obs, goal))
    }

    /// The instruction of a step: the page, the goal, what was done so far, then how to reply
    /// (the actions in words after the recorded example, or for free decoding the JSON grammar).
    pub fn prompt(&self, obs: &Observation, goal: &str) -> String {
        let done = example::done_so_far(self.history.iter().map(|t| (t.words.as_str(), t.changed)));
        match self.decoding {
            Decoding::Ranked | Decoding::Restricted | Decoding::Constrained => format!(
                "{}\nNow this task.\n{}{done}{RANKED_FORM}",
                example::example(),
                page_and_goal(obs, goal)
            ),
            Decoding::Free => format!("{}{done}{ACTION_GRAMMAR}", page_and_goal(obs, goal)),
        }
    }

    /// A model policy that decodes as `decoding` says.
    pub fn new(decoding: Decoding) -> ModelPolicy {
        ModelPolicy {
            decoding,
            plan: true,
            ..ModelPolicy::default()
        }
    }

    /// A free-JSON model policy with `retries` extra attempts per step.
    pub fn with_retries(retries: usize) -> ModelPolicy {
        ModelPolicy {
            decoding: Decoding::Free,
            retries,
            plan: true,
            ..ModelPolicy::default()
        }
    }

    /// Notes the page of this step and the facts on it; the last action learns whether it
    /// changed the page.
    fn seen(&mut self, obs: &Observation) {
        for f in candidates::facts(&obs.text) {
            if !self.facts.iter().any(|(_, v)| *v == f) {
                self.facts.push((obs.url.clone(), f));
            }
        }
        let page = PageKey::of(obs);
        if let Some(last) = self.history.last_mut().filter(|t| t.changed.is_none()) {
            last.changed = Some(last.page != page);
        }
        self.page = Some(page);
    }

    /// Notes `action`, taken on `obs` (the page [`ModelPolicy::seen`] noted this step).
    fn taken(&mut self, action: &Action, obs: &Observation) {
        let page = self.page.clone().unwrap_or_else(|| PageKey::of(obs));
        self.history.push(Taken {
            action: action.clone(),
            words: candidates::words(action, obs),
            page,
            changed: None,
        });
    }

    /// The actions taken earlier on this same page (the same URL and elements): on this page
    /// before it changed, or at an earlier visit of it.
    fn tried(&self) -> impl Iterator<Item = &Action> {
        self.history
            .iter()
            .filter(|t| Some(&t.page) == self.page.as_ref())
            .map(|t| &t.action)
    }

    /// Whether `action` was already taken on this same page (it did nothing, or it led where
    /// the episode has been: taking it again goes round in a loop), or is the last action again
    /// (which, if it changed the page, most often undoes it: a section toggled shut, a checkbox
    /// unticked). Text actions may be retried.
    fn stale(&self, action: &Action) -> bool {
        let last = self.history.last().map(|t| &t.action);
        let again = last == Some(action) || self.tried().any(|a| a == action);
        !matches!(action, Action::Type { .. } | Action::Done { .. }) && again
    }

    /// The page's action the model finds most likely, in words ([`candidates`]): the task's
    /// quoted strings, the facts read on earlier pages and one text the model writes itself are
    /// the texts offered to type; the model's own answer is the answer offered.
    fn ranked(&self, obs: &Observation, mind: &mut Mind<'_>, instruction: &str) -> Result<NextAction> {
        let mut texts = candidates::goal_spans(mind.goal);
        for t in self.earlier_facts(obs) {
            if !texts.contains(&t) {
                texts.push(t);
            }
        }
        let mut timing = CallTimings::default();
        let pool = |texts: &[String]| -> Vec<candidates::Candidate> {
            candidates::candidates(obs, texts)
                .into_iter()
                .filter(|c| !self.stale(&c.action) && !self.fills_again(&c.action, obs))
                .collect()
        };
        let mut cands = pool(&texts);
        // First the kind of action (its verb, the reply's first word), then which one of that
        // kind. Each follows the lead after a space, as a word does in running text.
        let verb = |text: &str| format!(" {}", text.split(' ').next().unwrap_or_default());
        let mut verbs: Vec<String> = cands.iter().map(|c| verb(&c.text)).collect();
        let open_field = obs.interactive().any(|e| e.editable && !self.filled(e));
        if open_field {
            verbs.push(" type".into());
        }
        verbs.push(" answer".into());
        verbs.sort();
        verbs.dedup();
        let kind = mind.llm.rank(&mut mind.view, instruction, example::NEXT, &verbs)?;
        tracing::trace!(scores = ?kind.scores, "ranked kinds");
        timing.prefill_ms += kind.timings.prefill_ms;
        timing.decode_ms += kind.timings.decode_ms;
        let kind = self.choice(&kind).to_string();
        if kind == " answer" {
            let lead = format!("{} answer \"", example::NEXT);
            let (answer, mut call) = self.write(mind, instruction, &lead)?;
            call.timings.prefill_ms += timing.prefill_ms;
            call.timings.decode_ms += timing.decode_ms;
            // An empty answer is not a valid one: the placeholder free texts take.
            let answer = if answer.is_empty() { "-".to_string() } else { answer };
            return Ok(NextAction {
                action: Action::Done { answer },
                model: Some(call),
            });
        }
        if kind == " type" {
            let (own, call) = self.write(mind, instruction, &format!("{} type \"", example::NEXT))?;
            timing.prefill_ms += call.timings.prefill_ms;
            timing.decode_ms += call.timings.decode_ms;
            if !own.is_empty() && !texts.contains(&own) {
                texts.push(own);
                cands = pool(&texts);
            }
        }
        let mut words: Vec<String> = cands
            .iter()
            .filter(|c| verb(&c.text) == kind)
            .map(|c| format!(" {}", c.text))
            .collect();
        if words.is_empty() {
            // Typing was chosen but there is no text to type (no quoted string, and the model
            // wrote none): every other action instead.
            words = cands.iter().map(|c| format!(" {}", c.text)).collect();
        }
        let mut call = mind.llm.rank(&mut mind.view, instruction, example::NEXT, &words)?;
        tracing::trace!(scores = ?call.scores, "ranked candidates");
        let reply = self.choice(&call).trim_start().to_string();
        let Some(choice) = cands.iter().find(|c| c.text == reply) else {
            return Err(Error::Policy {
                tries: 1,
                last: call.output,
            });
        };
        call.timings.prefill_ms += timing.prefill_ms;
        call.timings.decode_ms += timing.decode_ms;
        Ok(NextAction {
            action: choice.action.clone(),
            model: Some(call),
        })
    }

    /// The latest [`MAX_FACTS`] facts read on other pages than `obs`'s (by URL), oldest first.
    fn earlier_facts(&self, obs: &Observation) -> Vec<String> {
        let other: Vec<&String> = self
            .facts
            .iter()
            .filter(|(u, _)| *u != obs.url)
            .map(|(_, v)| v)
            .collect();
        other[other.len().saturating_sub(MAX_FACTS)..]
            .iter()
            .map(|v| (*v).clone())
            .collect()
    }

    /// The choice a `rank` call after [`example::NEXT`] made: the highest mean token
    /// log-likelihood (the call's output), or with [`Decoding::Restricted`] the highest
    /// probability restricted to the choices, where the model reported its tokens.
    fn choice<'c>(&self, call: &'c ModelCall) -> &'c str {
        let restricted = (self.decoding == Decoding::Restricted)
            .then(|| restricted::best(&call.token_scores))
            .flatten();
        restricted.unwrap_or_else(|| call.output.strip_prefix(example::NEXT).unwrap_or_default())
    }

    /// The grammar constrained decoding holds this step's reply to: the page's actions in words
    /// (less those [`ModelPolicy`] does not offer again), typing into each open field, an answer.
    pub fn words(&self, obs: &Observation) -> Words {
        let cands: Vec<candidates::Candidate> = candidates::candidates(obs, &[])
            .into_iter()
            .filter(|c| !self.stale(&c.action))
            .collect();
        let fields: Vec<&Element> = obs.interactive().filter(|e| e.editable && !self.filled(e)).collect();
        Words::new(example::NEXT, obs, &cands, &fields)
    }

    /// Whether `action` types into a field that already holds a text this episode typed (the
    /// check after a `type`: it took, so the field is done).
    fn fills_again(&self, action: &Action, obs: &Observation) -> bool {
        let Action::Type { id: Some(id), .. } = action else {
            return false;
        };
        obs.element(*id).is_some_and(|e| self.filled(e))
    }

    /// Whether field `e` holds a text this episode typed.
    fn filled(&self, e: &Element) -> bool {
        !e.text.is_empty()
            && self
                .history
                .iter()
                .any(|t| matches!(&t.action, Action::Type { text, .. } if *text == e.text))
    }

    /// A text the model writes after `lead` (greedy, up to its closing quote), trimmed, and the
    /// call that wrote it.
    fn write(&self, mind: &mut Mind<'_>, instruction: &str, lead: &str) -> Result<(String, ModelCall)> {
        let grammar = QuotedText { lead };
        let call = mind
            .llm
            .decode(&mut mind.view, instruction, &grammar, mind.max_new_tokens.max(16))?;
        let written = call.output.strip_prefix(lead).unwrap_or(&call.output);
        let text: String = written
            .split('"')
            .next()
            .unwrap_or_default()
            .chars()
            .filter(|c| *c != '\\' && !c.is_control())
            .take(MAX_FREE_CHARS)
            .collect();
        Ok((text.trim().to_string(), call))
    }

    /// Greedy decoding of the next action in words, held to the page's actions ([`Words`]): a
    /// click, check, select or key as listed, a text the model writes into an open field, or an
    /// answer.
    fn constrained(&self, obs: &Observation, mind: &mut Mind<'_>, instruction: &str) -> Result<NextAction> {
        let grammar = self.words(obs);
        // The local model's token mask always ends in an action; a plugged model without one
        // may write something else, and then gets the ranked choice.
        match mind
            .llm
            .decode(&mut mind.view, instruction, &grammar, mind.max_new_tokens.max(64))
        {
            Ok(call) => match grammar.action(&call.output) {
                Some(action) => Ok(NextAction {
                    action,
                    model: Some(call),
                }),
                None => self.ranked(obs, mind, instruction),
            },
            Err(Error::Policy { last, .. }) => {
                tracing::debug!(reply = %last, "not an action of the page: ranked instead");
                self.ranked(obs, mind, instruction)
            }
            Err(e) => Err(e),
        }
    }
}

impl Policy for ModelPolicy {
    fn plan(&mut self, mind: &mut Mind<'_>) -> Result<Option<Planned>> {
        if !self.plan {
            return Ok(None);
        }
        // A plan the action cache holds for this goal over this window is taken as recorded.
        if let Some(c) = mind.cache.as_deref()
            && let Some(text) = c.plan(mind.goal, mind.view.text)?
        {
            return Ok(Some(Planned { text, model: None }));
        }
        let p = plan::write(mind.llm, &mut mind.view, mind.goal)?;
        if let (Some(c), Some(p)) = (mind.cache.as_deref(), &p) {
            c.record_plan(mind.goal, mind.view.text, &p.text)?;
        }
        Ok(p)
    }

    fn next(&mut self, _step: usize, obs: &Observation, mind: &mut Mind<'_>) -> Result<NextAction> {
        self.seen(obs);
        let instruction = self.prompt(obs, mind.goal);
        tracing::trace!(window = %mind.view.text, %instruction, "model policy prompt");
        let mut healing = false;
        if let Some(c) = mind.cache.as_deref_mut() {
            match c.action(mind.goal, obs, mind.origin)? {
                (_, Some(action)) => {
                    self.taken(&action, obs);
                    return Ok(NextAction { action, model: None });
                }
                (u, None) => healing = u == (Use::Decide { healing: true }),
            }
        }
        let decision = match self.decoding {
            Decoding::Constrained => self.constrained(obs, mind, &instruction)?,
            Decoding::Ranked | Decoding::Restricted => self.ranked(obs, mind, &instruction)?,
            Decoding::Free => self.free_or_ranked(obs, mind, &instruction)?,
        };
        if let Some(c) = mind.cache.as_deref_mut() {
            c.record_action(mind.goal, obs, mind.origin, &decision.action, healing);
        }
        self.taken(&decision.action, obs);
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
        let obs = form("");
        p.seen(&obs);
        p.taken(&Action::Scroll { dy: 300.0 }, &obs);
        p.seen(&obs);
        p.taken(&Action::Click { id: 2 }, &obs);
        p.seen(&obs);
        assert!(p.stale(&Action::Scroll { dy: 300.0 }));
        assert!(p.stale(&Action::Click { id: 2 }));
        assert!(!p.stale(&Action::Click { id: 3 }));
        p.taken(&Action::Done { answer: "x".into() }, &obs);
        assert!(!p.stale(&Action::Done { answer: "x".into() }));
    }

    /// An action taken on a page stays stale at a later visit of the same page (it would go
    /// round the same loop); on another page it is offered.
    #[test]
    fn an_action_is_not_repeated_at_a_revisit() {
        let mut p = ModelPolicy::default();
        let (list, other) = (form(""), form("x"));
        p.seen(&list);
        p.taken(&Action::Click { id: 2 }, &list);
        p.seen(&other);
        p.taken(&Action::Key { key: "Enter".into() }, &other);
        p.seen(&other);
        assert!(!p.stale(&Action::Click { id: 2 }), "not taken on this page");
        p.taken(&Action::Scroll { dy: 300.0 }, &other);
        p.seen(&list);
        assert!(
            p.stale(&Action::Click { id: 2 }),
            "taken at the first visit of this page"
        );
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
        p.taken(&Action::Click { id: 1 }, &page(9, "Go"));
        // Another action after it, so that the click is not also the last action.
        p.taken(&Action::Scroll { dy: 300.0 }, &page(9, "Go"));
        p.seen(&page(8, "Go"));
        assert!(
            p.stale(&Action::Click { id: 1 }),
            "the timer ticked; the page did not change"
        );
        p.seen(&page(7, "Gone"));
        assert!(!p.stale(&Action::Click { id: 1 }), "the button changed: a new page");
    }

    fn form(user: &str) -> Observation {
        serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1/miniwob/login-user.html", "title": "Login",
            "text": format!("Username\n[1] input type=text \"{user}\"\n[2] button \"Login\""),
            "elements": [
                {"id": 1, "tag": "input", "text": user, "editable": true, "x": 1.0, "y": 1.0},
                {"id": 2, "tag": "button", "text": "Login", "x": 1.0, "y": 2.0}
            ]
        }))
        .expect("observation")
    }

    /// The check after each action: the next prompt says what was done and whether it changed
    /// the page; a field that took its text is not typed into again; the last action is not
    /// offered right after itself, even when it changed the page.
    #[test]
    fn each_prompt_says_what_was_done_and_what_it_did() {
        let mut p = ModelPolicy::new(Decoding::Ranked);
        let empty = form("");
        p.seen(&empty);
        assert!(p.prompt(&empty, "g").contains("Now this task.\nCurrent page: Login (http://127.0.0.1/miniwob/login-user.html).\nGoal: g\nDone so far: nothing\n"));
        let typed = Action::Type {
            id: Some(1),
            text: "keli".into(),
        };
        p.taken(&typed, &empty);
        let filled = form("keli");
        p.seen(&filled);
        assert!(
            p.prompt(&filled, "g")
                .contains("Done so far:\n- type \"keli\" into text field near \"Username\" [1] (the page changed)\n"),
            "{}",
            p.prompt(&filled, "g")
        );
        assert!(p.fills_again(&typed, &filled), "the field holds what was typed");
        assert!(!p.fills_again(&typed, &empty));
        p.taken(&Action::Click { id: 2 }, &filled);
        let after = form("keli!");
        p.seen(&after);
        assert!(p.stale(&Action::Click { id: 2 }), "the last action, right after itself");
        assert!(
            p.prompt(&after, "g")
                .contains("click button \"Login\" [2] (the page changed)")
        );
        p.taken(&Action::Key { key: "Enter".into() }, &after);
        p.seen(&after);
        assert!(p.prompt(&after, "g").contains("- press Enter (nothing changed)\n"));
        assert!(
            !p.stale(&Action::Click { id: 2 }),
            "no longer the last action, on a changed page"
        );
    }
}
