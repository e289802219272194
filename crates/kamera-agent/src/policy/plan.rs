//! The planning step: before the first page, the model writes the steps the goal implies (a
//! numbered list of short lines), and the run keeps them in the window as a pinned chunk of
//! their own, after the goal, so every later decision reads them. Decoding is held to
//! [`Lines`]: short lines of plain text, ended by a blank line or the last allowed line.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::language_model::{LanguageModel, View};
use crate::llm::ModelCall;
use crate::schema::{Fit, Grammar, Lines};

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
/// it stands (the goal, no page yet).
pub fn write(llm: &dyn LanguageModel, view: &mut View<'_>, goal: &str) -> Result<Planned> {
    let instruction = format!("Goal: {goal}\nWrite the steps that reach the goal, one short line each.");
    let grammar = Lines {
        lead: PLAN_LEAD,
        max_lines: MAX_LINES,
    };
    let model = llm.decode(view, &instruction, &grammar, MAX_TOKENS)?;
    // A reply cut short is closed where it stands; one with no step at all (a plugged model
    // whose reply leaves the grammar at once) becomes the goal as the plan's one step.
    let mut text = match grammar.fit(&model.output) {
        Fit::Complete => model.output.clone(),
        _ => grammar
            .close(&model.output)
            .unwrap_or_else(|| format!("{PLAN_LEAD} {goal}\n\n")),
    };
    // Five full lines end with one line break: the chunk ends with a blank line either way.
    if !text.ends_with("\n\n") {
        text.push('\n');
    }
    Ok(Planned {
        text,
        model: Some(model),
    })
}
