//! Policies pick the next action: [`ScriptedPolicy`] follows a scenario's steps and asks the
//! model only the scenario's questions; [`ModelPolicy`] prompts the model with an action grammar
//! and takes its JSON when it names a valid action, else ranks the page's valid actions by the
//! model's likelihood, so every step ends with an action the page can take.

use kamera_browser::{Action, Element, Observation};
use std::collections::HashMap;

use crate::cache::{ActionCache, Use};
use crate::error::{Error, Result};
use crate::llm::{ModelCall, parse_action};
use crate::lm::{LanguageModel, View};
use crate::scenario::Step;
use crate::schema::{ActionSchema, LEAD, MAX_FREE_CHARS, Template};
use serde::{Deserialize, Serialize};

/// What a policy sees of the model: the model to ask (the local [`crate::Llm`] unless one was
/// plugged), the window (the session's live context, placed by the scheduler, and its text) and
/// the goal. Model calls append their prompt to the context and cut it off again.
pub struct Mind<'a> {
    pub llm: &'a dyn LanguageModel,
    pub view: View<'a>,
    pub goal: &'a str,
    pub max_new_tokens: usize,
    /// The action cache, when the run keeps one: scripted targets and answers, and the model
    /// policy's actions, are looked up there first and recorded there.
    pub cache: Option<&'a mut ActionCache>,
    /// The served origin (the cache keys URLs without it).
    pub origin: &'a str,
}

/// A policy's choice for one step.
#[derive(Debug, Clone)]
pub struct Decision {
    pub action: Action,
    /// The model call behind the action, when there was one.
    pub model: Option<ModelCall>,
}

/// Picks the next action. Synchronous: model work runs on the caller's blocking thread.
pub trait Policy: Send {
    fn next(&mut self, step: usize, obs: &Observation, mind: &mut Mind<'_>) -> Result<Decision>;
    /// The question the next model call will answer, when the policy knows it ahead: the
    /// session recalls the chunks relevant to it (with the goal and [`Policy::memory`]) first.
    fn focus(&self) -> Option<String> {
        None
    }
    /// Values the policy has read off pages so far (they make the pages that hold them relevant).
    fn memory(&self) -> Vec<String> {
        Vec::new()
    }
    /// Asks for the last acting step again (a replayed cached step did nothing); `false`: the
    /// policy has no such step (it decides afresh anyway).
    fn retry_last(&mut self) -> bool {
        false
    }
}

/// Follows scripted [`Step`]s; `remember` steps read values off the page without acting.
pub struct ScriptedPolicy {
    steps: Vec<Step>,
    cursor: usize,
    /// The cursor of the last step that acted.
    last: usize,
    vars: HashMap<String, String>,
    origin: String,
}

impl ScriptedPolicy {
    /// `origin` resolves `navigate = "/path"` steps.
    pub fn new(steps: Vec<Step>, origin: &str) -> ScriptedPolicy {
        ScriptedPolicy {
            steps,
            cursor: 0,
            last: 0,
            vars: HashMap::new(),
            origin: origin.trim_end_matches('/').to_string(),
        }
    }

    /// The name of a remembered value that `text` contains, if any.
    fn remembered_in(&self, text: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(_, v)| !v.is_empty() && text.contains(v.as_str()))
            .map(|(k, _)| k.as_str())
    }

    fn subst(&self, s: &str) -> String {
        let mut out = s.to_string();
        for (k, v) in &self.vars {
            out = out.replace(&format!("${k}"), v);
        }
        out
    }
}

/// Resolves a target (`#html-id`, `text:Visible`, `[3]`) to an element id of `obs`.
pub fn resolve_target(obs: &Observation, target: &str) -> Option<u32> {
    let t = target.trim();
    if let Some(h) = t.strip_prefix('#') {
        return obs.by_html_id(h).map(|e| e.id);
    }
    if let Some(x) = t.strip_prefix("text:") {
        return obs.by_text(x).map(|e| e.id);
    }
    if let Some(n) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return n.parse().ok().filter(|id| obs.element(*id).is_some());
    }
    obs.by_text(t).map(|e| e.id)
}

/// What kind of element a scripted step's target must be (the candidates a model may pick).
#[derive(Debug, Clone, Copy)]
enum Want {
    Any,
    Editable,
    Options,
    Checkable,
}

impl Want {
    fn fits(self, e: &Element) -> bool {
        e.interactive
            && match self {
                Want::Any => true,
                Want::Editable => e.editable,
                Want::Options => !e.options.is_empty(),
                Want::Checkable => e.checked.is_some(),
            }
    }
}

