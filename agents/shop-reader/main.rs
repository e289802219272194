//! shop-reader: the builder API with the model policy, one step at a time. It serves the demo
//! shop (the kamera-site crate, on kamera-browser's loopback `Server`), `observe`s the home
//! page, `act`s toward the catalogue (ranked among the page's actions: the reply is always an action
//! the page can take), `extract`s a typed value off the page (the reply must deserialise as the
//! type, or a typed error says what the model wrote), then works a second task in the same
//! session (browser, window and chunk store kept).
//!
//! `cargo run --release -p kamera-agent --example shop-reader`

use std::time::Duration;

use anyhow::{Context, Result};
use kamera_agent::Agent;
use kamera_browser::{Content, Server};
use serde::Deserialize;

/// What the app wants to read off a page.
#[derive(Debug, Deserialize)]
struct PageTitle {
    title: String,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let server = Server::start(Content::Memory(kamera_site::generate(7))).await?;
    let mut agent = Agent::builder()
        .start_url(server.url("/"))
        .max_steps(4)
        .deadline(Duration::from_secs(180))
        .build()
        .context("building the agent")?;

    let home = agent.observe().await?;
    println!(
        "observe: {:?}, {} interactive elements",
        home.title,
        home.interactive().count()
    );

    let action = agent.act("Open the catalogue").await?;
    let page = agent.observe().await?;
    println!("act: {} -> now on {:?}", action.label(), page.title);

    match agent
        .extract::<PageTitle>("What is this page's title? Answer as {\"title\": \"...\"}")
        .await
    {
        Ok(t) => println!("extract: title {:?}", t.title),
        Err(e) => println!("extract failed (typed error): {e}"),
    }

    let history = agent
        .run_task("Find the shipping status of order A-1042, then answer with done.")
        .await;
    match &history {
        Ok(h) => println!(
            "run_task: {} steps, answer {:?}; session {:?}",
            h.steps.len(),
            h.end.answer,
            agent.session().stats()
        ),
        Err(e) => println!("run_task ended with an error: {e}"),
    }
    agent.close().await?;
    Ok(())
}
