//! `AgentBuilder::action_cache` on real Chromium and real weights (SmolLM2-135M-Instruct, fetched
//! once), the model policy on the demo site: a second agent over the same cache folder replays
//! the first one's actions with no model call (an answer, `done`, is never cached: the model
//! reads the window again for it). The plan written before the first page is cached too.

use anyhow::Result;
use kamera_agent::{Agent, default_model};
use kamera_browser::{Action, Content, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_replays_the_model_policy_from_the_cache() -> Result<()> {
    let server = Server::start(Content::Memory(kamera_site::generate(7))).await?;
    let model = default_model(&kamera_model::default_home())?;
    let dir = tempfile::tempdir()?;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut agent = Agent::builder()
            .task("Open the list of orders.")
            .start_url(format!("{}/", server.origin()))
            .model(model.clone())
            .max_steps(3)
            .action_cache(dir.path())
            .build()?;
        let history = agent.run().await?;
        agent.close().await?;
        runs.push(history);
    }
    let (first, second) = (&runs[0], &runs[1]);
    let done = |a: &Action| matches!(a, Action::Done { .. });
    let acted = first.actions().iter().filter(|a| !done(a)).count();
    assert!(acted > 0, "the model took no action: {:?}", first.actions());
    assert_eq!(
        first.model_calls,
        first.steps.len() + 1,
        "the plan and every model-policy step ask the model"
    );
    assert!(
        first.plan.as_ref().is_some_and(|p| p.model.is_some()),
        "{:?}",
        first.plan
    );
    assert_eq!(
        second.plan.as_ref().map(|p| (&p.text, p.model.is_none())),
        first.plan.as_ref().map(|p| (&p.text, true)),
        "the plan comes from the cache"
    );
    assert_eq!(first.cache.as_ref().map(|c| c.stored), Some(acted));
    assert_eq!(second.actions(), first.actions(), "the same actions, replayed");
    assert_eq!(second.cache_hits, acted);
    assert_eq!(second.model_calls, first.actions().iter().filter(|a| done(a)).count());
    eprintln!(
        "first: {} model calls, {:.1} s; second: {} model calls, {} hits, {:.1} s",
        first.model_calls,
        first.wall_ms / 1e3,
        second.model_calls,
        second.cache_hits,
        second.wall_ms / 1e3
    );
    Ok(())
}
