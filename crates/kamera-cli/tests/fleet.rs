//! A fleet on a real Redis server (loopback): 20 episodes pushed to a queue, two `kamera worker`
//! processes on real Chromium and the embedded SmolLM2-135M, sharing the Redis chunk store; one
//! worker is SIGKILLed in the middle of an episode. Every episode ends in the results exactly
//! once, the killed worker's episode taken over by the other; none is lost.

mod common;

#[path = "../../kamera-store/tests/common/redis_server.rs"]
mod redis_server;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{kamera, text};

fn scenario(name: &str) -> String {
    format!("{}/../../scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"))
}

/// A worker in a process group of its own (killing the group takes its browsers too, as a
/// machine that dies would), its stdout lines sent to `lines` tagged with `tag`.
fn worker(url: &str, tag: &'static str, lines: mpsc::Sender<(&'static str, String)>) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kamera"))
        .args([
            "worker",
            "--queue",
            url,
            "--worker",
            tag,
            "--until-empty",
            "--claim-after-ms",
            "2000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start a worker");
    let out = c.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = lines.send((tag, l));
        }
    });
    c
}

#[test]
fn a_killed_worker_loses_no_episode_and_none_runs_twice_into_the_results() {
    let server = redis_server::RedisServer::start(&[]).expect("redis-server");
    let url = server.url();
    let paths: Vec<String> = (0..20)
        .map(|i| scenario(if i % 2 == 0 { "order-status" } else { "directory-pages" }))
        .collect();
    let mut args = vec!["queue", "--queue", &url, "push"];
    args.extend(paths.iter().map(String::as_str));
    let out = kamera(&[], &args);
    assert!(out.status.success(), "{}", text(&out));
    let pushed: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_eq!(pushed.len(), 20);

    let (tx, rx) = mpsc::channel();
    let mut a = worker(&url, "a", tx.clone());
    let mut b = worker(&url, "b", tx);
    // Kill worker a in the middle of its second episode.
    let mut starts_a = Vec::new();
    let mut ends: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut killed = None;
    while killed.is_none() {
        let (tag, l) = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("worker a never started a second episode");
        let id = l.split_whitespace().nth(1).unwrap_or_default().to_string();
        if l.starts_with("end ") {
            ends.entry(id.clone()).or_default().push(tag);
        }
        if tag == "a" && l.starts_with("start ") {
            starts_a.push(id.clone());
            if starts_a.len() == 2 {
                std::thread::sleep(Duration::from_millis(300));
                // SAFETY: kill(2) on the worker's own process group.
                let r = unsafe { libc::kill(-(a.id() as i32), libc::SIGKILL) };
                assert_eq!(r, 0, "kill the worker's process group");
                killed = Some(id);
            }
        }
    }
    let killed = killed.unwrap();
    let _ = a.wait();
    let status = loop {
        if let Some(s) = b.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "worker b did not drain the queue");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success(), "worker b: {status}");
    for (tag, l) in rx.try_iter() {
        if l.starts_with("end ") {
            let id = l.split_whitespace().nth(1).unwrap_or_default().to_string();
            ends.entry(id).or_default().push(tag);
        }
    }
    assert!(
        !ends.contains_key(&killed) || ends[&killed] == ["b"],
        "the killed episode {killed} ended only on b: {ends:?}"
    );
    // Every pushed episode ran to its end exactly once.
    assert_eq!(ends.keys().cloned().collect::<BTreeSet<_>>(), pushed, "{ends:?}");
    assert!(ends.values().all(|w| w.len() == 1), "{ends:?}");

    let out = kamera(&[], &["queue", "--queue", &url, "status", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &j["status"];
    assert_eq!(
        (s["pushed"].as_u64(), s["waiting"].as_u64(), s["running"].as_u64()),
        (Some(20), Some(0), Some(0)),
        "{s}"
    );
    assert_eq!((s["done"].as_u64(), s["failed"].as_u64()), (Some(20), Some(0)), "{j}");
    let results = j["results"].as_array().unwrap();
    let ids: BTreeSet<String> = results.iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, pushed);
    for r in results {
        let expected = if r["scenario"] == "order-status" {
            "Awaiting pickup"
        } else {
            "1"
        };
        assert_eq!(r["answer"], expected, "{r}");
        assert_eq!(r["success"], true, "{r}");
    }
    let taken = results.iter().find(|r| r["id"] == killed.as_str()).unwrap();
    assert_eq!(taken["worker"], "b", "{taken}");
    assert_eq!(taken["deliveries"], 2, "{taken}");
}
