//! Trivial policies `kamera bench agent` scores beside the models on the same tasks and seeds,
//! so a reader sees how much of a model's pass rate needs no reading at all: `first-element`
//! acts on element [1] every step, `random-valid` picks one of the page's valid actions at
//! random (seeded by the task and the episode seed).

use anyhow::{Result, bail};
use kamera_agent::{ActionSchema, Mind, NextAction, Policy};
use kamera_browser::{Action, Observation};

/// The baselines, by name.
pub const BASELINES: [&str; 2] = ["first-element", "random-valid"];

/// The row label the baselines' episodes carry in place of a model's name.
pub const LABEL: &str = "baseline";

/// Checks `--baselines` names (`none` alone: no baseline).
pub fn parse(names: &[String]) -> Result<Vec<String>> {
    if names.iter().any(|n| n == "none") {
        return Ok(Vec::new());
    }
    for n in names {
        if !BASELINES.contains(&n.as_str()) {
            bail!("--baselines: {n:?} is not one of {} (or none)", BASELINES.join(", "));
        }
    }
    Ok(names.to_vec())
}

/// A new policy of baseline `name` for one episode of `task` with `seed`.
pub fn policy(name: &str, task: &str, seed: u64) -> Box<dyn Policy> {
    match name {
        "first-element" => Box::new(FirstElement),
        _ => Box::new(RandomValid {
            rng: kamera_eval::Rng::new(seed_of(task, seed)),
        }),
    }
}

/// The random baseline's seed: FNV-1a of the task name, mixed with the episode seed.
fn seed_of(task: &str, seed: u64) -> u64 {
    let h = task.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    h ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Clicks the page's first interactive element (the lowest id: `[1]` on a page that numbers
/// from 1) every step; `done` with no answer on a page with none.
pub struct FirstElement;

/// The action of [`FirstElement`] on `obs`.
pub fn first_element(obs: &Observation) -> Action {
    obs.interactive()
        .map(|e| e.id)
        .min()
        .map_or(Action::Done { answer: String::new() }, |id| Action::Click { id })
}

impl Policy for FirstElement {
    fn next(&mut self, _step: usize, obs: &Observation, _mind: &mut Mind<'_>) -> kamera_agent::Result<NextAction> {
        Ok(NextAction {
            action: first_element(obs),
            model: None,
        })
    }
}

/// Each step one of the page's valid actions, uniformly: the candidates ranked decoding scores
/// (every click, type, select, check/uncheck, key Enter, scroll down, back, done), free texts
/// written as `-`.
pub struct RandomValid {
    rng: kamera_eval::Rng,
}

/// The candidates of [`RandomValid`] on `obs`.
pub fn candidates(obs: &Observation) -> Vec<Action> {
    let schema = ActionSchema::for_page(obs);
    schema
        .templates
        .iter()
        .filter(|t| t.ranked)
        .filter_map(|t| match &t.tail {
            None => schema.action(&t.head),
            Some(tail) => schema.action(&format!("{}-{tail}", t.head)),
        })
        .collect()
}

impl Policy for RandomValid {
    fn next(&mut self, _step: usize, obs: &Observation, _mind: &mut Mind<'_>) -> kamera_agent::Result<NextAction> {
        let mut c = candidates(obs);
        let action = if c.is_empty() {
            Action::Done { answer: String::new() }
        } else {
            c.swap_remove(self.rng.below(c.len()))
        };
        Ok(NextAction { action, model: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Observation {
        serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1/", "title": "t", "text": "",
            "elements": [
                {"id": 2, "tag": "input", "text": "", "editable": true, "x": 1.0, "y": 1.0},
                {"id": 1, "tag": "button", "text": "Go", "x": 1.0, "y": 1.0}
            ]
        }))
        .expect("observation")
    }

    /// The first element is the lowest id; every random candidate is valid on the page; the clicks, the typing and `done` are among them;
    /// the same task and seed pick the same actions, another seed others.
    #[test]
    fn random_valid_is_valid_and_seeded() {
        let obs = page();
        assert_eq!(first_element(&obs), Action::Click { id: 1 });
        let c = candidates(&obs);
        assert!(c.iter().all(|a| kamera_agent::valid(&obs, a)), "{c:?}");
        for a in [
            Action::Click { id: 1 },
            Action::Click { id: 2 },
            Action::Done { answer: "-".into() },
        ] {
            assert!(c.contains(&a), "{a:?} in {c:?}");
        }
        let picks = |seed| {
            let mut r = kamera_eval::Rng::new(seed_of("click-test", seed));
            (0..16).map(|_| r.below(c.len())).collect::<Vec<_>>()
        };
        assert_eq!(picks(1), picks(1));
        assert_ne!(picks(1), picks(2));
        assert!(parse(&["first-element".into(), "random-valid".into()]).is_ok());
        assert!(parse(&["none".into()]).unwrap().is_empty());
        assert!(parse(&["always-click".into()]).is_err());
    }
}
