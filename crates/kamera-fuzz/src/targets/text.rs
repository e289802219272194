//! Text targets: trace NDJSON (`Trace::parse`), the DevTools Recorder JSON written from a parsed
//! trace (`devtools_recorder`), and scenario TOML (`Scenario::parse`). Seeds are a trace
//! recorded by `kamera record` on the local site and every scenario under `scenarios/`.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use kamera_agent::{Line, Scenario, Trace, devtools_recorder};
use kamera_browser::Action;

use super::{Outcome, Target, read_seed, rejected};
use crate::error::{Error, Result};

const TRACE: &str = "fuzz/trace.ndjson";
const SCENARIO: &str = "fuzz/scenario.toml";

const JSON_DICT: [&[u8]; 24] = [
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e999",
    b"-0.0",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"\n",
    b"\r\n",
    b"{\"kind\":\"step\",",
    b"{\"kind\":\"end\",\"steps\":1}",
    b"{\"kind\":\"header\",\"version\":2,",
    b"\"outcome\":\"failed\",\"error\":\"x\"",
    b"NaN",
    b"\"action\":\"type\",\"id\":null,",
];

const TOML_DICT: [&[u8]; 24] = [
    b"[[steps]]\n",
    b" = ",
    b"\"",
    b"'''",
    b"\"\"\"",
    b"[",
    b"]",
    b"{",
    b"}",
    b"\n",
    b"1e400",
    b"nan",
    b"-inf",
    b"-0",
    b"9223372036854775808",
    b"[site]\nseed = 1\n",
    b"[episode]\nsuite = \"x\"\nreward_js = \"[true, 1]\"\n",
    b"remember = \"x\"\nregex = '(((('\n",
    b"policy = \"model\"\n",
    b"\\u0000",
    b"# ",
    b"1979-05-27T07:32:00Z",
    b"scroll = nan\n",
    b"back = false\n",
];

fn trace_seeds() -> Result<Vec<Vec<u8>>> {
    let full = read_seed("trace", "order-status.trace.ndjson")?;
    // A short seed too (header, two steps, end) so that more mutations land in each line kind.
    let lines: Vec<&[u8]> = full.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
    let mut short = Vec::new();
    for l in lines.iter().take(3).chain(lines.last()) {
        short.extend_from_slice(l);
        short.push(b'\n');
    }
    Ok(vec![full, short])
}

fn parse_trace(b: &[u8]) -> kamera_agent::Result<Trace> {
    Trace::parse(Cursor::new(b), Path::new(TRACE), PathBuf::from("fuzz"))
}

pub(super) fn trace() -> Result<Target> {
    Ok(Target {
        name: "trace",
        about: "Trace::parse over trace NDJSON (a parsed trace must write back and parse again); \
                seed: a trace recorded by `kamera record order-status`"
            .into(),
        seeds: trace_seeds()?,
        dict: JSON_DICT.to_vec(),
        bound: |n| 32 * n + (1 << 20),
        bound_text: "32 x input + 1 MiB",
        fixup: None,
        decode: Box::new(|b| match parse_trace(b) {
            Err(e) => rejected(TRACE, e.to_string()),
            Ok(t) => {
                let mut again = Vec::new();
                let mut push = |l: &Line| -> std::result::Result<(), String> {
                    again.extend(serde_json::to_vec(l).map_err(|e| format!("parsed line does not serialize: {e}"))?);
                    again.push(b'\n');
                    Ok(())
                };
                push(&Line::Header(t.header.clone()))?;
                for s in &t.steps {
                    push(&Line::Step(Box::new(s.clone())))?;
                }
                if let Some(e) = &t.end {
                    push(&Line::End(e.clone()))?;
                }
                let back =
                    parse_trace(&again).map_err(|e| format!("a parsed trace written back does not parse: {e}"))?;
                if back.steps.len() != t.steps.len() || back.end.is_some() != t.end.is_some() {
                    return Err("a parsed trace written back lost lines".into());
                }
                Ok(Outcome::Accepted)
            }
        }),
    })
}

/// Recorder steps one action becomes.
fn recorder_steps(a: &Option<Action>) -> usize {
    match a {
        Some(Action::Key { .. }) => 2,
        Some(Action::Wait { .. } | Action::Done { .. }) | None => 0,
        Some(_) => 1,
    }
}

pub(super) fn recorder() -> Result<Target> {
    Ok(Target {
        name: "recorder",
        about: "DevTools Recorder JSON written from each parsed mutated trace: it must be JSON with \
                setViewport, navigate and one entry per action (two per key)"
            .into(),
        seeds: trace_seeds()?,
        dict: JSON_DICT.to_vec(),
        bound: |n| 64 * n + (1 << 20),
        bound_text: "64 x input + 1 MiB",
        fixup: None,
        decode: Box::new(|b| match parse_trace(b) {
            Err(e) => rejected(TRACE, e.to_string()),
            Ok(t) => {
                let json = devtools_recorder("fuzz", &t.header.origin, &t.steps, 800, 600);
                let text =
                    serde_json::to_string(&json).map_err(|e| format!("recorder JSON does not serialize: {e}"))?;
                let back: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| format!("recorder JSON does not parse back: {e}"))?;
                let n = back["steps"].as_array().map_or(0, |a| a.len());
                let want = 2 + t.steps.iter().map(|s| recorder_steps(&s.action)).sum::<usize>();
                if n != want {
                    return Err(format!("recorder JSON has {n} steps, the trace's actions make {want}"));
                }
                Ok(Outcome::Accepted)
            }
        }),
    })
}

pub(super) fn scenario() -> Result<Target> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let mut seeds = Vec::new();
    let entries = std::fs::read_dir(&dir).map_err(|e| Error::Seed {
        target: "scenario",
        path: dir.clone(),
        detail: e.to_string(),
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    for p in paths {
        seeds.push(std::fs::read(&p).map_err(|e| Error::Seed {
            target: "scenario",
            path: p.clone(),
            detail: e.to_string(),
        })?);
    }
    Ok(Target {
        name: "scenario",
        about: "Scenario::parse over scenario TOML (a parsed scenario's to_toml must parse to the same \
                scenario, as trace headers and replays rely on); seeds: scenarios/*.toml"
            .into(),
        seeds,
        dict: TOML_DICT.to_vec(),
        bound: |n| 64 * n + (16 << 20),
        bound_text: "64 x input + 16 MiB (a `remember` regex compiles within the regex crate's 10 MiB limit)",
        fixup: None,
        decode: Box::new(|b| {
            let Ok(text) = std::str::from_utf8(b) else {
                // `Scenario::load` reads with read_to_string, which refuses invalid UTF-8.
                return Ok(Outcome::Rejected(format!("{SCENARIO}: not UTF-8")));
            };
            match Scenario::parse(text, Path::new(SCENARIO)) {
                Err(e) => rejected(SCENARIO, e.to_string()),
                Ok(s) => {
                    let toml = s.to_toml();
                    let back = Scenario::parse(&toml, Path::new(SCENARIO))
                        .map_err(|e| format!("to_toml of a parsed scenario does not parse: {e}\n{toml}"))?;
                    if back != s {
                        return Err(format!(
                            "to_toml of a parsed scenario parses to another scenario:\n{toml}"
                        ));
                    }
                    Ok(Outcome::Accepted)
                }
            }
        }),
    })
}