/// A scripted step's target (`instruction`: the step as written, e.g. `click text:Orders`;
/// `t`: its selector). With an action cache: the cached target where its features find it,
/// else the selector's element; where the cached target is gone (or led elsewhere) or the
/// selector matches nothing, one model call picks the element (the returned call). Without a
/// cache: the selector's element, or an error naming it.
fn step_target(
    mind: &mut Mind<'_>,
    obs: &Observation,
    instruction: &str,
    t: &str,
    want: Want,
) -> Result<(u32, Option<ModelCall>)> {
    let no_match = || Error::Step {
        step: 0,
        detail: format!("no element matches {t:?} on {}", obs.url),
    };
    let Some(cache) = mind.cache.as_deref_mut() else {
        return resolve_target(obs, t).map(|id| (id, None)).ok_or_else(no_match);
    };
    let (u, id, known) = cache.target(instruction, obs, mind.origin)?;
    if let Some(id) = id {
        return Ok((id, None));
    }
    let healing = u == (Use::Decide { healing: true });
    let by_selector = if healing { None } else { resolve_target(obs, t) };
    let (id, call) = match by_selector {
        Some(id) => (id, None),
        None if known.is_some() && kind_match(obs, want, known.as_ref()).is_some() => {
            let id = kind_match(obs, want, known.as_ref()).unwrap_or_default();
            tracing::info!(instruction, id, "action cache: the only element of the recorded kind");
            (id, None)
        }
        None => {
            let mut cands: Vec<&Element> = obs.elements.iter().filter(|e| want.fits(e)).collect();
            // A redesign rarely turns a button into a field: the elements of the recorded kind
            // (tag and editability) when there are any. SmolLM2-135M, asked among all of a
            // page's elements, took its first link for a renamed form button.
            if let Some(k) = &known {
                let same: Vec<&Element> = cands
                    .iter()
                    .copied()
                    .filter(|e| e.tag == k.tag && e.editable == k.editable)
                    .collect();
                if !same.is_empty() {
                    cands = same;
                }
            }
            if cands.is_empty() {
                return Err(no_match());
            }
            // Candidates as the page lists them but without their ids (a number says nothing of
            // the element and biases the likelihood).
            let texts: Vec<String> = cands
                .iter()
                .map(|e| format!("{} \"{}\"", e.tag, e.text.trim()))
                .collect();
            let was = known
                .map(|k| format!(" The element was {}.", k.describe()))
                .unwrap_or_default();
            let q = format!(
                "The page changed since this step was recorded: {instruction}.{was}\nThe page's elements now: {}.\nWhich element does the step mean now?",
                texts.join(", ")
            );
            let call = mind.llm.rank(&mut mind.view, &q, "", &texts)?;
            let pick = texts
                .iter()
                .position(|x| *x == call.output)
                .ok_or_else(|| Error::Policy {
                    tries: 1,
                    last: call.output.clone(),
                })?;
            tracing::info!(instruction, picked = %texts[pick], "action cache: the model re-inferred a target");
            (cands[pick].id, Some(call))
        }
    };
    if let Some(c) = mind.cache.as_deref_mut() {
        c.record_target(instruction, obs, mind.origin, id, healing);
    }
    Ok((id, call))
}

/// The one interactive element of `obs` with the recorded target's tag and editability that
/// the step can act on, when there is exactly one.
fn kind_match(obs: &Observation, want: Want, known: Option<&crate::cache::Target>) -> Option<u32> {
    let k = known?;
    let mut it = obs
        .elements
        .iter()
        .filter(|e| want.fits(e) && e.tag == k.tag && e.editable == k.editable);
    match (it.next(), it.next()) {
        (Some(e), None) => Some(e.id),
        _ => None,
    }
}

impl Policy for ScriptedPolicy {
    fn focus(&self) -> Option<String> {
        self.steps[self.cursor.min(self.steps.len())..]
            .iter()
            .find(|s| !matches!(s, Step::Remember { .. }))
            .and_then(|s| match s {
                Step::Ask { question, .. } => Some(self.subst(question)),
                _ => None,
            })
    }

    fn memory(&self) -> Vec<String> {
        self.vars.values().cloned().collect()
    }

    fn retry_last(&mut self) -> bool {
        self.cursor = self.last;
        true
    }

