//! Policies pick the next action: [`ScriptedPolicy`] follows a scenario's steps and asks the
//! model only the scenario's questions; [`ModelPolicy`] writes a plan, then asks the model for
//! each action among the page's actions in words (ranked by likelihood by default), so every
//! step ends with an action the page can take.

use kamera_browser::{Action, Observation};

use crate::cache::ActionCache;
use crate::error::Result;
use crate::language_model::{LanguageModel, View};
use crate::llm::ModelCall;

mod candidates;
mod check;
mod example;
mod facts;
mod model;
mod plan;
mod restricted;
mod scripted;
mod words;
pub use model::{ACTION_GRAMMAR, Decoding, ModelPolicy, valid};
pub use plan::Planned;
pub use scripted::{ScriptedPolicy, resolve_target};
pub use words::Words;

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

/// What a policy chose for one step: the next action and the model call behind it (named apart
/// from kamera-sched's `Decision`, a plan's priced choice).
#[derive(Debug, Clone)]
pub struct NextAction {
    pub action: Action,
    /// The model call behind the action, when there was one.
    pub model: Option<ModelCall>,
}

/// Picks the next action. Synchronous: model work runs on the caller's blocking thread.
pub trait Policy: Send {
    fn next(&mut self, step: usize, obs: &Observation, mind: &mut Mind<'_>) -> Result<NextAction>;
    /// The planning step: the steps the goal implies, written once before the first page (the
    /// run pins them in the window after the goal, as a chunk of their own); `None` for a
    /// policy that plans nothing.
    fn plan(&mut self, _mind: &mut Mind<'_>) -> Result<Option<Planned>> {
        Ok(None)
    }
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
