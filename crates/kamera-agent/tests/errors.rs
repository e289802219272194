//! Clear errors for malformed scenario files and traces (no browser, no model).

use std::path::Path;

use kamera_agent::{Error, Scenario, Trace};

#[test]
fn malformed_scenarios_say_what_is_wrong() {
    let p = Path::new("bad.toml");
    let cases = [
        ("name = \"x\"\ngoal = ", "not a valid scenario"),
        ("name = \"x\"\n", "missing field `goal`"),
        (
            "name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n[[steps]]\nclik = \"a\"\n",
            "unknown field `clik`",
        ),
        (
            "name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n[[steps]]\nclick = \"a\"\nkey = \"Enter\"\n",
            "exactly one of",
        ),
        ("name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n", "needs [[steps]]"),
        (
            "name = \"x\"\ngoal = \"g\"\n[[steps]]\nclick = \"a\"\n",
            "no [site] or [episode]",
        ),
        (
            "name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n[[steps]]\nremember = \"v\"\nregex = \"(\"\n",
            "bad regex",
        ),
        (
            "name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n[[steps]]\nselect = \"#s\"\n",
            "needs an `option`",
        ),
        (
            "name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n[[steps]]\ndrag = \"#a\"\n",
            "needs a `to` target",
        ),
        (
            "name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n[[steps]]\nclick = \"#a\"\nto = \"#b\"\n",
            "`to` does not go with `click`",
        ),
        (
            "name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n[[steps]]\nhover = \"#a\"\ntimeout_ms = 5\n",
            "`timeout_ms` does not go with `hover`",
        ),
    ];
    for (text, want) in cases {
        let e = Scenario::parse(text, p).unwrap_err();
        assert!(matches!(e, Error::Scenario { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("bad.toml") && msg.contains(want), "{text:?}: {msg}");
    }
    let e = Scenario::load(Path::new("/nonexistent/scenario.toml")).unwrap_err();
    assert!(e.to_string().contains("cannot read"), "{e}");
}

/// Every step kind survives the trip through TOML (traces embed the scenario).
#[test]
fn every_step_kind_round_trips() {
    use kamera_agent::ScriptStep;
    let text = r##"
name = "all"
goal = "g"
[site]
seed = 1
[[steps]]
select = "#s"
option = "Bob"
[[steps]]
check = "text:Remember me"
[[steps]]
uncheck = "[3]"
[[steps]]
hover = "#menu"
[[steps]]
drag = "text:A"
to = "text:B"
[[steps]]
scroll_to = "#far"
[[steps]]
switch_tab = 1
[[steps]]
wait_for = "text:Done"
[[steps]]
wait_for = "#x"
timeout_ms = 250
"##;
    let s = Scenario::parse(text, Path::new("all.toml")).unwrap();
    let t = |x: &str| x.to_string();
    assert_eq!(
        s.steps,
        [
            ScriptStep::Select {
                target: t("#s"),
                option: t("Bob")
            },
            ScriptStep::Check {
                target: t("text:Remember me")
            },
            ScriptStep::Uncheck { target: t("[3]") },
            ScriptStep::Hover { target: t("#menu") },
            ScriptStep::Drag {
                from: t("text:A"),
                to: t("text:B")
            },
            ScriptStep::ScrollTo { target: t("#far") },
            ScriptStep::SwitchTab { index: 1 },
            ScriptStep::WaitFor {
                target: t("text:Done"),
                ms: kamera_agent::DEFAULT_WAIT_MS
            },
            ScriptStep::WaitFor {
                target: t("#x"),
                ms: 250
            },
        ]
    );
    assert_eq!(Scenario::parse(&s.to_toml(), Path::new("again.toml")).unwrap(), s);
}

#[test]
fn malformed_traces_say_where() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("trace.ndjson");
    let e = Trace::read(dir.path()).unwrap_err();
    assert!(e.to_string().contains("cannot open"), "{e}");

    std::fs::write(&t, "this is not json\n").unwrap();
    let e = Trace::read(dir.path()).unwrap_err();
    assert!(matches!(e, Error::Trace { line: 1, .. }), "{e:?}");
    assert!(
        e.to_string().contains("line 1") && e.to_string().contains("not a trace line"),
        "{e}"
    );

    let header =
        r#"{"kind":"header","version":2,"scenario":"","origin":"http://127.0.0.1:1","model":"m","started_unix_ms":0}"#;
    std::fs::write(&t, format!("{header}\n{{\"kind\":\"step\",\"step\":0}}\n")).unwrap();
    let e = Trace::read(dir.path()).unwrap_err();
    assert!(e.to_string().contains("line 2"), "{e}");

    std::fs::write(&t, header.replace("\"version\":2", "\"version\":99") + "\n").unwrap();
    let e = Trace::read(dir.path()).unwrap_err();
    assert!(e.to_string().contains("version 99"), "{e}");

    std::fs::write(&t, "{\"kind\":\"end\",\"steps\":0,\"answer\":null,\"success\":null}\n").unwrap();
    let e = Trace::read(dir.path()).unwrap_err();
    assert!(e.to_string().contains("header"), "{e}");
}
