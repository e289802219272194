//! MiniWoB++ fetched by several callers at once on an empty home (tests running in parallel on
//! a fresh machine): every one gets the whole folder, and none removes the folder another is
//! serving. The download itself is `pip download` of the registry package (a second or two).

use kamera_harness::miniwob;

#[test]
fn concurrent_fetches_on_an_empty_home_all_get_the_whole_folder() -> Result<(), Box<dyn std::error::Error>> {
    let home = tempfile::tempdir()?;
    let got: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| miniwob::ensure(home.path()))).collect();
        handles.into_iter().map(|h| h.join().expect("no panic")).collect()
    });
    for (i, r) in got.into_iter().enumerate() {
        let html = r.map_err(|e| format!("fetch {i}: {e}"))?;
        assert!(
            html.join("core").join("core.js").exists(),
            "fetch {i}: {}",
            html.display()
        );
        assert!(html.join("miniwob").join("click-test.html").exists());
    }
    let left: Vec<_> = std::fs::read_dir(home.path())?
        .chain(std::fs::read_dir(home.path().join("downloads"))?)
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(left.is_empty(), "partial folders left: {left:?}");
    Ok(())
}
