//! One step at a time on an [`Agent`]: observe the page into the session, navigate, perform an
//! action given by the caller (a scripted [`ScriptStep`]), and read values off the page, checked
//! against a Rust type ([`Agent::extract`]) or decoded under a JSON Schema
//! ([`Agent::extract_json`]).

use kamera_browser::Observation;
use serde::de::DeserializeOwned;

use super::Agent;
use crate::agent::{blocking, chunk_text};
use crate::error::{Error, Result};
use crate::json_schema::JsonGrammar;
use crate::language_model::{LanguageModel, View};
use crate::policy::{Policy, ScriptedPolicy};
use crate::scenario::ScriptStep;
use crate::schema::{Fit, Grammar};
use crate::trace::StepRecord;

impl Agent {
    /// The current page (starting at `start_url` when nothing has run yet), met by the session
    /// as a run's step meets it: its text as one or more chunks, its screenshot as an image chunk
    /// (with a vision-language model), or both, as [`crate::AgentBuilder::observe`] says. A page
    /// seen before is a hit or a recall, not a new prefill.
    pub async fn observe(&mut self) -> Result<Observation> {
        self.start().await?;
        let obs = self.browser().await?.observe().await?;
        let text = chunk_text(&obs, &self.env.origin);
        let observe = self.scenario.observe;
        let prefix = self.llm.prefix_text(self.standing_goal());
        let session = &mut self.session;
        blocking(|| -> Result<()> {
            if session.pinned_tokens() == 0 {
                session.pin(&prefix)?;
            }
            if observe.text() {
                session.observe_page(&text)?;
            }
            if observe.screenshot() {
                session.observe_screenshot(&obs.screenshot_png)?;
            }
            Ok(())
        })?;
        Ok(obs)
    }

    /// Loads `url` in the agent's browser; a URL off the allowed origins is refused
    /// ([`Error::Browser`] holding kamera-browser's `Refused`, naming the URL).
    pub async fn navigate(&mut self, url: &str) -> Result<()> {
        // A first call goes where it is told, not to `start_url`.
        self.env.start_url.clear();
        self.browser().await?.navigate(url).await?;
        Ok(())
    }

    /// Carries out one action step as a scenario would (`click`, `type`, `select`, `check`,
    /// `uncheck`, `hover`, `drag`, `scroll_to`, `switch_tab`, `wait_for`, `key`, `navigate`,
    /// `back`, `scroll`, `wait_ms`): the page is observed into the session, the step's targets
    /// resolved on it (`#html-id`, `text:Visible text`, `[3]`), the action taken. The record's
    /// `result` says whether the page took it (`refused` off the allowed origins, `no_element`,
    /// `target` naming why); a target that matches nothing is an [`Error::Step`] naming it.
    pub async fn perform(&mut self, step: ScriptStep) -> Result<StepRecord> {
        if matches!(step, ScriptStep::Remember { .. } | ScriptStep::Ask { .. }) {
            return Err(Error::Step {
                step: 1,
                detail: "perform takes an action (click, type, select, ...), not remember or ask".into(),
            });
        }
        let policy: Box<dyn Policy> = Box::new(ScriptedPolicy::new(vec![step], &self.env.origin));
        let goal = self.standing_goal().to_string();
        let history = self.episode(policy, Some((&goal, 1))).await.0?;
        history.steps.into_iter().last().ok_or(Error::Runtime {
            op: "Agent::perform",
            detail: "no step was taken".into(),
        })
    }

    /// Reads `instruction` off the current page as a `T`: the model writes JSON over the context
    /// window, which must deserialise as `T`; otherwise [`Error::Extract`] names the type and the
    /// model's output. The JSON is checked against `T`, not constrained to it while decoding
    /// ([`Agent::extract_json`] is).
    pub async fn extract<T: DeserializeOwned>(&mut self, instruction: &str) -> Result<T> {
        self.observe().await?;
        let prompt = format!("{instruction}\nReply with JSON only.");
        let max_new = self.scenario.budget.max_new_tokens.max(48);
        let session = &mut self.session;
        let llm: &dyn LanguageModel = match &self.lm {
            Some(m) => m.as_ref(),
            None => &self.llm,
        };
        let call = blocking(|| -> Result<_> {
            let window = crate::language_model::window_text(session)?;
            let call = llm.generate(&mut View::new(session, &window), &prompt, max_new, 0)?;
            session.settle()?;
            Ok(call)
        })?;
        let out = call.output.trim();
        let bad = |detail: String| Error::Extract {
            type_name: std::any::type_name::<T>(),
            detail,
            output: out.to_string(),
        };
        let start = out.find(['{', '[', '"']).unwrap_or(0);
        let mut values = serde_json::Deserializer::from_str(&out[start..]).into_iter::<serde_json::Value>();
        let value = match values.next() {
            Some(Ok(v)) => v,
            Some(Err(e)) => return Err(bad(format!("not JSON: {e}"))),
            None => return Err(bad("no JSON in the reply".into())),
        };
        serde_json::from_value(value).map_err(|e| bad(e.to_string()))
    }

    /// Reads `instruction` off the current page as JSON valid against `schema`, decoded under it
    /// (constrained decoding with [`JsonGrammar`]): the local model's reply is valid by
    /// construction, at most `max_new` tokens (closed the shortest way when they run out). A
    /// schema outside the supported subset is an [`Error::Schema`] naming the keyword, before
    /// the model runs. A plugged [`LanguageModel`] writes freely and its reply is checked
    /// against the schema instead ([`Error::Extract`] when it is not valid).
    pub async fn extract_json(
        &mut self,
        instruction: &str,
        schema: &serde_json::Value,
        max_new: usize,
    ) -> Result<serde_json::Value> {
        let grammar = JsonGrammar::new(schema).map_err(|detail| Error::Schema { detail })?;
        self.observe().await?;
        let prompt =
            format!("{instruction}\nReply with one JSON value valid against this JSON Schema, nothing else:\n{schema}");
        let session = &mut self.session;
        let (llm, plugged) = (&self.llm, self.lm.as_deref());
        let call = blocking(|| -> Result<_> {
            let window = crate::language_model::window_text(session)?;
            let mut view = View::new(session, &window);
            let call = match plugged {
                Some(m) => m.generate_after(&mut view, &prompt, grammar.lead(), max_new, 0)?,
                None => llm.decode_constrained(view.live()?, &prompt, &grammar, max_new)?,
            };
            session.settle()?;
            Ok(call)
        })?;
        let out = call.output.trim();
        let bad = |detail: &str| Error::Extract {
            type_name: "JSON valid against the schema",
            detail: detail.into(),
            output: out.to_string(),
        };
        if grammar.fit(out) != Fit::Complete {
            return Err(bad("the reply is not a value of the schema"));
        }
        serde_json::from_str(out).map_err(|e| bad(&e.to_string()))
    }
}
