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
use kamera_store::ChunkStore;
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

/// An action with the port of the loopback site left out (each run serves the site anew).
fn portless(a: &kamera_browser::Action) -> String {
    let s = format!("{a:?}");
    match s.split_once("127.0.0.1:") {
        Some((head, tail)) => format!(
            "{head}127.0.0.1{}",
            tail.trim_start_matches(|c: char| c.is_ascii_digit())
        ),
        None => s,
    }
}

fn actions(r: &RunSummary) -> Vec<String> {
    r.actions().iter().map(portless).collect()
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
        assert_eq!(
            b.action.as_ref().map(portless),
            c.action.as_ref().map(portless),
            "step {}",
            c.step
        );
    }
    // The same work. (The builder pins its prefix before the run, so its History's counts leave
    // the prefix's prefill out; the counts of pages, visits and patches are the same.)
    let (b, c) = (&built.session, &cli.session);
    let counts = |x: &kamera_agent::SessionStats| {
        (
            x.hits,
            x.new,
            x.recalls,
            x.stored,
            x.evictions,
            x.relocations,
            x.repair_tokens,
            x.patches_formed,
            x.patches_applied,
        )
    };
    assert_eq!(counts(b), counts(c), "{b:?}\n{c:?}");
    let page_tokens = |r: &RunSummary| r.steps.iter().map(|st| st.prefill_tokens).sum::<usize>();
    assert_eq!(page_tokens(&built), page_tokens(&cli));
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
    assert_eq!(actions(&none), actions(&reuse));
    // Nothing placed, relocated, patched or stored; the one model read (the answering step)
    // prefilled the whole window, and the scripted steps before it, which read no model, nothing.
    let c = &none.session;
    assert_eq!(
        (
            c.placed_tokens,
            c.patches_formed,
            c.patches_applied,
            c.relocations,
            c.bytes_moved
        ),
        (0, 0, 0, 0, 0),
        "{c:?}"
    );
    let (answering, scripted) = none.steps.split_last().expect("steps");
    assert!(
        scripted.iter().all(|st| st.prefill_tokens == 0 && st.model.is_none()),
        "{:?}",
        scripted.iter().map(|st| st.prefill_tokens).collect::<Vec<_>>()
    );
    let last = answering.model.as_ref().expect("the answer's model call");
    assert_eq!(answering.prefill_tokens, last.context_tokens);
    assert!(answering.timings.reuse_ms > 0.0, "the read's prefill is timed");
    assert_eq!(
        last.context_tokens,
        reuse
            .steps
            .last()
            .and_then(|st| st.model.as_ref())
            .unwrap()
            .context_tokens
    );
    assert_eq!(c.prefill_tokens, last.context_tokens, "{c:?}");
    Ok(())
}

/// The no-reuse session on its own, no browser: each `context()` is a prefill of exactly the
/// window's tokens from position 0 (the same last-position logits as `Llm::full_prefill`), and
/// the store stays empty.
#[test]
fn a_no_reuse_context_is_a_full_prefill_of_the_window() -> Result<()> {
    // f32 prefills: the same arithmetic whether the window is prefilled at once or in pieces.
    let m = kamera_agent::load_model(
        &kamera_agent::ModelSource::Default,
        Some(kamera_model::PrefillPrecision::F32),
        &kamera_model::default_home(),
    )?;
    let llm = kamera_agent::Llm::new(m.clone());
    let store = std::sync::Arc::new(kamera_store::MemStore::new());
    let cfg = RuntimeConfig {
        model: kamera_agent::ModelSource::Loaded(m.clone()),
        store: StoreSource::Given(store.clone()),
        calibration: kamera_agent::CalibrationSource::Defaults,
        budget: kamera_agent::Budget {
            window_tokens: 64,
            ..kamera_agent::Budget::default()
        },
        reuse: false,
        ..RuntimeConfig::default()
    };
    let mut s = kamera_agent::open_runtime(cfg)?;
    s.pin(&llm.prefix_text("Read the pages."))?;
    let pages = [
        "Page \"A\" (/a):\nThe vault code is 4417. Mira Solberg keeps the only key.\n\n",
        "Page \"B\" (/b):\nDesk lamp P-200, office chair P-201, label printer P-202, monitor arm P-203.\n\n",
        "Page \"C\" (/c):\nAda Brandt (Logistics), Tomas Ek (Support), Jon Halloran (Platform).\n\n",
    ];
    let mut prefilled = 0;
    for p in pages {
        s.observe(p)?;
        let want = s.window_tokens();
        let before = s.stats().prefill_tokens;
        let ctx = s.context()?;
        assert_eq!(ctx.len(), want.len());
        let n = want.len();
        assert_eq!(s.stats().prefill_tokens - before, n);
        prefilled += n;
        // The context's rows are the full prefill's: one more token after it decodes the same.
        let probe = llm.tokens(" The", false)?;
        let mut ctx = s.context()?.clone();
        let after = m.extend(&probe, &mut ctx)?.logits;
        let mut full = want.clone();
        full.extend(&probe);
        let reference = llm.full_prefill(&full)?;
        let diff = after
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-3, "max logit difference {diff}");
        prefilled += n;
    }
    assert!(
        s.window().slots().len() < pages.len() + 1,
        "the 64-token window evicted a page"
    );
    assert_eq!(s.stats().prefill_tokens, prefilled);
    assert!(store.keys(None)?.is_empty(), "nothing stored");
    Ok(())
}
