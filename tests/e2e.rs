//! End to end on real Chromium with the embedded default model (SmolLM2-135M-Instruct): the
//! local site's order-status flow, MiniWoB++ tasks (the new actions among them), record + replay,
//! refused navigation.
//! Needs Debian's chromium: scripts/install-chromium.sh installs it.

use std::path::Path;

use anyhow::Result;
use kamera_agent::{Scenario, StepResult};
use kamera_harness::RunConfig;
use kamera_sched::{Step, Visit};
use kamera_tests::{model, require_chromium, root};

fn scenario(name: &str) -> Scenario {
    kamera_harness::load_scenario(&root().join("scenarios").join(format!("{name}.toml"))).expect("scenario")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_status_prefills_only_the_window_the_model_reads() -> Result<()> {
    require_chromium();
    let s = scenario("order-status");
    let r = kamera_harness::run_scenario(&s, model(), &kamera_model::default_home(), RunConfig::default()).await?;
    assert_eq!(r.end.error, None);
    assert_eq!(r.end.answer.as_deref(), Some("Awaiting pickup"), "{:?}", r.end);
    assert_eq!(r.end.success, Some(true));
    assert_eq!(
        r.end.js_check,
        Some(true),
        "the scenario's JS predicate holds on the final page"
    );
    // The scheduler planned every step; the plans were held until the one model read (the
    // question on the revisited order page, which had been evicted and is recalled). No page
    // the model never read was prefilled: the run's forward passes are the window it read.
    let last = r.steps.last().unwrap();
    assert_eq!(last.visit, Visit::Recall, "{:#?}", last.plan);
    assert!(
        !last.plan.iter().any(|p| matches!(p, Step::Prefill { alone: true, .. })),
        "{:#?}",
        last.plan
    );
    let m = last.model.as_ref().expect("the question went to the model");
    assert!(m.context_tokens > 200);
    assert!(last.rebuilt, "the read built the window afresh");
    assert_eq!(
        r.session.prefill_tokens, m.context_tokens,
        "only the window the model read was prefilled: {:?}",
        r.session
    );
    assert!(r.session.evictions > 0, "{:?}", r.session);
    // No trace and a policy that reads text: no step took a screenshot.
    assert!(
        r.steps.iter().all(|s| s.observation.screenshot.is_empty()),
        "{:?}",
        r.steps.iter().map(|s| &s.observation.screenshot).collect::<Vec<_>>()
    );
    Ok(())
}

/// The same flow on an MLA model (the tiny seeded DeepSeek-V2 of kamera-model's goldens, random
/// weights, a byte tokenizer): the Session holds its pages as c_KV + k_rope, evicts and recalls
/// the order page, and the model answers the question with one of its choices. The answer
/// itself is chance (random weights), so only that it is one of the choices is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_status_runs_on_an_mla_model() -> Result<()> {
    require_chromium();
    let s = scenario("order-status");
    let dir = root().join("crates/kamera-model/tests/golden/deepseekv2-tiny");
    let mla = std::sync::Arc::new(kamera_model::Model::load(&dir)?);
    assert!(matches!(mla.layout().attention, kamera_ops::Attention::Mla { .. }));
    let r = kamera_harness::run_scenario(&s, mla, &kamera_model::default_home(), RunConfig::default()).await?;
    assert_eq!(r.end.error, None, "{:?}", r.end);
    let answer = r.end.answer.clone().expect("the question was answered");
    let choices = [
        "Delivered",
        "In transit",
        "Out for delivery",
        "Held at customs",
        "Awaiting pickup",
    ];
    assert!(
        choices.contains(&answer.as_str()),
        "{answer:?} is not one of the scenario's choices"
    );
    let last = r.steps.last().unwrap();
    assert_eq!(last.visit, Visit::Recall, "{:#?}", last.plan);
    assert!(last.model.is_some(), "the question went to the model");
    assert!(r.session.evictions > 0, "{:?}", r.session);
    Ok(())
}

