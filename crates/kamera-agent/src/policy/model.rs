//! The model policy: writes a plan before the first page ([`plan`], pinned in the window), then
//! asks the model for each action among the page's actions written in words (ranked by
//! likelihood by default, or greedy under a token mask, or free JSON with retries). Each prompt
//! carries a recorded example from another task ([`example`]), what was done so far and whether
//! each action changed the page (the check after each action). It never offers again an action
//! already taken on this same page (it did nothing, or it would go round a loop), the last action
//! right after itself, or typing into a field that already holds what it typed. Texts to type are
//! the task's own quoted strings ([`candidates::goal_spans`]), the facts read on earlier pages
//! ([`facts`]; a field named like one, or as the goal names a value, gets that value alone) and
//! what the model writes. On a page reached from another URL, the elements carried over from it
//! (the site's menu) are offered only where the page has no action of its own (ranked: of the
//! kind chosen; [`candidates::page_own_first`]), and a page to read is checked before any answer
//! ([`check`]).

use kamera_browser::{Action, Element, Observation};
use serde::{Deserialize, Serialize};

use super::facts::{self, Facts};
use super::words::Words;
use super::{Mind, NextAction, Planned, Policy, candidates, check, example, plan, restricted};
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
    /// The facts read off the pages of the episode: offered as texts to type on other pages.
    facts: Facts,
}

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

/// Whether `action` types into a field of `autofill` (field id, the value of the fact it is
/// named like) another text than that value.
fn autofilled_otherwise(action: &Action, autofill: &[(u32, &str)]) -> bool {
    let Action::Type { id: Some(id), text } = action else {
        return false;
    };
    autofill.iter().any(|(f, v)| f == id && text != v)
}

impl ModelPolicy {
    /// The instruction after the window's pages: the current page, the goal, the grammar.
    pub fn instruction(obs: &Observation, goal: &str) -> String {
        format!("{}{ACTION_GRAMMAR}", page_and_goal(obs, goal))
    }

