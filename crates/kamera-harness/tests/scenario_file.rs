//! Scenario files as the harness reads them: every shipped scenario, and a `[miniwob]` task
//! turned into its start page and episode protocol.

use std::path::Path;

use kamera_harness::miniwob::{MiniWobSpec, SUITE, task_path};
use kamera_harness::{load_scenario, parse_scenario};

#[test]
fn the_shipped_scenarios_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let (mut n, mut suites) = (0, 0);
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let s = load_scenario(&p).unwrap_or_else(|e| panic!("{e}"));
            suites += usize::from(s.episode.is_some());
            n += 1;
        }
    }
    assert!(n >= 10, "{n} scenarios");
    assert!(suites >= 8, "{suites} MiniWoB++ scenarios");
}

#[test]
fn a_miniwob_task_becomes_its_start_page_and_episode() {
    let text = "name = \"m\"\ngoal = \"Click.\"\n[miniwob]\ntask = \"click-test\"\nseed = 3\nepisode_ms = 5000\n\
                [[steps]]\nclick = \"#subbtn\"\n";
    let s = parse_scenario(text, Path::new("m.toml")).unwrap();
    assert_eq!(s.start, task_path("click-test"));
    let spec = MiniWobSpec {
        task: "click-test".into(),
        seed: 3,
        episode_ms: Some(5000),
    };
    let e = s.episode.clone().unwrap();
    assert_eq!(e, spec.episode());
    assert_eq!(e.suite, SUITE);
    assert!(e.start_js.contains("Math.seedrandom('3')") && e.start_js.contains("EPISODE_MAX_TIME = 5000"));
    // What a trace stores (the scenario as kamera-agent writes it) reads back the same.
    assert_eq!(
        kamera_agent::Scenario::parse(&s.to_toml(), Path::new("t.toml")).unwrap(),
        s
    );
}

#[test]
fn bad_miniwob_tables_name_the_file_and_the_problem() {
    let cases = [
        (
            "name = \"m\"\ngoal = \"g\"\n[miniwob]\nseed = 1\n",
            "missing field `task`",
        ),
        (
            "name = \"m\"\ngoal = \"g\"\n[miniwob]\ntask = \"t\"\nfoo = 1\n",
            "unknown field `foo`",
        ),
        (
            "name = \"m\"\ngoal = \"g\"\n[site]\nseed = 1\n[miniwob]\ntask = \"t\"\n",
            "remove `site`",
        ),
        (
            "name = \"m\"\ngoal = \"g\"\nstart = \"/x\"\n[miniwob]\ntask = \"t\"\n",
            "remove `start`",
        ),
        ("name = \"m\"\ngoal = ", "not a valid scenario"),
    ];
    for (text, want) in cases {
        let e = parse_scenario(text, Path::new("bad.toml")).unwrap_err().to_string();
        assert!(e.contains("bad.toml") && e.contains(want), "{text:?}: {e}");
    }
}
