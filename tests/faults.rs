//! A run whose browser is killed in the middle of a step (real Chromium, the embedded model):
//! the run ends with the browser's typed `Crashed` error, the trace is complete (header, the
//! steps taken, an `end` line saying why), and no process or profile of that browser is left.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use kamera_agent::{Error, OnStep, Parts, RunOptions, Scenario, StepResult, Trace, TraceWriter};
use kamera_browser::{Browser, ChromiumBrowser, ChromiumConfig};
use kamera_tests::{model, processes_of, require_chromium};

const SCENARIO: &str = r#"
name = "killed"
goal = "Open the orders list."
start = "/"
[site]
seed = 7
[budget]
steps = 4
[[steps]]
click = "text:Orders"
[[steps]]
wait_ms = 4000
[[steps]]
click = "text:View A-1042"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_killed_mid_step_ends_the_run_with_a_typed_error_and_a_complete_trace() -> Result<()> {
    require_chromium();
    let s = Scenario::parse(SCENARIO, Path::new("killed.toml"))?;
    let served = kamera_harness::serve(&s, &kamera_model::default_home()).await?;
    let mut browser = ChromiumBrowser::launch(ChromiumConfig::new(served.origins.clone())).await?;
    let pid = browser.pid().expect("the browser process");
    let profile = browser.profile_dir().to_path_buf();
    let mut session = kamera_harness::session_for(&s, model())?;
    let mut policy = kamera_harness::policy_for(&s, &served.env.origin);
    let dir = tempfile::tempdir()?;
    // After step 0 is written: SIGKILL 1.5 s later, inside step 1's 4 s wait.
    let on_step: OnStep = Box::new(move |rec| {
        if rec.step == 0 {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1500));
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            });
        }
    });
    let opts = RunOptions {
        trace: Some(TraceWriter::create(dir.path())?),
        on_step: Some(on_step),
        ..Default::default()
    };
    let parts = Parts {
        browser: &mut browser,
        policy: policy.as_mut(),
        session: &mut session,
    };
    let t0 = Instant::now();
    let e = kamera_agent::run_episode(parts, &s, &served.env, opts)
        .await
        .expect_err("the run cannot go on without its browser");
    eprintln!("run ended after {:.1} s: {e}", t0.elapsed().as_secs_f64());
    assert!(
        matches!(&e, Error::Browser(b) if matches!(**b, kamera_browser::Error::Crashed { .. })),
        "{e:?}"
    );
    let trace = Trace::read(dir.path())?;
    assert!(trace.steps[0].result.is_ok());
    // The kill lands in step 1's wait (on a loaded machine it may land while step 1 observes,
    // before its record exists): the step it ended is recorded as failed when it has a record.
    assert!(matches!(trace.steps.len(), 1 | 2), "{} steps", trace.steps.len());
    if let Some(st) = trace.steps.get(1) {
        assert!(
            matches!(&st.result, StepResult::Failed { error } if error.contains("chromium exited")),
            "{:?}",
            st.result
        );
    }
    let end = trace.end.expect("an end line");
    assert_eq!(end.steps, trace.steps.len());
    assert!(
        end.error
            .as_deref()
            .is_some_and(|x| x.contains("chromium exited") && x.contains("SIGKILL")),
        "{end:?}"
    );
    browser.close().await?;
    drop(browser);
    let t1 = Instant::now();
    while (!processes_of(&profile).is_empty() || profile.exists()) && t1.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(processes_of(&profile).is_empty(), "{:?}", processes_of(&profile));
    assert!(!profile.exists(), "profile left: {}", profile.display());
    Ok(())
}