/// The directory flow in a window of 256 tokens, smaller than several of its pages: each page
/// longer than a chunk's cap (128 tokens) runs as several chunks, the question on the directory
/// page brings the team page back by relevance, and the run ends where the scenario says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_larger_than_the_window_run_as_several_chunks() -> Result<()> {
    require_chromium();
    let s = scenario("directory-pages");
    assert_eq!(s.budget.window_tokens, 256);
    let r = kamera_harness::run_scenario(&s, model(), &kamera_model::default_home(), RunConfig::default()).await?;
    assert_eq!(r.end.error, None, "{:?}", r.end);
    for st in &r.steps {
        assert_eq!(st.result, StepResult::Ok, "step {}: {}", st.step, st.result);
    }
    assert_eq!(r.end.success, Some(true), "{:?}", r.end);
    eprintln!("(url, page tokens, chunks) per step: {:?}", tokens(&r));
    let big = r.steps.iter().filter(|st| st.chunk_tokens > 256).count();
    assert!(big > 0, "some page is longer than the window: {:?}", tokens(&r));
    for st in r.steps.iter().filter(|st| st.chunk_tokens > 128) {
        assert!(
            st.chunks.len() > 1,
            "step {} ({} tokens) is one chunk",
            st.step,
            st.chunk_tokens
        );
        assert_eq!(st.chunks[0], st.chunk, "the step names the page's first chunk");
    }
    // The answering step is on the directory page; the team page (evicted by the catalogue's
    // blocks) comes back for the question.
    let last = r.steps.last().unwrap();
    assert!(last.observation.url.ends_with("/people"), "{}", last.observation.url);
    let team = r
        .steps
        .iter()
        .find(|st| st.observation.url.contains("/teams/"))
        .expect("the flow visits the team page");
    let team_chunks: Vec<_> = std::iter::once(team.chunk).chain(team.chunks.iter().copied()).collect();
    assert!(
        last.plan
            .iter()
            .any(|p| matches!(p, Step::Recall { chunk } if team_chunks.contains(chunk))
                || matches!(p, Step::Prefill { chunk, .. } if team_chunks.contains(chunk))),
        "{:#?}",
        last.plan
    );
    assert!(last.model.is_some(), "the question went to the model");
    assert!(r.session.evictions > 0, "{:?}", r.session);
    Ok(())
}

fn tokens(r: &kamera_agent::RunSummary) -> Vec<(String, usize, usize)> {
    r.steps
        .iter()
        .map(|st| (st.observation.url.clone(), st.chunk_tokens, st.chunks.len()))
        .collect()
}

/// The floor of a scripted MiniWoB++ episode's reward: kamera-agent's README reports 0.87-0.99
/// for the scripted scenarios; the tests assert its 0.87 less a stated tolerance of 0.07. A right
/// answer's reward is 1 less the share of the 60 s episode spent (0.07 is 4.2 s more on a loaded
/// host); a wrong one is at most 0 (-1 for click-checkboxes' wrong box).
const SCRIPTED_REWARD_FLOOR: f64 = 0.87 - 0.07;

