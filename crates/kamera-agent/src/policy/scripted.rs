//! The scripted policy: follows a scenario's steps, resolving each step's target on the page
//! (by the cache, then by name or kind), and asks the model only the scenario's questions.

use std::collections::HashMap;

use kamera_browser::{Action, Element, Observation};

use super::{Mind, NextAction, Policy};
use crate::cache::Use;
use crate::error::{Error, Result};
use crate::llm::ModelCall;
use crate::scenario::ScriptStep;

/// Follows scripted [`ScriptStep`]s; `remember` steps read values off the page without acting.
pub struct ScriptedPolicy {
    steps: Vec<ScriptStep>,
    cursor: usize,
    /// The cursor of the last step that acted.
    last: usize,
    vars: HashMap<String, String>,
    origin: String,
    /// The folder `upload` steps take files from (the scenario's `uploads`).
    uploads: Option<std::path::PathBuf>,
}

impl ScriptedPolicy {
    /// `origin` resolves `navigate = "/path"` steps.
    pub fn new(steps: Vec<ScriptStep>, origin: &str) -> ScriptedPolicy {
        ScriptedPolicy {
            steps,
            cursor: 0,
            last: 0,
            vars: HashMap::new(),
            origin: origin.trim_end_matches('/').to_string(),
            uploads: None,
        }
    }

    /// Lets `upload` steps take files from `folder` (the scenario's `uploads`); without it they
    /// fail, naming the step.
    pub fn with_uploads(mut self, folder: Option<std::path::PathBuf>) -> ScriptedPolicy {
        self.uploads = folder;
        self
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
            .find(|s| !matches!(s, ScriptStep::Remember { .. }))
            .and_then(|s| match s {
                ScriptStep::Ask { question, .. } => Some(self.subst(question)),
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

    // Long: one match arm per scenario step kind.
    fn next(&mut self, _step: usize, obs: &Observation, mind: &mut Mind<'_>) -> Result<NextAction> {
        loop {
            let i = self.cursor;
            let Some(st) = self.steps.get(i).cloned() else {
                return Ok(NextAction {
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
                ScriptStep::Remember { name, regex } => {
                    let re = regex::Regex::new(&regex).map_err(|e| bad(e.to_string()))?;
                    let cap = re
                        .captures(&obs.text)
                        .and_then(|c| c.get(1).or(c.get(0)))
                        .ok_or_else(|| bad(format!("regex {:?} matches nothing on {}", re.as_str(), obs.url)))?;
                    self.vars.insert(name, cap.as_str().to_string());
                    continue;
                }
                ScriptStep::Ask { question, choices } => {
                    let q = self.subst(&question);
                    let mut healing = false;
                    if let Some(c) = mind.cache.as_deref_mut() {
                        match c.answer(&q, obs, mind.origin, mind.view.text)? {
                            (_, Some(answer)) => {
                                return Ok(NextAction {
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
                    return Ok(NextAction {
                        action: Action::Done {
                            answer: call.output.trim().to_string(),
                        },
                        model: Some(call),
                    });
                }
                ScriptStep::Click { target: t } => Action::Click {
                    id: target("click", Want::Any, &t)?,
                },
                ScriptStep::Type { text, into } => {
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
                ScriptStep::Select { target: t, option } => Action::Select {
                    id: target("select in", Want::Options, &t)?,
                    option: self.subst(&option),
                },
                ScriptStep::Check { target: t } => Action::Check {
                    id: target("check", Want::Checkable, &t)?,
                },
                ScriptStep::Uncheck { target: t } => Action::Uncheck {
                    id: target("uncheck", Want::Checkable, &t)?,
                },
                ScriptStep::Hover { target: t } => Action::Hover {
                    id: target("hover", Want::Any, &t)?,
                },
                ScriptStep::Drag { from, to } => Action::Drag {
                    from: target("drag", Want::Any, &from)?,
                    to: target("drop on", Want::Any, &to)?,
                },
                ScriptStep::ScrollTo { target: t } => Action::ScrollTo {
                    id: target("scroll to", Want::Any, &t)?,
                },
                ScriptStep::Upload { target: t, path } => {
                    // The path as written (never a remembered value: a page cannot choose the
                    // file), checked on disk to lie in the scenario's folder.
                    let path = crate::scenario::upload_file(self.uploads.as_deref(), i + 1, &path)?;
                    Action::Upload {
                        id: target("upload to", Want::Any, &t)?,
                        path,
                    }
                }
                ScriptStep::SwitchTab { index } => Action::SwitchTab { index },
                ScriptStep::WaitFor { target: t, ms } => Action::WaitFor {
                    target: self.subst(&t),
                    ms,
                },
                ScriptStep::Key { key } => Action::Key { key },
                ScriptStep::Navigate { url } => {
                    let u = self.subst(&url);
                    let url = if u.starts_with('/') {
                        format!("{}{u}", self.origin)
                    } else {
                        u
                    };
                    Action::Navigate { url }
                }
                ScriptStep::Back => Action::Back,
                ScriptStep::Scroll { dy } => Action::Scroll { dy },
                ScriptStep::Wait { ms } => Action::Wait { ms },
            };
            self.last = i;
            return Ok(NextAction { action, model: call });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A remembered value is typed only into a field the scenario names.
    #[test]
    fn remembered_values_need_a_named_field() {
        let mut p = ScriptedPolicy::new(
            vec![ScriptStep::Type {
                text: "code $secret".into(),
                into: None,
            }],
            "http://127.0.0.1:1",
        );
        p.vars.insert("secret".into(), "TRK-1".into());
        assert_eq!(p.remembered_in("code TRK-1"), Some("secret"));
        assert_eq!(p.remembered_in("nothing"), None);
    }
}
