//! `kamera mcp` end to end, driven by the official MCP Python SDK's client
//! (scripts/mcp_client_check.py in the venv scripts/mcp-venv.sh keeps; installed here when
//! missing) over stdio and over streamable HTTP, on the local demo site (seed 7) with real
//! Chromium and the default model (fetched by the binary): navigate, observe as text and as a
//! PNG, click and type through the order flow to a shipment page, extract its tracking number
//! and status as JSON under a schema, and the tool errors: a navigation off the allowed origins,
//! an unknown target, an unknown action, an unsupported schema keyword, an unknown observe mode.
//! Nothing here is skipped: a missing Python, venv or browser fails the test.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use serde_json::{Value, json};

/// The two transports run one after the other (each holds a browser and a model; 2 cores).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's python with the pinned `mcp` package (scripts/mcp-venv.sh, idempotent).
fn python() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("scripts/mcp-venv.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/mcp-venv.sh (needs bash and python3 with venv and pip)");
    assert!(
        out.status.success(),
        "scripts/mcp-venv.sh failed ({}): it installs the MCP Python SDK the test drives the server with",
        out.status
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The demo site on loopback, served for as long as the runtime lives.
fn site() -> (tokio::runtime::Runtime, kamera_browser::Server) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let content = kamera_browser::Content::Memory(kamera_site::generate(7));
    let server = rt
        .block_on(kamera_browser::Server::start(content))
        .expect("serve the demo site");
    (rt, server)
}

/// The calls the client makes, in order (see the module docs).
fn calls(origin: &str, tracking: &str) -> Value {
    let statuses: Vec<&str> = kamera_site::STATUSES.to_vec();
    json!([
        {"tool": "navigate", "arguments": {"url": format!("{origin}/")}},
        {"tool": "observe", "arguments": {"mode": "text"}},
        {"tool": "act", "arguments": {"action": "click", "target": "text:Orders"}},
        {"tool": "act", "arguments": {"action": "click", "target": "text:View A-1042"}},
        {"tool": "observe", "arguments": {"mode": "both"}},
        {"tool": "act", "arguments": {"action": "click", "target": "text:Track this shipment"}},
        {"tool": "act", "arguments": {"action": "type", "target": "#tracking", "text": tracking}},
        {"tool": "act", "arguments": {"action": "click", "target": "#go"}},
        {"tool": "observe", "arguments": {}},
        {"tool": "extract", "arguments": {
            "instruction": "Read the shipment's tracking number and its status off the page.",
            "schema": {"type": "object", "properties": {
                "tracking": {"type": "string", "minLength": 1, "maxLength": 24},
                "status": {"enum": statuses}
            }, "required": ["tracking", "status"]},
            "max_tokens": 48
        }},
        {"tool": "navigate", "arguments": {"url": "http://partner.invalid/"}},
        {"tool": "act", "arguments": {"action": "click", "target": "#no-such-element"}},
        {"tool": "act", "arguments": {"action": "fly"}},
        {"tool": "extract", "arguments": {
            "instruction": "x",
            "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^A"}}}
        }},
        {"tool": "observe", "arguments": {"mode": "video"}},
    ])
}

/// Runs the client script over `server` (`--http URL` or `-- COMMAND...`): its JSON answer.
fn drive(calls: &Value, server: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("calls.json");
    std::fs::write(&file, calls.to_string()).unwrap();
    let out = Command::new(python())
        .arg(repo().join("scripts/mcp_client_check.py"))
        .arg(&file)
        .args(server)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/mcp_client_check.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the MCP client failed ({}): {stdout}", out.status);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("the client's answer is not JSON ({e}): {stdout}"))
}

fn check(answer: &Value, tracking: &str, status: &str) {
    let names: Vec<&str> = answer["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        names,
        ["act", "extract", "navigate", "observe", "replay", "run_scenario"]
    );
    let calls = answer["calls"].as_array().unwrap();
    let text = |i: usize| calls[i]["text"].as_str().unwrap_or_default();
    let ok = |i: usize| assert_eq!(calls[i]["is_error"], false, "call {i}: {}", calls[i]);
    let err = |i: usize, says: &str| {
        assert_eq!(
            calls[i]["is_error"], true,
            "call {i} should be a tool error: {}",
            calls[i]
        );
        assert!(text(i).contains(says), "call {i} should say {says:?}: {}", text(i));
    };
    for i in 0..10 {
        ok(i);
    }
    // The page as the agent reads it: title, path, text, interactive elements as [id] tag "text".
    assert!(
        text(1).contains("Kestrel Supply") && text(1).contains("\"Orders\""),
        "{}",
        text(1)
    );
    assert!(text(1).contains("[1] "), "elements carry their ids: {}", text(1));
    assert!(calls[1]["images"].as_array().unwrap().is_empty());
    // Text and a PNG screenshot of the order page.
    assert!(
        text(4).contains("Order A-1042") && text(4).contains(tracking),
        "{}",
        text(4)
    );
    let shot = &calls[4]["images"][0];
    assert_eq!(
        (shot["mime_type"].as_str(), shot["png"].as_bool()),
        (Some("image/png"), Some(true)),
        "{shot}"
    );
    assert!(shot["bytes"].as_u64().unwrap() > 1000, "{shot}");
    // Typed and clicked through to the shipment page.
    assert!(text(7).contains("click"), "{}", text(7));
    assert!(
        text(8).contains(&format!("Shipment {tracking}")) && text(8).contains(&format!("Status: {status}")),
        "{}",
        text(8)
    );
    // JSON valid against the schema by construction; what the 135M model reads into it is reported.
    let v: Value = serde_json::from_str(text(9)).unwrap_or_else(|e| panic!("extract: {e}: {}", text(9)));
    assert_eq!(v, calls[9]["structured"], "the structured content is the JSON");
    let got = v["tracking"].as_str().unwrap();
    assert!(!got.is_empty() && got.chars().count() <= 24, "{v}");
    assert!(kamera_site::STATUSES.contains(&v["status"].as_str().unwrap()), "{v}");
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    eprintln!("extract: {v} (the page: {tracking}, {status})");
    err(10, "refused");
    err(11, "no element matches \"#no-such-element\"");
    err(12, "unknown action \"fly\"");
    err(13, "unsupported JSON Schema keyword \"pattern\"");
    err(14, "unknown observe mode \"video\"");
}

