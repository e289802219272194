//! The check on a page to read: a page reached from another URL that offers no action of its own
//! (every element it lists came over from the page before: the site's menu), or a page that
//! lists nothing at all, is where a followed link or a sent form ends: it shows what was looked
//! for, or it is a dead end. There the policy checks whether the page shows
//! what the goal asks for: it does where it states a `Label: value` whose label the goal names
//! ([`goal_named_fact`]); otherwise the model is asked. If it does, the policy answers there
//! instead of leaving through the menu; if not, it does not answer there (it goes on, or back).
//! Such pages only: a page that changes in place and keeps its own elements (every MiniWoB++
//! task) never gets the check.

use kamera_browser::Observation;

use super::{Mind, facts};
use crate::error::Result;
use crate::llm::ModelCall;
use crate::runtime::relevance::terms;

/// The check's question, after the page, the goal and what was done so far.
const QUESTION: &str = "Question: Does the current page show what the goal asks for? Reply Yes or No.";

/// The replies ranked (the model's likelihood of each, after the assistant's turn opens).
const REPLIES: [&str; 2] = ["Yes", "No"];

/// Whether `obs` is a page to read: it lists nothing to act on, or only elements in `carried`
/// (those carried over from the page the episode came from, at another URL).
pub fn to_read(obs: &Observation, carried: &[u32]) -> bool {
    let mut listed = obs.interactive().peekable();
    listed.peek().is_none() || (!carried.is_empty() && listed.all(|e| carried.contains(&e.id)))
}

/// A `Label: value` line of `obs` ([`facts::labelled`]) whose label's terms (recall's
/// [`terms`]: lower-case words, stopwords left out) the goal names (`Status: Awaiting pickup` for
/// "Find the shipping status of ..."): the page states what the goal asks for.
pub fn goal_named_fact(obs: &Observation, goal: &str) -> Option<(String, String)> {
    let goal = terms(goal);
    facts::labelled(&obs.text).into_iter().find(|(label, _)| {
        let l = terms(label);
        !l.is_empty() && l.is_subset(&goal)
    })
}

/// Whether the model says the current page shows what the goal asks for, and the call.
/// `opening` is the instruction's page-and-goal lines with what was done so far.
pub fn shows_answer(mind: &mut Mind<'_>, opening: &str) -> Result<(bool, ModelCall)> {
    let instruction = format!("{opening}{QUESTION}");
    let replies: Vec<String> = REPLIES.iter().map(|r| r.to_string()).collect();
    let call = mind.llm.rank(&mut mind.view, &instruction, "", &replies)?;
    tracing::trace!(scores = ?call.scores, "page to read: does it show the answer?");
    Ok((call.output == REPLIES[0], call))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(url: &str, own: bool) -> Observation {
        let mut els =
            vec![serde_json::json!({"id": 1, "tag": "a", "text": "Orders", "href": "/orders", "x": 1.0, "y": 1.0})];
        if own {
            els.push(serde_json::json!({"id": 2, "tag": "button", "text": "Track", "x": 1.0, "y": 5.0}));
        }
        serde_json::from_value(serde_json::json!({"url": url, "title": "t", "text": "", "elements": els}))
            .expect("observation")
    }

    /// A fact whose label the goal names is found; labels with words the goal lacks are not.
    #[test]
    fn a_fact_the_goal_names_is_found() {
        let obs: Observation = serde_json::from_value(serde_json::json!({
            "url": "http://s/shipping/T-1", "title": "t",
            "text": "[1] a \"Orders\"\n# Shipment T-1\nTracking number: T-1\nStatus: Awaiting pickup\nLast hub: Gdansk",
            "elements": [{"id": 1, "tag": "a", "text": "Orders", "href": "/orders", "x": 1.0, "y": 1.0}]
        }))
        .expect("observation");
        assert_eq!(
            goal_named_fact(
                &obs,
                "Find the shipping status of order A-1, then answer with the status."
            ),
            Some(("Status".into(), "Awaiting pickup".into()))
        );
        assert_eq!(goal_named_fact(&obs, "Find the floor of Mira's team."), None);
        assert_eq!(
            goal_named_fact(&obs, "What is the tracking number?").map(|f| f.1),
            Some("T-1".into())
        );
    }

    /// A page whose every listed element was carried over is one to read, and so is a page that
    /// lists nothing; a page with an element of its own is not.
    #[test]
    fn a_page_to_read_has_nothing_of_its_own() {
        assert!(to_read(&page("http://s/shipping/T-1", false), &[1]));
        assert!(!to_read(&page("http://s/shipping", true), &[1]));
        assert!(!to_read(&page("http://s/x", false), &[]), "nothing carried over");
        let empty: Observation = serde_json::from_value(
            serde_json::json!({"url": "http://s/y", "title": "t", "text": "Not found", "elements": []}),
        )
        .expect("observation");
        assert!(to_read(&empty, &[]), "a dead end");
    }
}
