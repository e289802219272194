//! The ranked model policy's example: decisions of another task, taken from a recorded run (the
//! local site's `return-with-receipt` scenario, seed 7: type the order number, attach the
//! receipt, send) and written in the words the policy ranks, so that a small model sees the form
//! of a reply and that a form is filled before it is sent. No benchmark task's page or answer is
//! in it.

use std::sync::OnceLock;

use kamera_browser::{Action, Observation};
use serde::Deserialize;

use super::candidates::words;

/// The recording: the scenario's goal and the steps on its form page (observation and action).
#[derive(Deserialize)]
struct Recording {
    scenario: String,
    goal: String,
    steps: Vec<Recorded>,
}

#[derive(Deserialize)]
struct Recorded {
    observation: Observation,
    action: Action,
}

/// The example as the prompt shows it (rendered once).
pub fn example() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let rec: Recording = serde_json::from_str(include_str!("example.json")).expect("the bundled example parses");
        render(&rec)
    })
}

/// What was done so far, one line each with what it did, as every ranked prompt says it.
pub fn done_so_far<'a>(taken: impl IntoIterator<Item = (&'a str, Option<bool>)>) -> String {
    let mut s = String::from("Done so far:\n");
    let mut any = false;
    for (w, changed) in taken {
        any = true;
        let what = match changed {
            Some(true) => " (the page changed)",
            Some(false) => " (nothing changed)",
            None => "",
        };
        s.push_str(&format!("- {w}{what}\n"));
    }
    if any { s } else { "Done so far: nothing\n".into() }
}

/// The prompt's lead-in of each reply.
pub const NEXT: &str = "Next action:";

fn render(rec: &Recording) -> String {
    let Some(first) = rec.steps.first() else {
        return String::new();
    };
    let mut s = format!(
        "An example from another task (a recorded run of {}):\nGoal: {}\nPage \"{}\":\n{}\n",
        rec.scenario, rec.goal, first.observation.title, first.observation.text
    );
    let mut taken: Vec<(String, Option<bool>)> = Vec::new();
    for step in &rec.steps {
        let w = words(&step.action, &step.observation);
        // The model policy never uploads: that step is history only.
        if !matches!(step.action, Action::Upload { .. }) {
            s.push_str(&done_so_far(taken.iter().map(|(w, c)| (w.as_str(), *c))));
            s.push_str(&format!("{NEXT} {w}\n"));
        }
        taken.push((w, Some(true)));
    }
    s
}

#[cfg(test)]
mod tests {
    /// The recording renders to its two decisions, in the words the policy ranks.
    #[test]
    fn the_example_is_the_recorded_form_fill() {
        let e = super::example();
        assert!(
            e.contains("Next action: type \"A-1042\" into text field \"Order number\" [6]\n"),
            "{e}"
        );
        assert!(
            e.contains("Next action: click button \"Send return request\" [8]\n"),
            "{e}"
        );
        assert!(e.contains("Done so far: nothing\n"), "{e}");
        assert_eq!(e.matches(super::NEXT).count(), 2, "{e}");
    }
}