fn order_1042() -> (String, String) {
    let d = kamera_site::data(7);
    let o = d
        .orders
        .iter()
        .find(|o| o.id == "A-1042")
        .expect("order A-1042 on seed 7");
    (o.tracking.clone(), o.status.clone())
}

#[test]
fn mcp_over_stdio() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_rt, server) = site();
    let (tracking, status) = order_1042();
    let store = tempfile::tempdir().unwrap();
    let origin = server.origin();
    let answer = drive(
        &calls(&origin, &tracking),
        &[
            "--",
            env!("CARGO_BIN_EXE_kamera"),
            "mcp",
            "--allow",
            &origin,
            "--store",
            store.path().to_str().unwrap(),
        ],
    );
    check(&answer, &tracking, &status);
}

/// Stops the server when the test ends, passed or not: SIGTERM, as an MCP host does, then
/// SIGKILL if it has not exited within a minute.
struct Child(std::process::Child);

impl Child {
    /// SIGTERM, then the exit status within `limit` (`None`: still running).
    fn terminate(&mut self, limit: std::time::Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let end = std::time::Instant::now() + limit;
        while std::time::Instant::now() < end {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        None
    }

    /// The pids of this process's Chromium children (its browser), from /proc.
    fn browsers(&self) -> Vec<i32> {
        let me = self.0.id().to_string();
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
                let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
                stat.contains("(chrom") && after.split_whitespace().nth(1) == Some(me.as_str())
            })
            .collect()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // Already reaped (std keeps the status): its pid may be another process's by now.
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return;
        }
        if self.terminate(std::time::Duration::from_secs(60)).is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn mcp_over_streamable_http() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_rt, server) = site();
    let (tracking, status) = order_1042();
    let store = tempfile::tempdir().unwrap();
    let origin = server.origin();
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_kamera"))
            .args(["mcp", "--http", "127.0.0.1:0", "--allow", &origin, "--store"])
            .arg(store.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kamera mcp --http"),
    );
    let mut lines = BufReader::new(child.0.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("kamera mcp --http exited before saying where it serves")
            .unwrap();
        eprintln!("kamera mcp: {line}");
        if let Some(url) = line.strip_prefix("kamera mcp: serving streamable HTTP at ") {
            break url.to_string();
        }
    };
    // The rest of the server's log goes on to the test's stderr.
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| eprintln!("kamera mcp: {l}")));
    let answer = drive(&calls(&origin, &tracking), &["--http", &url]);
    check(&answer, &tracking, &status);
    // A second client meets the same browser: it is still on the shipment page.
    let again = drive(
        &json!([{"tool": "observe", "arguments": {"mode": "text"}}]),
        &["--http", &url],
    );
    let page = again["calls"][0]["text"].as_str().unwrap_or_default();
    assert!(page.contains(&format!("Shipment {tracking}")), "{page}");
    // The CLI's jobs: a scenario run (its own site and browser) and the replay of a recorded trace.
    let scenario = repo().join("scenarios/order-status.toml");
    let trace = tempfile::tempdir().unwrap();
    let rec = common::kamera(
        &[],
        &[
            "record",
            scenario.to_str().unwrap(),
            "--out",
            trace.path().to_str().unwrap(),
            "--no-store",
        ],
    );
    assert!(rec.status.success(), "{}", common::text(&rec));
    let jobs = drive(
        &json!([
            {"tool": "run_scenario", "arguments": {"path": scenario}},
            {"tool": "replay", "arguments": {"trace": trace.path()}},
            {"tool": "replay", "arguments": {"trace": "/no/such/trace"}},
        ]),
        &["--http", &url],
    );
    let calls = jobs["calls"].as_array().unwrap();
    let text = |i: usize| calls[i]["text"].as_str().unwrap_or_default();
    assert_eq!(calls[0]["is_error"], false, "{}", calls[0]);
    assert!(
        text(0).contains("scenario  order-status") && text(0).contains("result    PASS"),
        "{}",
        text(0)
    );
    assert_eq!(calls[1]["is_error"], false, "{}", calls[1]);
    assert!(text(1).contains("(identical)"), "{}", text(1));
    assert_eq!(calls[2]["is_error"], true, "{}", calls[2]);
    assert!(text(2).contains("no trace at /no/such/trace"), "{}", text(2));
    // SIGTERM (what an MCP host sends) stops the server the graceful way: it exits 0 and its
    // browser goes with it (it used to die at once and leave Chromium running).
    let browsers = child.browsers();
    assert!(!browsers.is_empty(), "the server's browser is a child of it");
    let status = child.terminate(std::time::Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "after SIGTERM: {status:?}");
    let left: Vec<i32> = browsers
        .into_iter()
        .filter(|pid| {
            // Gone, or a zombie waiting for init to reap it.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            state.is_some_and(|s| s != "Z")
        })
        .collect();
    assert!(left.is_empty(), "Chromium left running after SIGTERM: {left:?}");
}
