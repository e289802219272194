//! The model policy's replies on real pages (Chromium, SmolLM2-135M-Instruct): how often greedy
//! free JSON is a valid action of the page, against constrained decoding, which must always be,
//! both the JSON schema's and the policy's own (the actions in words, `kamera_agent::Words`). The page is
//! each scenario's first page, in the window as the agent loop puts it.

use anyhow::Result;
use kamera_agent::{ActionSchema, LEAD, Llm, ModelPolicy, chunk_text, parse_action, valid};
use kamera_browser::{Browser, ChromiumBrowser, ChromiumConfig};
use kamera_tests::{model, require_chromium, root};

/// The scenarios whose first page is measured (their goal is the model's goal).
pub const PAGES: [&str; 8] = [
    "miniwob-click-test",
    "miniwob-click-button",
    "miniwob-enter-text",
    "miniwob-click-link",
    "miniwob-choose-list",
    "miniwob-click-checkboxes",
    "miniwob-drag-items",
    "order-status",
];

/// Free JSON replies that were valid actions, as measured and reported in the README
/// (crates/kamera-agent/README.md, "Model policy").
const FREE_VALID: usize = 0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_decoding_makes_every_reply_a_valid_action() -> Result<()> {
    require_chromium();
    let home = kamera_model::default_home();
    let llm = Llm::new(model());
    let (mut free_valid, mut lines) = (0, Vec::new());
    for name in PAGES {
        let s = kamera_harness::load_scenario(&root().join("scenarios").join(format!("{name}.toml")))?;
        let served = kamera_harness::serve(&s, &home).await?;
        let mut b = ChromiumBrowser::launch(ChromiumConfig::new(served.origins.clone())).await?;
        b.navigate(&served.env.start_url).await?;
        if let Some(e) = &s.episode {
            b.eval(&e.start_js).await?;
        }
        let obs = b.observe().await?;
        b.close().await?;
        let mut session = kamera_harness::session_for(&s, model())?;
        session.pin(&llm.prefix_text(&s.goal))?;
        session.observe_page(&chunk_text(&obs, &served.env.origin))?;
        let ctx = session.context()?;
        let instruction = ModelPolicy::instruction(&obs, &s.goal);

        let free = llm.generate_after(&mut *ctx, &instruction, LEAD, 32, 0)?;
        let free_ok = parse_action(&free.output).is_ok_and(|a| valid(&obs, &a));
        free_valid += usize::from(free_ok);

        let policy = ModelPolicy::default();
        let words = policy.words(&obs);
        let said = llm.decode_constrained(&mut *ctx, &policy.prompt(&obs, &s.goal), &words, 64)?;
        assert!(
            words.action(&said.output).is_some_and(|a| valid(&obs, &a)),
            "{name}: the policy's reply {:?} is not a valid action",
            said.output
        );

        let schema = ActionSchema::for_page(&obs);
        let held = llm.generate_constrained(ctx, &instruction, &schema, 32)?;
        let action = schema.action(&held.output);
        assert!(
            action.as_ref().is_some_and(|a| valid(&obs, a)),
            "{name}: constrained reply {:?} is not a valid action",
            held.output
        );
        lines.push(format!(
            "{name}: free {} {:?} | constrained {:?} | in words {:?}",
            if free_ok { "valid" } else { "INVALID" },
            free.output,
            held.output,
            said.output
        ));
    }
    println!("{}", lines.join("\n"));
    println!(
        "free JSON valid: {free_valid}/{}; constrained: {}/{}",
        PAGES.len(),
        PAGES.len(),
        PAGES.len()
    );
    assert!(
        free_valid.abs_diff(FREE_VALID) <= 1,
        "free JSON valid on {free_valid} pages; the README reports {FREE_VALID} (±1)"
    );
    Ok(())
}

/// The order-status flow with the model policy alone (scenarios/order-status-model.toml, no
/// script) on Qwen2.5-0.5B, ranked decoding: the model finds the order, follows it to the
/// shipping form, types the tracking number it read, and answers with the status the shipment
/// page states (the "answers correctly"; bench/agent/README.md has the 5-seed figures).
/// Not the default model: SmolLM2-135M does not pass this flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_policy_answers_order_status_on_qwen() -> Result<()> {
    require_chromium();
    let home = kamera_model::default_home();
    let qwen = kamera_agent::load_model(
        &kamera_agent::ModelSource::Known(kamera_model::ModelName::Qwen25_05b),
        None,
        &home,
    )?;
    let s = kamera_harness::load_scenario(&root().join("scenarios/order-status-model.toml"))?;
    assert_eq!(s.budget.steps, 10);
    let r = kamera_harness::run_scenario(&s, qwen, &home, kamera_harness::RunConfig::default()).await?;
    let actions: Vec<String> = r.actions().iter().map(|a| a.label()).collect();
    eprintln!("order-status, model policy: {actions:?} -> {:?}", r.end.answer);
    assert_eq!(r.end.error, None, "{:?}", r.end);
    assert_eq!(r.end.answer.as_deref(), Some("Awaiting pickup"), "{actions:?}");
    assert_eq!(r.end.success, Some(true), "{:?}", r.end);
    assert!(
        actions.iter().any(|a| a.contains("TRK-")),
        "the tracking number read on the order page was typed: {actions:?}"
    );
    Ok(())
}
