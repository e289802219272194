//! Policies pick the next action: [`ScriptedPolicy`] follows a scenario's steps and asks the
//! model only the scenario's questions; [`ModelPolicy`] prompts the model with an action grammar
//! and parses strict JSON, retrying a bounded number of times.

use kamera_browser::{Action, Observation};
use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::llm::{Llm, ModelCall, Part, parse_action};
use crate::scenario::Step;

/// What a policy sees of the model: the context window's chunks, in order, and the goal.
pub struct Mind<'a> {
    pub llm: &'a Llm,
    /// Prefix chunk then page chunks, each canonical (relocated and patched on assembly).
    pub chunks: Vec<Part>,
    pub goal: &'a str,
    pub max_new_tokens: usize,
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
}

/// Follows scripted [`Step`]s; `remember` steps read values off the page without acting.
pub struct ScriptedPolicy {
    steps: Vec<Step>,
    cursor: usize,
    vars: HashMap<String, String>,
    origin: String,
}

impl ScriptedPolicy {
    /// `origin` resolves `navigate = "/path"` steps.
    pub fn new(steps: Vec<Step>, origin: &str) -> ScriptedPolicy {
        ScriptedPolicy {
            steps,
            cursor: 0,
            vars: HashMap::new(),
            origin: origin.trim_end_matches('/').to_string(),
        }
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

impl Policy for ScriptedPolicy {
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
            let target = |t: &str| {
                let t = self.subst(t);
                resolve_target(obs, &t).ok_or_else(|| bad(format!("no element matches {t:?} on {}", obs.url)))
            };
            let action = if let Some(name) = &st.remember {
                let re = regex::Regex::new(st.regex.as_deref().unwrap_or("")).map_err(|e| bad(e.to_string()))?;
                let cap = re
                    .captures(&obs.text)
                    .and_then(|c| c.get(1).or(c.get(0)))
                    .ok_or_else(|| bad(format!("regex {:?} matches nothing on {}", re.as_str(), obs.url)))?;
                self.vars.insert(name.clone(), cap.as_str().to_string());
                continue;
            } else if let Some(q) = &st.ask {
                let q = self.subst(q);
                let call = if st.choices.is_empty() {
                    mind.llm.generate(
                        &mind.chunks,
                        &format!("Question: {q}\nAnswer briefly."),
                        mind.max_new_tokens,
                        0,
                    )?
                } else {
                    mind.llm.choose(&mind.chunks, &q, &st.choices)?
                };
                return Ok(Decision {
                    action: Action::Done {
                        answer: call.output.trim().to_string(),
                    },
                    model: Some(call),
                });
            } else if let Some(t) = &st.click {
                Action::Click { id: target(t)? }
            } else if let Some(text) = &st.r#type {
                let id = match &st.into {
                    Some(t) => Some(target(t)?),
                    None => None,
                };
                Action::Type {
                    id,
                    text: self.subst(text),
                }
            } else if let Some(k) = &st.key {
                Action::Key { key: k.clone() }
            } else if let Some(u) = &st.navigate {
                let u = self.subst(u);
                let url = if u.starts_with('/') {
                    format!("{}{u}", self.origin)
                } else {
                    u
                };
                Action::Navigate { url }
            } else if st.back.is_some() {
                Action::Back
            } else if let Some(dy) = st.scroll {
                Action::Scroll { dy }
            } else if let Some(ms) = st.wait_ms {
                Action::Wait { ms }
            } else {
                return Err(bad("empty step".into()));
            };
            return Ok(Decision { action, model: None });
        }
    }
}

/// Asks the model for each action as strict JSON.
pub struct ModelPolicy {
    /// Extra attempts after the first (greedy) one; retries sample with fixed seeds.
    pub retries: usize,
}

impl Default for ModelPolicy {
    fn default() -> Self {
        ModelPolicy { retries: 2 }
    }
}

/// The action grammar shown to the model.
pub const ACTION_GRAMMAR: &str = r#"Reply with exactly one JSON object and nothing else, one of:
{"action":"click","id":N}
{"action":"type","id":N,"text":"..."}
{"action":"key","key":"Enter"}
{"action":"scroll","dy":300}
{"action":"back"}
{"action":"done","answer":"..."}
N is the number in brackets before an element on the current page."#;

impl Policy for ModelPolicy {
    fn next(&mut self, _step: usize, obs: &Observation, mind: &mut Mind<'_>) -> Result<Decision> {
        let instruction = format!(
            "Current page: {} ({}).\nGoal: {}\n{ACTION_GRAMMAR}",
            obs.title, obs.url, mind.goal
        );
        let mut last = String::new();
        for attempt in 0..=self.retries {
            // The reply is started as a JSON object so the model only has to fill it in.
            let lead = "{\"action\": \"";
            let call = mind.llm.generate_after(
                &mind.chunks,
                &instruction,
                lead,
                mind.max_new_tokens.max(24),
                attempt as u64,
            )?;
            last = call.output.clone();
            match parse_action(&call.output) {
                Ok(action) => {
                    let valid = match &action {
                        Action::Click { id } | Action::Type { id: Some(id), .. } => obs.element(*id).is_some(),
                        Action::Navigate { .. } | Action::ClickXy { .. } => false,
                        _ => true,
                    };
                    if valid {
                        return Ok(Decision {
                            action,
                            model: Some(call),
                        });
                    }
                    tracing::debug!(attempt, output = %call.output, "model action names no element of the page");
                }
                Err(e) => tracing::debug!(attempt, error = %e, output = %call.output, "model output is not an action"),
            }
        }
        Err(Error::Policy {
            tries: self.retries + 1,
            last,
        })
    }
}
