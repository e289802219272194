//! order-bot: an app on the builder API with its own policy. It serves the demo shop (the
//! kamera-site crate, on kamera-browser's loopback `Server`) and builds an `Agent` (Chromium launched by the agent, the embedded model, a deadline): open the
//! order, read the tracking number, track it, come back, and ask the model for the status over
//! the cached page chunks.
//!
//! `cargo run --release -p kamera-agent --example order-bot -- A-1043`

use std::time::Duration;

use anyhow::{Context, Result};
use kamera_agent::{Agent, Mind, NextAction, Policy, resolve_target};
use kamera_browser::{Action, Content, Observation, Server};

/// The app's own policy: a small state machine over what it sees.
struct OrderBot {
    order: String,
    origin: String,
    tracking: Option<String>,
    stage: usize,
}

impl Policy for OrderBot {
    fn next(&mut self, _step: usize, obs: &Observation, mind: &mut Mind<'_>) -> kamera_agent::Result<NextAction> {
        let act = |action| Ok(NextAction { action, model: None });
        let click = |target: &str| {
            resolve_target(obs, target)
                .map(|id| Action::Click { id })
                .ok_or_else(|| kamera_agent::Error::Step {
                    step: 0,
                    detail: format!("no {target:?} on {}", obs.url),
                })
        };
        self.stage += 1;
        match self.stage {
            1 => act(Action::Navigate {
                url: format!("{}/orders/{}", self.origin, self.order),
            }),
            2 => {
                self.tracking = obs
                    .text
                    .lines()
                    .find_map(|l| l.strip_prefix("Tracking number: "))
                    .map(str::to_string);
                act(Action::Navigate {
                    url: format!("{}/shipping/{}", self.origin, self.tracking.as_deref().unwrap_or("")),
                })
            }
            3 => act(Action::Navigate {
                url: format!("{}/orders/{}", self.origin, self.order),
            }),
            4 if self.tracking.is_none() => act(click("text:Shipping status")?),
            _ => {
                let choices: Vec<String> = kamera_site::STATUSES.iter().map(|s| s.to_string()).collect();
                let q = format!("What is the shipping status of order {}?", self.order);
                let call = mind.llm.choose(&mut mind.view, &q, &choices)?;
                Ok(NextAction {
                    action: Action::Done {
                        answer: call.output.clone(),
                    },
                    model: Some(call),
                })
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let order = std::env::args().nth(1).unwrap_or_else(|| "A-1043".into());
    let seed = 7;
    // The shop: the demo site, served on loopback.
    let server = Server::start(Content::Memory(kamera_site::generate(seed))).await?;
    let mut agent = Agent::builder()
        .task(format!("Find the shipping status of order {order}."))
        .start_url(server.url("/"))
        .policy(OrderBot {
            order: order.clone(),
            origin: server.origin(),
            tracking: None,
            stage: 0,
        })
        .max_steps(12)
        .deadline(Duration::from_secs(120))
        .on_step(|s| {
            println!(
                "step {} {} -> {}",
                s.step,
                s.observation.title,
                s.action.as_ref().map(|a| a.label()).unwrap_or_default()
            )
        })
        .build()
        .context("building the agent")?;
    let history = agent.run().await;
    let session = agent.session().stats().clone();
    agent.close().await?;
    let history = history?;
    let truth = kamera_site::data(seed).orders.into_iter().find(|o| o.id == order);
    println!(
        "order {order}: model says {:?}, site says {:?}; session {session:?}",
        history.end.answer,
        truth.map(|o| o.status),
    );
    Ok(())
}
