//! order-bot: an app embedding the Kamera runtime. It serves the local test site, launches its
//! own Chromium, and drives it with its own policy: open the order, read the tracking number,
//! track it, come back, and ask the embedded model for the status over the cached page chunks.
//!
//! `cargo run --release -p kamera-agent --example order-bot -- A-1043`

use std::time::Duration;

use anyhow::{Context, Result};
use kamera_agent::{Agent, Decision, Env, Mind, Policy, RunOptions, Scenario, resolve_target};
use kamera_browser::{Action, ChromiumBrowser, ChromiumConfig, Content, Observation, Origins, Server};
use tokio_util::sync::CancellationToken;

/// The app's own policy: a small state machine over what it sees.
struct OrderBot {
    order: String,
    origin: String,
    tracking: Option<String>,
    stage: usize,
}

impl Policy for OrderBot {
    fn next(&mut self, _step: usize, obs: &Observation, mind: &mut Mind<'_>) -> kamera_agent::Result<Decision> {
        let act = |action| Ok(Decision { action, model: None });
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
                let choices: Vec<String> = kamera_agent::site::STATUSES.iter().map(|s| s.to_string()).collect();
                let q = format!("What is the shipping status of order {}?", self.order);
                let call = mind.llm.choose(mind.ctx, &q, &choices)?;
                Ok(Decision {
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
    let server = Server::start(Content::Memory(kamera_agent::site::generate(seed))).await?;
    let origins = Origins::new(&[server.origin()])?;
    let mut browser = ChromiumBrowser::launch(ChromiumConfig::new(origins)).await?;
    let home = kamera_model::default_home();
    let model = kamera_agent::default_model(&home).context("default model")?;

    // Only the goal and budgets are taken from a scenario; the steps are the app's own policy.
    let scenario = Scenario::parse(
        &format!(
            "name = \"order-bot\"\ngoal = \"Find the shipping status of order {order}.\"\npolicy = \"model\"\n[site]\nseed = {seed}\n"
        ),
        "order-bot".as_ref(),
    )?;
    let mut policy = OrderBot {
        order: order.clone(),
        origin: server.origin(),
        tracking: None,
        stage: 0,
    };
    let cancel = CancellationToken::new();
    let deadline = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(120)).await;
        deadline.cancel();
    });
    let env = Env {
        origin: server.origin(),
        start_url: server.url("/"),
    };
    let opts = RunOptions {
        cancel,
        on_step: Some(Box::new(|s| {
            println!(
                "step {} {} -> {}",
                s.step,
                s.observation.title,
                s.action.as_ref().map(|a| a.label()).unwrap_or_default()
            )
        })),
        ..Default::default()
    };
    // A session over an in-memory store (pass a sled store to keep canonical KV across runs).
    let mut session = kamera_agent::session_for(&scenario, model, None, None, None);
    let agent = Agent {
        browser: &mut browser,
        policy: &mut policy,
        session: &mut session,
    };
    let summary = kamera_agent::run_episode(agent, &scenario, &env, opts).await;
    kamera_browser::Browser::close(&mut browser).await?;
    let summary = summary?;
    let truth = kamera_agent::site::data(seed)
        .orders
        .into_iter()
        .find(|o| o.id == order);
    println!(
        "order {order}: tracking {:?}, model says {:?}, site says {:?}; session {:?}",
        policy.tracking,
        summary.end.answer,
        truth.map(|o| o.status),
        summary.session
    );
    Ok(())
}