/// The new actions on MiniWoB++ pages, scripted: a link that is a span with a click handler
/// (`text:` target), a `<select>`, checkboxes by their label text (check, uncheck, check), and a
/// drag in a jQuery UI sortable. Each episode must end with the README's reward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn miniwob_new_actions_scripted_reward() -> Result<()> {
    require_chromium();
    for (name, action) in [
        ("miniwob-click-link", "click"),
        ("miniwob-choose-list", "select"),
        ("miniwob-click-checkboxes", "uncheck"),
        ("miniwob-drag-items", "drag"),
    ] {
        let s = scenario(name);
        let r = kamera_harness::run_scenario(&s, model(), &kamera_model::default_home(), RunConfig::default()).await?;
        assert_eq!(r.end.error, None, "{name}: {:?}", r.end);
        for st in &r.steps {
            assert_eq!(st.result, StepResult::Ok, "{name} step {}: {}", st.step, st.result);
        }
        assert!(
            r.actions().iter().any(|a| a.label().starts_with(action)),
            "{name}: {:?}",
            r.actions()
        );
        let reward = r.end.reward.unwrap_or_else(|| panic!("{name}: no reward: {:?}", r.end));
        eprintln!("{name}: reward {reward:.3}");
        assert!(reward >= SCRIPTED_REWARD_FLOOR, "{name}: reward {reward}");
        assert_eq!(r.end.success, Some(true), "{name}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn miniwob_enter_text_scripted_reward() -> Result<()> {
    require_chromium();
    let s = scenario("miniwob-enter-text");
    let r = kamera_harness::run_scenario(&s, model(), &kamera_model::default_home(), RunConfig::default()).await?;
    let reward = r.end.reward.expect("episode ended with a reward");
    eprintln!("miniwob-enter-text: reward {reward:.3}");
    assert!(reward >= SCRIPTED_REWARD_FLOOR, "reward {reward}: {:?}", r.end);
    assert_eq!(r.end.success, Some(true));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_then_replay_without_browser() -> Result<()> {
    require_chromium();
    let dir = tempfile::tempdir()?;
    let s = scenario("order-status");
    let model = model();
    let cfg = RunConfig {
        trace_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let rec = kamera_harness::run_scenario(&s, model.clone(), &kamera_model::default_home(), cfg).await?;
    assert!(dir.path().join("trace.ndjson").exists());
    let shots = std::fs::read_dir(dir.path().join("resources"))?.count();
    assert!(shots >= 5, "{shots} screenshots stored");
    // A trace keeps every step's screenshot, though the policy reads text only.
    assert!(rec.steps.iter().all(|s| s.observation.screenshot.len() == 64));
    let trace = kamera_agent::Trace::read(dir.path())?;
    let rec_json = kamera_agent::devtools_recorder(&s.name, &trace.steps[0].observation.url, &trace.steps, 800, 600);
    let kinds: Vec<&str> = rec_json["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "setViewport",
            "navigate",
            "click",
            "click",
            "click",
            "change",
            "keyDown",
            "keyUp",
            "navigate"
        ]
    );
    let rep = kamera_harness::replay(dir.path(), model).await?;
    assert!(rep.matches(), "first mismatch at {:?}", rep.first_mismatch);
    assert_eq!(rep.replayed, rec.actions());
    assert_eq!(rep.summary.end.answer, rec.end.answer);
    // The same work, replayed (deferred_ms is a timing: it differs run to run).
    let work = |s: &kamera_agent::SessionStats| kamera_agent::SessionStats {
        deferred_ms: 0.0,
        ..s.clone()
    };
    assert_eq!(
        work(&rep.summary.session),
        work(&rec.session),
        "the same plans, replayed"
    );
    let plans = |s: &kamera_agent::RunSummary| s.steps.iter().map(|x| x.plan.clone()).collect::<Vec<_>>();
    assert_eq!(plans(&rep.summary), plans(&rec));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn navigation_off_allowed_origins_is_refused() -> Result<()> {
    require_chromium();
    let s = Scenario::parse(
        r##"
        name = "escape"
        goal = "Try to leave the site."
        [site]
        seed = 7
        [budget]
        steps = 8
        [[steps]]
        navigate = "file:///etc/passwd"
        [[steps]]
        navigate = "chrome://settings"
        [[steps]]
        navigate = "/leave"
        [[steps]]
        click = "#partner"
        [[steps]]
        ask = "Which page is this?"
        choices = ["Partner sites", "Orders"]
        "##,
        Path::new("escape.toml"),
    )?;
    let r = kamera_harness::run_scenario(&s, model(), &kamera_model::default_home(), RunConfig::default()).await?;
    assert_eq!(r.end.error, None, "a refusal does not end the run");
    assert_eq!(
        r.refused,
        3,
        "{:#?}",
        r.steps.iter().map(|s| &s.result).collect::<Vec<_>>()
    );
    let refused =
        |i: usize, what: &str| matches!(&r.steps[i].result, StepResult::Refused { detail } if detail.contains(what));
    assert!(refused(0, "file"), "{:?}", r.steps[0].result);
    assert!(refused(1, "chrome"), "{:?}", r.steps[1].result);
    assert!(refused(3, "partner.invalid"), "{:?}", r.steps[3].result);
    // Nothing off-origin was ever observed.
    assert!(
        r.steps
            .iter()
            .all(|s| !s.observation.url.contains("partner.invalid") && !s.observation.url.starts_with("file:"))
    );
    assert!(r.end.answer.is_some());
    Ok(())
}

/// The model policy always acts within the grammar: when SmolLM2's free JSON names no valid
/// action, it ranks the page's valid actions; on click-test it clicks the button, in time for
/// the scripted runs' reward floor.
// Long: one end-to-end episode (fetch, serve, browse, act, score) with its assertions between
// the steps they check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_policy_acts_validly_on_miniwob_click_test() -> Result<()> {
    require_chromium();
    let s = scenario("miniwob-click-test-model");
    let r = kamera_harness::run_scenario(&s, model(), &kamera_model::default_home(), RunConfig::default()).await?;
    assert_eq!(r.end.error, None, "{:?}", r.end);
    for st in &r.steps {
        assert_eq!(st.result, StepResult::Ok, "step {}: {}", st.step, st.result);
        let m = st.model.as_ref().expect("every action came from the model");
        assert!(m.output.starts_with("Next action: "), "{}", m.output);
    }
    let reward = r.end.reward.expect("episode ended with a reward");
    eprintln!("miniwob-click-test-model: reward {reward:.3}");
    // kamera-agent's README (the agent benchmark): SmolLM2 constrained passes click-test seed 1
    // at 0.96; here a right click within 12 s of the 60 s episode.
    assert!(
        reward >= SCRIPTED_REWARD_FLOOR,
        "reward {reward}: {:?}",
        r.steps.last().map(|s| &s.action)
    );
    Ok(())
}

/// The builder API on real Chromium: a scripted policy answers order-status through the
/// builder's agent; in the same session `act` takes one valid model step and a second task
/// runs; a deadline ends a run with a typed error; a builder with nowhere to go is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builder_api_runs_tasks_in_one_session() -> Result<()> {
    use kamera_agent::{Agent, Error, ScriptedPolicy};
    require_chromium();
    let s = scenario("order-status");
    let server = kamera_browser::Server::start(kamera_browser::Content::Memory(kamera_site::generate(7))).await?;
    let mut agent = Agent::builder()
        .task(&s.goal)
        .start_url(server.url("/"))
        .model(model())
        .policy(ScriptedPolicy::new(s.steps.clone(), &server.origin()))
        .budget(s.budget.clone())
        .build()?;
    let h = agent.run().await?;
    assert_eq!(h.end.answer.as_deref(), Some("Awaiting pickup"), "{:?}", h.end);
    let pages = agent.session().stats().new;
    // One model step on the page the first task left: constrained, so a valid action.
    let page = agent.observe().await?;
    assert!(page.url.ends_with("/orders/A-1042"), "{}", page.url);
    let action = agent.act("Open the orders list").await?;
    assert!(kamera_agent::valid(&page, &action), "{action:?} on {}", page.text);
    // A second task in the same session: pages seen before are not new again.
    let again = agent.run_task("Open the orders list").await;
    assert!(!matches!(again, Err(Error::Build { .. })), "{again:?}");
    assert!(agent.session().stats().hits > 0, "{:?}", agent.session().stats());
    assert!(agent.session().stats().new >= pages);
    agent.close().await?;

    let mut late = Agent::builder()
        .task("Find anything")
        .start_url(server.url("/"))
        .model(model())
        .deadline(std::time::Duration::from_millis(1))
        .build()?;
    let e = late.run().await.unwrap_err();
    assert!(matches!(e, Error::Deadline { .. }), "{e}");
    late.close().await?;

    let e = Agent::builder()
        .task("x")
        .model(model())
        .build()
        .err()
        .expect("no origin");
    assert!(
        matches!(e, Error::Build { .. }) && e.to_string().contains("start_url"),
        "{e}"
    );
    Ok(())
}

/// A second [`LanguageModel`] plugged into the builder (a test double that reads the window as
/// text, as a remote model would): the agent takes the action it writes, on real Chromium, and
/// the window text it was given holds the page the session placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugged_language_model_drives_the_agent() -> Result<()> {
    use kamera_agent::{Agent, LanguageModel, ModelCall, View};
    use std::sync::{Arc, Mutex};

    /// Clicks the listed element whose text is `word`: ranked (the default decoding), it picks
    /// the candidate that names the word; asked for free text, it writes JSON found in the window
    /// text (not a reply in words: constrained decoding then ranks).
    struct Keyword {
        word: &'static str,
        seen: Arc<Mutex<Vec<String>>>,
    }
    impl LanguageModel for Keyword {
        fn generate_after(
            &self,
            view: &mut View<'_>,
            _instruction: &str,
            lead: &str,
            _max_new: usize,
            _seed: u64,
        ) -> kamera_agent::Result<ModelCall> {
            self.seen.lock().unwrap().push(view.text.to_string());
            // Lines such as `[3] a "Orders"`.
            let quoted = format!("\"{}\"", self.word);
            let id = view
                .text
                .lines()
                .filter(|l| l.contains(&quoted))
                .find_map(|l| l.trim().strip_prefix('[')?.split(']').next()?.parse::<u32>().ok())
                .unwrap_or(0);
            Ok(ModelCall {
                output: format!("{lead}click\", \"id\": {id}}}"),
                ..ModelCall::default()
            })
        }
        fn rank(
            &self,
            view: &mut View<'_>,
            _instruction: &str,
            lead: &str,
            candidates: &[String],
        ) -> kamera_agent::Result<ModelCall> {
            self.seen.lock().unwrap().push(view.text.to_string());
            // The candidate that names the word, else a click, else the first.
            let quoted = format!("\"{}\"", self.word);
            let best = candidates
                .iter()
                .find(|c| c.contains(&quoted))
                .or_else(|| candidates.iter().find(|c| c.contains("click")))
                .unwrap_or(&candidates[0]);
            Ok(ModelCall {
                output: format!("{lead}{best}"),
                ..ModelCall::default()
            })
        }
    }
    require_chromium();
    let server = kamera_browser::Server::start(kamera_browser::Content::Memory(kamera_site::generate(7))).await?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut agent = Agent::builder()
        .task("Open the orders list")
        .start_url(server.url("/"))
        .model(model())
        .language_model(Keyword {
            word: "Orders",
            seen: seen.clone(),
        })
        .max_steps(1)
        .build()?;
    let h = agent.run().await?;
    let step = &h.steps[0];
    let Some(kamera_browser::Action::Click { id }) = step.action else {
        panic!("not a click: {:?}", step.action);
    };
    let el = step
        .observation
        .elements
        .iter()
        .find(|e| e.id == id)
        .expect("a listed element");
    assert_eq!(el.text, "Orders", "{:?}", step.observation.elements);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        3,
        "the ranked policy (the default) writes its plan, then asks the kind, then the action"
    );
    assert!(
        seen[0].contains("Goal: Open the orders list") && !seen[0].contains("Kestrel Supply"),
        "the plan is written before the first page: {}",
        seen[0]
    );
    assert!(
        seen[1].contains("Kestrel Supply") && seen[1].contains("Plan for the goal:"),
        "the page follows the pinned plan: {}",
        seen[1]
    );
    assert!(
        !seen[1].contains("<|im_start|>"),
        "control tokens are left out: {}",
        seen[1]
    );
    let page = agent.observe().await?;
    assert!(page.url.ends_with("/orders"), "the click was taken: {}", page.url);
    agent.close().await?;
    Ok(())
}
