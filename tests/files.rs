//! Files end to end on real Chromium: scenarios/return-with-receipt.toml downloads an invoice
//! from the local site (saved in the trace's downloads folder with its exact bytes, listed in
//! the step and end records) and uploads a receipt from the scenario's `uploads` folder (the
//! server's answer page names it and its size); a step whose file is outside that folder is
//! refused before anything runs.

use std::path::Path;

use anyhow::Result;
use kamera_agent::{Scenario, StepResult};
use kamera_browser::Action;
use kamera_harness::RunConfig;
use kamera_tests::{model, require_chromium, root};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scenario_uploads_and_downloads() -> Result<()> {
    require_chromium();
    let s = kamera_harness::load_scenario(&root().join("scenarios/return-with-receipt.toml"))?;
    let trace = tempfile::tempdir()?;
    let cfg = RunConfig {
        trace_dir: Some(trace.path().to_path_buf()),
        ..Default::default()
    };
    let r = kamera_harness::run_scenario(&s, model(), &kamera_model::default_home(), cfg).await?;
    assert_eq!(r.end.error, None, "{:?}", r.end);
    for st in &r.steps {
        assert_eq!(st.result, StepResult::Ok, "step {}: {}", st.step, st.result);
    }
    // The upload went out as the scenario's file, and the server's answer (its JS check) names it.
    let receipt = std::fs::canonicalize(root().join("scenarios/files/receipt.txt"))?;
    assert!(
        r.steps
            .iter()
            .any(|st| matches!(&st.action, Some(Action::Upload { path, .. }) if *path == receipt)),
        "{:?}",
        r.actions()
    );
    assert_eq!(
        std::fs::metadata(&receipt)?.len(),
        52,
        "the scenario's check names 52 bytes"
    );
    assert_eq!(
        r.end.js_check,
        Some(true),
        "the answer page does not say received receipt.txt (52 bytes)"
    );
    assert_eq!(r.end.success, Some(true));

    // The invoice: in <trace>/downloads, its exact bytes, listed once by its step and the end.
    let order = kamera_site::data(7)
        .orders
        .into_iter()
        .find(|o| o.id == "A-1042")
        .expect("A-1042");
    let want = kamera_site::invoice_csv(&order);
    assert_eq!(r.end.downloads.len(), 1, "{:?}", r.end.downloads);
    let d = &r.end.downloads[0];
    assert_eq!(d.filename, "A-1042.csv");
    assert_eq!(d.path, std::path::absolute(trace.path().join("downloads/A-1042.csv"))?);
    assert_eq!(std::fs::read_to_string(&d.path)?, want);
    assert_eq!(d.bytes, want.len() as u64);
    let with: Vec<usize> = r
        .steps
        .iter()
        .filter(|st| !st.downloads.is_empty())
        .map(|st| st.step)
        .collect();
    assert_eq!(with.len(), 1, "{with:?}");
    let ndjson = std::fs::read_to_string(trace.path().join("trace.ndjson"))?;
    assert!(ndjson.contains("\"downloads\"") && ndjson.contains("A-1042.csv"));
    Ok(())
}

#[test]
fn an_upload_outside_the_folder_is_refused() {
    let text = std::fs::read_to_string(root().join("scenarios/return-with-receipt.toml")).expect("scenario");
    let bad = text.replace("path = \"receipt.txt\"", "path = \"../order-status.toml\"");
    assert_ne!(bad, text);
    let e = Scenario::parse(&bad, &root().join("scenarios/x.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("step 5") && e.contains("outside") && e.contains("files"),
        "{e}"
    );
    let none = text.replace("uploads = \"files\"\n", "");
    let e = Scenario::parse(&none, Path::new("x.toml")).unwrap_err().to_string();
    assert!(e.contains("step 5") && e.contains("uploads"), "{e}");
}
