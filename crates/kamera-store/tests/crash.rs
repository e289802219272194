//! SIGKILL durability: a child process (this test binary re-invoked) writes and flushes records
//! in a loop and acknowledges each on stdout; the parent kills it at a random moment. After
//! reopening, every acknowledged record is intact, and nothing half-written is served.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};
use kamera_store::{ChunkStore, SledStore, StoreConfig};
use rand::{Rng, SeedableRng, rngs::StdRng};

const CHILD_ENV: &str = "KAMERA_STORE_CRASH_CHILD";
const TRIALS: u64 = 25;

/// The child: writes record `start + i` (put, flush, ack) until killed.
#[test]
#[ignore = "a child process, run by the crash test with --ignored; alone it does nothing"]
fn crash_child() -> Result<()> {
    let Some(spec) = std::env::var_os(CHILD_ENV) else {
        return Ok(());
    };
    let spec = spec.to_string_lossy().to_string();
    let (dir, start) = spec.rsplit_once('|').context("child spec")?;
    let start: u64 = start.parse()?;
    let s = SledStore::open(StoreConfig {
        dtype: None,
        ..StoreConfig::at(dir)
    })?;
    println!("ready");
    for i in start.. {
        let (k, r) = common::nth(i);
        s.put(&k, r)?;
        s.flush()?;
        println!("ack {i}");
    }
    Ok(())
}

#[test]
fn acknowledged_records_survive_sigkill() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut acked: Vec<u64> = Vec::new();
    let mut next = 0u64;
    let mut index: std::collections::HashMap<kamera_store::Key, u64> = Default::default();
    let t0 = std::time::Instant::now();
    for trial in 0..TRIALS {
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{}|{next}", dir.path().display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let out = child.stdout.take().context("child stdout")?;
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait until the child has the database open, then let it write for a random while.
        // (the test harness prints its own lines first).
        loop {
            let line = rx.recv_timeout(Duration::from_secs(60));
            anyhow::ensure!(line.is_ok(), "trial {trial}: child did not start");
            if line.as_deref().is_ok_and(|l| l.ends_with("ready")) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(5..120)));
        child.kill()?; // SIGKILL
        child.wait()?;
        reader.join().ok();
        let mut last = None;
        for line in rx.try_iter() {
            if let Some(i) = line.strip_prefix("ack ") {
                let i: u64 = i.parse()?;
                acked.push(i);
                last = Some(i);
            }
        }
        // The record after the last ack may or may not have landed; never reuse its index.
        next = last.map_or(next, |l| l + 1) + 1;

        let s = SledStore::open(StoreConfig::at(dir.path()))?;
        for &i in &acked {
            let (k, r) = common::nth(i);
            let got = s
                .get(&k)
                .with_context(|| format!("trial {trial}: acknowledged record {i}"))?;
            anyhow::ensure!(
                got.as_deref() == Some(&r),
                "trial {trial}: acknowledged record {i} lost or changed"
            );
        }
        for i in index.len() as u64..=next {
            index.insert(common::nth(i).0, i);
        }
        // Whatever else is there decodes and is exactly what was written.
        let v = s.verify()?;
        anyhow::ensure!(
            v.bad.is_empty(),
            "trial {trial}: damaged records after a crash: {:?}",
            v.bad
        );
        for k in s.keys(None)? {
            let got = s.get(&k)?.context("listed key")?;
            let i = *index.get(&k).context("unknown key")?;
            anyhow::ensure!(*got == common::nth(i).1, "trial {trial}: record {i} differs");
        }
    }
    eprintln!(
        "{TRIALS} SIGKILL trials, {} acknowledged records, all intact ({:?})",
        acked.len(),
        t0.elapsed()
    );
    anyhow::ensure!(
        acked.len() as u64 > TRIALS,
        "too few acknowledged writes to mean anything"
    );
    Ok(())
}
