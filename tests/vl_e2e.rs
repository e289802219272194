//! Screenshots as image chunks end to end on real Chromium with the tiny random-weight
//! Qwen2.5-VL (mechanics, not behaviour: its answers are noise): every page is an image chunk,
//! revisited pages are recalled as the same chunk, only the screenshots in the window the model
//! reads (the last step) go through the vision tower, each once, and a replay of the trace
//! without a browser reproduces the run's actions and visits.

use std::sync::Arc;

use anyhow::Result;
use kamera_agent::Scenario;
use kamera_harness::RunConfig;
use kamera_model::Model;
use kamera_sched::Visit;
use kamera_tests::{require_chromium, root};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_become_image_chunks_recalled_and_replayed() -> Result<()> {
    require_chromium();
    let model = Arc::new(Model::load(
        &root().join("crates/kamera-model/tests/golden/qwen25vl-tiny"),
    )?);
    let s = Scenario::load(&root().join("scenarios/screenshots.toml"))?;
    let dir = tempfile::tempdir()?;
    let cfg = RunConfig {
        trace_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let r = kamera_harness::run_scenario(&s, model.clone(), &kamera_model::default_home(), cfg).await?;
    let visits: Vec<Visit> = r.steps.iter().map(|st| st.visit).collect();
    println!("visits {visits:?}\nsession {:?}", r.session);
    assert_eq!(r.end.error, None, "{:?}", r.end);
    assert_eq!(r.end.js_check, Some(true));
    // Only the last step reads the model: the session holds its plans until then, so only the
    // screenshots in the window it reads go through the tower, each once.
    let new = visits.iter().filter(|v| **v == Visit::New).count();
    assert!(
        r.session.images_encoded >= 1 && r.session.images_encoded < new,
        "{} screenshots through the tower for {new} new ones",
        r.session.images_encoded
    );
    assert_eq!(
        visits,
        [
            Visit::New,
            Visit::New,
            Visit::New,
            Visit::Recall,
            Visit::Recall,
            Visit::Recall
        ],
        "home, orders, order: evicted and recalled when revisited (the same pixels, the same chunk)"
    );
    assert!(r.session.evictions > 0, "{:?}", r.session);
    let rep = kamera_harness::replay(dir.path(), model).await?;
    assert_eq!(rep.first_mismatch, None, "replay actions differ");
    let replayed: Vec<Visit> = rep.summary.steps.iter().map(|st| st.visit).collect();
    assert_eq!(replayed, visits, "replay meets the same chunks the same way");
    let chunks = |steps: &[kamera_agent::StepRecord]| steps.iter().map(|st| st.chunk).collect::<Vec<_>>();
    assert_eq!(chunks(&rep.summary.steps), chunks(&r.steps));
    Ok(())
}
