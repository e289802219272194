//! One runtime, assembled once: the same scenario run through the builder API
//! (`Agent::builder().runtime(..)`) and through the path `kamera run` takes (the harness's
//! `run_scenario` with the same `RuntimeConfig`) plans the same, step by step; and the no-reuse
//! baseline (`kamera run --no-reuse`) answers the same while prefilling the whole window at every
//! step and storing nothing. On real Chromium with SmolLM2-135M, the scripted policy
//! (deterministic).

use std::path::Path;

use anyhow::Result;
use kamera_agent::{Agent, RunSummary, RuntimeConfig, Scenario, ScriptedPolicy, StoreSource};
use kamera_harness::RunConfig;
use kamera_tests::{model, require_chromium, root};

/// The runtime as `kamera run --store DIR` assembles it: this machine's calibration and the
/// model's installed basis (when there are), its measured patch points, the store stack in `dir`.
fn cli_runtime(dir: &Path, reuse: bool) -> RuntimeConfig {
    RuntimeConfig {
        model: kamera_agent::ModelSource::Loaded(model()),
        store: StoreSource::Stack {
            dir: Some(dir.to_path_buf()),
            redis: None,
            write_behind: None,
            tls_ca: None,
        },
        reuse,
        ..RuntimeConfig::default()
    }
}

async fn cli_path(s: &Scenario, reuse: bool) -> Result<RunSummary> {
    let dir = tempfile::tempdir()?;
    let cfg = RunConfig {
        runtime: cli_runtime(dir.path(), reuse),
        ..RunConfig::default()
    };
    Ok(kamera_harness::run_scenario(s, model(), &kamera_model::default_home(), cfg).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builder_and_the_cli_plan_the_same() -> Result<()> {
    require_chromium();
    let s = Scenario::load(&root().join("scenarios/order-status.toml"))?;
    let cli = cli_path(&s, true).await?;

    let served = kamera_harness::serve(&s, &kamera_model::default_home()).await?;
    let dir = tempfile::tempdir()?;
    let mut agent = Agent::builder()
        .runtime(cli_runtime(dir.path(), true))
        .task(s.goal.clone())
        .start_url(served.env.start_url.clone())
        .budget(s.budget.clone())
        .policy(ScriptedPolicy::new(s.steps.clone(), &served.env.origin))
        .build()?;
    let built = agent.run().await?;
    agent.close().await?;

    assert_eq!(cli.end.answer.as_deref(), Some("Awaiting pickup"), "{:?}", cli.end);
    assert_eq!(built.end.answer, cli.end.answer);
    assert_eq!(built.steps.len(), cli.steps.len());
    for (b, c) in built.steps.iter().zip(&cli.steps) {
        assert_eq!(b.chunk, c.chunk, "step {}", c.step);
        assert_eq!(b.visit, c.visit, "step {}", c.step);
        assert_eq!(b.plan, c.plan, "step {}: the two paths planned differently", c.step);
        assert_eq!(b.action, c.action, "step {}", c.step);
    }
    let mut same = cli.session.clone();
    same.deferred_ms = built.session.deferred_ms;
    assert_eq!(built.session, same, "the same work, but for its timing");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reuse_every_step_prefills_the_window_and_nothing_is_stored() -> Result<()> {
    require_chromium();
    let s = Scenario::load(&root().join("scenarios/order-status.toml"))?;
    let reuse = cli_path(&s, true).await?;
    let none = cli_path(&s, false).await?;
    assert_eq!(none.end.answer, reuse.end.answer, "{:?}", none.end);
    assert_eq!(none.end.success, Some(true));
    assert_eq!(none.actions(), reuse.actions());
    // Nothing placed, relocated or patched; every step's context was a prefill of the window.
    let c = &none.session;
    assert_eq!(
        (c.placed_tokens, c.patches_formed, c.patches_applied, c.relocations),
        (0, 0, 0, 0),
        "{c:?}"
    );
    assert!(none.steps.iter().all(|st| st.prefill_tokens == 0));
    let windows: usize = none
        .steps
        .iter()
        .map(|st| st.model.as_ref().map_or(0, |m| m.context_tokens))
        .sum();
    assert!(c.prefill_tokens >= windows, "{} < {windows}", c.prefill_tokens);
    assert!(
        c.prefill_tokens > reuse.session.prefill_tokens,
        "{c:?} vs {:?}",
        reuse.session
    );
    Ok(())
}
