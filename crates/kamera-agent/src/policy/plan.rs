//! The planning step: before the first page, the model writes the steps the goal implies (a
//! numbered list of short lines), and the run keeps them in the window as a pinned chunk of
//! their own, after the goal, so every later decision reads them. Decoding is held to
//! [`Lines`]: short lines of plain text, ended by a blank line or the last allowed line.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::language_model::{LanguageModel, View};
use crate::llm::ModelCall;
use crate::schema::Lines;

/// How the plan's reply starts (the model writes step 1's text next).
pub const PLAN_LEAD: &str = "Plan for the goal:\n1.";

/// Most lines of a plan.
const MAX_LINES: usize = 5;
/// Most tokens the plan is decoded for (it is closed where it stands after them).
const MAX_TOKENS: usize = 72;

/// A plan written by the model and the call that wrote it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Planned {
    /// The chunk the window keeps: [`PLAN_LEAD`], the steps, a blank line.
    pub text: String,
    /// The call that wrote it; `None` when the action cache gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelCall>,
}

/// The plan for `goal`: the model writes the steps, greedy under [`Lines`], over the window as
/// it stands (the goal, no page yet). `None` when its reply holds no step (a plan is optional:
/// the run goes on without one).
pub fn write(llm: &dyn LanguageModel, view: &mut View<'_>, goal: &str) -> Result<Option<Planned>> {
    let instruction = format!("Goal: {goal}\nWrite the steps that reach the goal, one short line each.");
    let grammar = Lines {
        lead: PLAN_LEAD,
        max_lines: MAX_LINES,
    };
    // `decode` gives a complete reply of the grammar (closed where the token budget ended it).
    let model = match llm.decode(view, &instruction, &grammar, MAX_TOKENS) {
        Ok(m) => m,
        Err(Error::Policy { last, .. }) => {
            tracing::debug!(reply = %last, "the model wrote no plan");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut text = model.output.clone();
    // Five full lines end with one line break: the chunk ends with a blank line either way.
    if !text.ends_with("\n\n") {
        text.push('\n');
    }
    Ok(Some(Planned {
        text,
        model: Some(model),
    }))
}