    fn next(&mut self, _step: usize, obs: &Observation, mind: &mut Mind<'_>) -> Result<Decision> {
        loop {
            let i = self.cursor;
            let Some(st) = self.steps.get(i).cloned() else {
                return Ok(Decision {
                    action: Action::Done { answer: String::new() },
                    model: None,
                });
            };
            self.cursor += 1;
            let bad = |detail: String| Error::Step { step: i + 1, detail };
            let mut call = None;
            let mut target = |verb: &str, want: Want, t: &str| -> Result<u32> {
                let t = self.subst(t);
                let (id, c) = step_target(mind, obs, &format!("{verb} {t}"), &t, want).map_err(|e| match e {
                    Error::Step { detail, .. } => bad(detail),
                    e => e,
                })?;
                if c.is_some() {
                    call = c;
                }
                Ok(id)
            };
            let action = match st {
                Step::Remember { name, regex } => {
                    let re = regex::Regex::new(&regex).map_err(|e| bad(e.to_string()))?;
                    let cap = re
                        .captures(&obs.text)
                        .and_then(|c| c.get(1).or(c.get(0)))
                        .ok_or_else(|| bad(format!("regex {:?} matches nothing on {}", re.as_str(), obs.url)))?;
                    self.vars.insert(name, cap.as_str().to_string());
                    continue;
                }
                Step::Ask { question, choices } => {
                    let q = self.subst(&question);
                    let mut healing = false;
                    if let Some(c) = mind.cache.as_deref_mut() {
                        match c.answer(&q, obs, mind.origin, mind.view.text)? {
                            (_, Some(answer)) => {
                                return Ok(Decision {
                                    action: Action::Done { answer },
                                    model: None,
                                });
                            }
                            (u, None) => healing = u == (Use::Decide { healing: true }),
                        }
                    }
                    let call = if choices.is_empty() {
                        mind.llm.generate(
                            &mut mind.view,
                            &format!("Question: {q}\nAnswer briefly."),
                            mind.max_new_tokens,
                            0,
                        )?
                    } else {
                        mind.llm.choose(&mut mind.view, &q, &choices)?
                    };
                    if let Some(c) = mind.cache.as_deref_mut() {
                        c.record_answer(&q, obs, mind.origin, mind.view.text, call.output.trim(), healing)?;
                    }
                    return Ok(Decision {
                        action: Action::Done {
                            answer: call.output.trim().to_string(),
                        },
                        model: Some(call),
                    });
                }
                Step::Click { target: t } => Action::Click {
                    id: target("click", Want::Any, &t)?,
                },
                Step::Type { text, into } => {
                    let id = match &into {
                        Some(t) => Some(target("type into", Want::Editable, t)?),
                        None => None,
                    };
                    let text = self.subst(&text);
                    // A remembered value goes only into the field the scenario names, never into
                    // whatever has the focus (a page can move it).
                    if id.is_none()
                        && let Some(name) = self.remembered_in(&text)
                    {
                        return Err(bad(format!(
                            "typing remembered ${name} needs `into` naming the field it goes into"
                        )));
                    }
                    Action::Type { id, text }
                }
                Step::Select { target: t, option } => Action::Select {
                    id: target("select in", Want::Options, &t)?,
                    option: self.subst(&option),
                },
                Step::Check { target: t } => Action::Check {
                    id: target("check", Want::Checkable, &t)?,
                },
                Step::Uncheck { target: t } => Action::Uncheck {
                    id: target("uncheck", Want::Checkable, &t)?,
                },
                Step::Hover { target: t } => Action::Hover {
                    id: target("hover", Want::Any, &t)?,
                },
                Step::Drag { from, to } => Action::Drag {
                    from: target("drag", Want::Any, &from)?,
                    to: target("drop on", Want::Any, &to)?,
                },
                Step::ScrollTo { target: t } => Action::ScrollTo {
                    id: target("scroll to", Want::Any, &t)?,
                },
                Step::SwitchTab { index } => Action::SwitchTab { index },
                Step::WaitFor { target: t, ms } => Action::WaitFor {
                    target: self.subst(&t),
                    ms,
                },
                Step::Key { key } => Action::Key { key },
                Step::Navigate { url } => {
                    let u = self.subst(&url);
                    let url = if u.starts_with('/') {
                        format!("{}{u}", self.origin)
                    } else {
                        u
                    };
                    Action::Navigate { url }
                }
                Step::Back => Action::Back,
                Step::Scroll { dy } => Action::Scroll { dy },
                Step::Wait { ms } => Action::Wait { ms },
            };
            self.last = i;
            return Ok(Decision { action, model: call });
        }
    }
}

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
    fn ranked(&self, obs: &Observation, mind: &mut Mind<'_>, instruction: &str) -> Result<Decision> {
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
    fn constrained(&self, obs: &Observation, mind: &mut Mind<'_>, instruction: &str) -> Result<Decision> {
        let schema = self.schema(obs);
        let call = mind
            .llm
            .generate_constrained(&mut mind.view, instruction, &schema, mind.max_new_tokens.max(24))?;
        decided(&schema, call)
    }
}

impl Policy for ModelPolicy {
    fn next(&mut self, _step: usize, obs: &Observation, mind: &mut Mind<'_>) -> Result<Decision> {
        let instruction = ModelPolicy::instruction(obs, mind.goal);
        self.seen(obs);
        let mut healing = false;
        if let Some(c) = mind.cache.as_deref_mut() {
            match c.action(mind.goal, obs, mind.origin)? {
                (_, Some(action)) => {
                    self.tried.push(action.clone());
                    return Ok(Decision { action, model: None });
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
    fn free_or_ranked(&self, obs: &Observation, mind: &mut Mind<'_>, instruction: &str) -> Result<Decision> {
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
                    return Ok(Decision {
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
fn decided(schema: &ActionSchema, call: ModelCall) -> Result<Decision> {
    let action = schema.action(&call.output).ok_or_else(|| Error::Policy {
        tries: 1,
        last: call.output.clone(),
    })?;
    Ok(Decision {
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

    /// A remembered value is typed only into a field the scenario names.
    #[test]
    fn remembered_values_need_a_named_field() {
        let mut p = ScriptedPolicy::new(
            vec![Step::Type {
                text: "code $secret".into(),
                into: None,
            }],
            "http://127.0.0.1:1",
        );
        p.vars.insert("secret".into(), "TRK-1".into());
        assert_eq!(p.remembered_in("code TRK-1"), Some("secret"));
        assert_eq!(p.remembered_in("nothing"), None);
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