    /// The instruction of a step: the page, the goal, what was done so far, then how to reply
    /// (the actions in words after the recorded example, or for free decoding the JSON grammar).
    pub fn prompt(&self, obs: &Observation, goal: &str) -> String {
        let done = self.done_so_far();
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
        self.facts.note(obs);
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
    /// unticked) at the same URL (an element id names the same element only there). A text
    /// typed is stale only on the same page; an answer never is.
    fn stale(&self, action: &Action) -> bool {
        let url = self.page.as_ref().map(|p| p.url.as_str());
        let last = self
            .history
            .last()
            .filter(|t| Some(t.page.url.as_str()) == url)
            .map(|t| &t.action);
        let tried = self.tried().any(|a| a == action);
        match action {
            Action::Done { .. } => false,
            // The same text into the same field of the same page again does what it did.
            Action::Type { .. } => tried,
            _ => tried || last == Some(action),
        }
    }

    /// The page's action the model finds most likely, in words ([`candidates`]): the task's
    /// quoted strings, the facts read on earlier pages and one text the model writes itself are
    /// the texts offered to type; the model's own answer is the answer offered.
    fn ranked(&self, obs: &Observation, mind: &mut Mind<'_>, instruction: &str) -> Result<NextAction> {
        let mut texts = candidates::goal_spans(mind.goal);
        let autofill = self.autofill(obs);
        for t in self
            .facts
            .offered(obs)
            .into_iter()
            .chain(autofill.iter().map(|(_, v)| v.to_string()))
        {
            if !texts.contains(&t) {
                texts.push(t);
            }
        }
        let mut timing = CallTimings::default();
        let pool = |texts: &[String]| -> Vec<candidates::Candidate> {
            candidates::candidates(obs, texts)
                .into_iter()
                .filter(|c| !self.stale(&c.action) && !self.fills_again(&c.action, obs))
                .filter(|c| !autofilled_otherwise(&c.action, &autofill))
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
        let carried = self.carried_over(obs);
        let read = self.read_here(obs, &carried, mind, &mut timing)?;
        if read != Some(false) {
            verbs.push(" answer".into());
        }
        verbs.sort();
        verbs.dedup();
        let kind = if read == Some(true) {
            " answer".to_string()
        } else {
            let kind = mind.llm.rank(&mut mind.view, instruction, example::NEXT, &verbs)?;
            tracing::trace!(scores = ?kind.scores, "ranked kinds");
            timing.prefill_ms += kind.timings.prefill_ms;
            timing.decode_ms += kind.timings.decode_ms;
            self.choice(&kind).to_string()
        };
        if kind == " answer" {
            return self.answer(obs, mind, instruction, timing);
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
        let of_kind: Vec<candidates::Candidate> = cands.iter().filter(|c| verb(&c.text) == kind).cloned().collect();
        let mut words: Vec<String> = candidates::page_own_first(of_kind, &carried)
            .iter()
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

    /// On a page to read ([`check::to_read`]), whether it shows what the goal asks for (a fact
    /// the goal names, [`check::goal_named_fact`], or else the model says so,
    /// [`check::shows_answer`]): the policy answers there, or does not answer there; `None` on
    /// other pages. The check's time is added to `timing`.
    fn read_here(
        &self,
        obs: &Observation,
        carried: &[u32],
        mind: &mut Mind<'_>,
        timing: &mut CallTimings,
    ) -> Result<Option<bool>> {
        if !check::to_read(obs, carried) {
            return Ok(None);
        }
        if let Some((label, value)) = check::goal_named_fact(obs, mind.goal) {
            tracing::debug!(%label, %value, "page to read states what the goal names: answer here");
            return Ok(Some(true));
        }
        let opening = format!("{}{}", page_and_goal(obs, mind.goal), self.done_so_far());
        let (yes, call) = check::shows_answer(mind, &opening)?;
        timing.prefill_ms += call.timings.prefill_ms;
        timing.decode_ms += call.timings.decode_ms;
        Ok(Some(yes))
    }

    /// What was done so far, as every prompt says it ([`example::done_so_far`]).
    fn done_so_far(&self) -> String {
        example::done_so_far(self.history.iter().map(|t| (t.words.as_str(), t.changed)))
    }

    /// The elements of `obs` carried over from the page the episode came from to this URL
    /// ([`candidates::carried_over`]): the page of the latest action taken at another URL.
    fn carried_over(&self, obs: &Observation) -> Vec<u32> {
        self.history
            .iter()
            .rev()
            .find(|t| t.page.url != obs.url)
            .map_or_else(Vec::new, |t| {
                candidates::carried_over(&t.page.url, &t.page.elements, obs)
            })
    }

    /// The answer the model writes after `instruction` (an empty one is the placeholder free
    /// texts take), a span of a value the page states where it states one the goal names; the
    /// time of the calls before it (`timing`) is added to its call's.
    fn answer(
        &self,
        obs: &Observation,
        mind: &mut Mind<'_>,
        instruction: &str,
        timing: CallTimings,
    ) -> Result<NextAction> {
        let lead = format!("{} answer \"", example::NEXT);
        // Where the page states what the goal names, the model writes a span of one of the
        // values the page states (not of the examples, not of earlier pages): a copy, valid by
        // construction.
        let values: Option<String> = check::goal_named_fact(obs, mind.goal).map(|_| {
            facts::labelled(&obs.text)
                .into_iter()
                .map(|(_, v)| v)
                .collect::<Vec<_>>()
                .join("\n")
        });
        let within = values.as_deref();
        let (answer, mut call) = self.write_in(mind, instruction, QuotedText { lead: &lead, within })?;
        call.timings.prefill_ms += timing.prefill_ms;
        call.timings.decode_ms += timing.decode_ms;
        let answer = if answer.is_empty() { "-".to_string() } else { answer };
        Ok(NextAction {
            action: Action::Done { answer },
            model: Some(call),
        })
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
        self.words_given(obs, &self.carried_over(obs))
    }

    /// [`ModelPolicy::words`] with the elements `carried` over to `obs` already found.
    fn words_given(&self, obs: &Observation, carried: &[u32]) -> Words {
        let autofill = self.autofill(obs);
        let values: Vec<String> = autofill.iter().map(|(_, v)| v.to_string()).collect();
        // Literal texts only where a field is named like a fact (its value, into it alone).
        let cands: Vec<candidates::Candidate> = candidates::candidates(obs, &values)
            .into_iter()
            .filter(|c| !self.stale(&c.action) && !self.fills_again(&c.action, obs))
            .filter(|c| match &c.action {
                Action::Type { id: Some(id), text } => autofill.iter().any(|(f, v)| f == id && text == v),
                _ => true,
            })
            .collect();
        let cands = candidates::page_own_first(cands, carried);
        let fields: Vec<&Element> = obs
            .interactive()
            .filter(|e| e.editable && !self.filled(e) && !autofill.iter().any(|(f, _)| *f == e.id))
            .collect();
        Words::new(example::NEXT, obs, &cands, &fields)
    }

    /// The fields of `obs` named like a fact read on another page, and that fact's value
    /// ([`Facts::for_field`]).
    fn autofill<'a>(&'a self, obs: &Observation) -> Vec<(u32, &'a str)> {
        obs.interactive()
            .filter_map(|e| Some((e.id, self.facts.for_field(e, obs)?)))
            .collect()
    }

    /// Whether `action` types into, or clicks, a field that already holds a text this episode
    /// typed (the check after a `type`: it took, so the field is done; a click there only
    /// focuses it).
    fn fills_again(&self, action: &Action, obs: &Observation) -> bool {
        let (Action::Type { id: Some(id), .. } | Action::Click { id }) = action else {
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
        self.write_in(mind, instruction, QuotedText { lead, within: None })
    }

    /// A text the model writes under `grammar` (greedy, up to its closing quote), trimmed, and
    /// the call that wrote it.
    fn write_in(&self, mind: &mut Mind<'_>, instruction: &str, grammar: QuotedText<'_>) -> Result<(String, ModelCall)> {
        let lead = grammar.lead;
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
        let mut timing = CallTimings::default();
        let carried = self.carried_over(obs);
        let read = self.read_here(obs, &carried, mind, &mut timing)?;
        if read == Some(true) {
            return self.answer(obs, mind, instruction, timing);
        }
        let grammar = match read {
            Some(false) => self.words_given(obs, &carried).without_answer(),
            _ => self.words_given(obs, &carried),
        };
        // The local model's token mask always ends in an action; a plugged model without one
        // may write something else, and then gets the ranked choice.
        match mind
            .llm
            .decode(&mut mind.view, instruction, &grammar, mind.max_new_tokens.max(64))
        {
            Ok(mut call) => match grammar.action(&call.output) {
                Some(action) => {
                    call.timings.prefill_ms += timing.prefill_ms;
                    call.timings.decode_ms += timing.decode_ms;
                    Ok(NextAction {
                        action,
                        model: Some(call),
                    })
                }
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
        self.facts.note_goal(mind.goal);
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
mod tests;
