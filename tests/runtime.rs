//! The scheduler drives the agent on real Chromium with SmolLM2-135M: a second run over a warm
//! sled store prefills no page token, a second host sharing only a Redis server prefills none
//! either, and with a window too small for every page the page that holds the answer is back in
//! the window at the question, recalled by relevance.

#[path = "../crates/kamera-store/tests/common/redis_server.rs"]
mod redis_server;

use std::sync::Arc;

use anyhow::Result;
use kamera_agent::{RunSummary, RuntimeConfig, Scenario, StoreSource};
use kamera_harness::RunConfig;
use kamera_sched::{Step, Visit};
use kamera_store::ChunkStore;
use kamera_tests::{model, require_chromium, root};

fn open_store(dir: &std::path::Path) -> Result<Arc<dyn ChunkStore>> {
    Ok(kamera_store::open_stack(dir, None, 1 << 30)?)
}

async fn run(s: &Scenario, store: Option<Arc<dyn ChunkStore>>) -> Result<RunSummary> {
    let cfg = RunConfig {
        runtime: RuntimeConfig {
            store: store.map_or(StoreSource::Memory, StoreSource::Given),
            ..RuntimeConfig::default()
        },
        ..RunConfig::default()
    };
    Ok(kamera_harness::run_scenario(s, model(), &kamera_model::default_home(), cfg).await?)
}

fn page_prefill_tokens(r: &RunSummary) -> usize {
    r.steps.iter().map(|s| s.prefill_tokens).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_over_a_warm_store_prefills_no_page_token() -> Result<()> {
    require_chromium();
    let s = Scenario::load(&root().join("scenarios/order-status.toml"))?;
    let dir = tempfile::tempdir()?;
    let first = {
        let store = open_store(dir.path())?;
        run(&s, Some(store)).await?
    };
    assert_eq!(first.end.success, Some(true), "{:?}", first.end);
    assert!(page_prefill_tokens(&first) > 0);
    let second = run(&s, Some(open_store(dir.path())?)).await?;
    assert_eq!(second.end.success, Some(true), "{:?}", second.end);
    assert_eq!(second.end.answer, first.end.answer);
    assert_eq!(
        page_prefill_tokens(&second),
        0,
        "{}",
        second
            .steps
            .iter()
            .map(|s| format!(
                "{:?}: {}",
                s.visit,
                s.plan.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; ")
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(second.steps.iter().any(|s| s.visit == Visit::Stored));
    assert_eq!(
        second.session.prefill_tokens, 0,
        "the pinned prefix came from the store too"
    );
    Ok(())
}

/// Memory -> a host's own sled -> the fleet's Redis, as `kamera run --store redis://...` opens it.
fn open_fleet_store(dir: &std::path::Path, url: &str) -> Result<Arc<dyn ChunkStore>> {
    Ok(kamera_store::open_stack(dir, Some(url), 1 << 30)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_host_sharing_redis_prefills_no_page_token() -> Result<()> {
    require_chromium();
    let redis = redis_server::RedisServer::start(&[])?;
    let url = format!("redis://127.0.0.1:{}/0", redis.port);
    let s = Scenario::load(&root().join("scenarios/order-status.toml"))?;
    let (host_a, host_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let first = run(&s, Some(open_fleet_store(host_a.path(), &url)?)).await?;
    assert_eq!(first.end.success, Some(true), "{:?}", first.end);
    assert!(page_prefill_tokens(&first) > 0);
    // Host B: an empty local store; everything it reuses comes from Redis.
    let second = run(&s, Some(open_fleet_store(host_b.path(), &url)?)).await?;
    assert_eq!(second.end.success, Some(true), "{:?}", second.end);
    assert_eq!(page_prefill_tokens(&second), 0);
    assert_eq!(second.session.prefill_tokens, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fact_page_is_recalled_by_relevance_for_the_question() -> Result<()> {
    require_chromium();
    let s = Scenario::parse(
        r##"
        name = "order-status-tight"
        goal = "Find the shipping status of order A-1042."
        [site]
        seed = 7
        [budget]
        steps = 12
        window_tokens = 300
        [[steps]]
        click = "text:Orders"
        [[steps]]
        click = "text:View A-1042"
        [[steps]]
        remember = "tracking"
        regex = 'Tracking number: (TRK-\d+)'
        [[steps]]
        click = "text:Track this shipment"
        [[steps]]
        type = "$tracking"
        into = "#tracking"
        [[steps]]
        key = "Enter"
        [[steps]]
        navigate = "/people"
        [[steps]]
        navigate = "/catalogue"
        [[steps]]
        navigate = "/orders/A-1042"
        [[steps]]
        ask = "What is the shipping status of order A-1042?"
        choices = ["Delivered", "In transit", "Out for delivery", "Held at customs", "Awaiting pickup"]
        [success]
        answer = "Awaiting pickup"
        "##,
        "order-status-tight.toml".as_ref(),
    )?;
    let r = run(&s, None).await?;
    for st in &r.steps {
        eprintln!(
            "{} {} {} {:?} {} tokens",
            st.step,
            &st.chunk.to_string()[..12],
            st.observation.url,
            st.visit,
            st.chunk_tokens
        );
    }
    let fact = r
        .steps
        .iter()
        .find(|st| st.observation.url.contains("/shipping/TRK-"))
        .map(|st| st.chunk)
        .expect("the shipment page was visited");
    let evicted_at = r
        .steps
        .iter()
        .position(|st| st.plan.contains(&Step::EvictToStore { chunk: fact }))
        .expect("the shipment page was evicted before the question");
    let last = r.steps.last().expect("steps");
    assert!(
        last.action
            .as_ref()
            .is_some_and(|a| matches!(a, kamera_browser::Action::Done { .. }))
    );
    assert!(evicted_at < last.step);
    assert!(
        last.plan.iter().any(
            |p| matches!(p, Step::Place { chunk, .. } | Step::Prefill { chunk, alone: false, .. } if *chunk == fact)
        ),
        "the fact page {fact} is back at the question step: {}",
        last.plan.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; ")
    );
    assert!(last.why.iter().any(|w| w.contains("relevance")), "{:#?}", last.why);
    eprintln!("answer {:?} (expected Awaiting pickup)", r.end.answer);
    Ok(())
}
