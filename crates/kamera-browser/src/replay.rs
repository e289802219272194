//! [`ReplayBrowser`]: plays recorded observations back, no browser involved.

use std::collections::VecDeque;

use async_trait::async_trait;

use crate::Browser;
use crate::error::{Error, Result};
use crate::types::{Action, Observation};

/// Gives back `observations` in order, one per [`Browser::observe`]; actions are accepted and
/// logged, so a policy re-run against it must choose the recorded actions to see the recorded pages.
#[derive(Debug, Default)]
pub struct ReplayBrowser {
    queue: VecDeque<Observation>,
    /// Actions the agent performed, in order.
    pub actions: Vec<Action>,
}

impl ReplayBrowser {
    pub fn new(observations: Vec<Observation>) -> ReplayBrowser {
        ReplayBrowser {
            queue: observations.into(),
            actions: Vec::new(),
        }
    }

    /// Observations not yet played.
    pub fn remaining(&self) -> usize {
        self.queue.len()
    }
}

#[async_trait]
impl Browser for ReplayBrowser {
    async fn navigate(&mut self, _url: &str) -> Result<()> {
        Ok(())
    }

    async fn act(&mut self, action: &Action) -> Result<()> {
        self.actions.push(action.clone());
        Ok(())
    }

    async fn observe(&mut self) -> Result<Observation> {
        self.queue
            .pop_front()
            .ok_or_else(|| Error::Replay("the trace has no more observations".into()))
    }

    async fn eval(&mut self, js: &str) -> Result<serde_json::Value> {
        Err(Error::Replay(format!(
            "no page to evaluate {:?} on (replay uses the recorded results)",
            js.chars().take(40).collect::<String>()
        )))
    }

    async fn close(&mut self) -> Result<()> {
        Ok(())
    }

    fn is_replay(&self) -> bool {
        true
    }
}
