//! Store faults, each in a child process (this test binary re-invoked) so that whatever the fault
//! does to it cannot take the test down: a disk that fills up (a 1 MiB tmpfs where this runs as
//! root and may mount one, grown to 4 MiB after; always a file-size limit, RLIMIT_FSIZE), where
//! writes must be refused with a clear error and every record flushed before stays intact (on the
//! full tmpfs the store does not open: sled writes when it opens); and SIGKILL in the middle of
//! `gc` (what `kamera store gc` runs), after which the store opens, holds only records exactly as
//! written (or the planted damaged ones not reached yet) and a full gc leaves it clean.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kamera_store::{ChunkStore, SledStore, StoreConfig};
use rand::{Rng, SeedableRng, rngs::StdRng};

const CHILD_ENV: &str = "KAMERA_STORE_FAULT_CHILD";

fn open(dir: &Path) -> Result<SledStore> {
    Ok(SledStore::open(StoreConfig {
        dtype: None,
        cache_bytes: 1 << 20,
        ..StoreConfig::at(dir)
    })?)
}

/// The child: `fill|DIR` writes records (put, flush, ack) until a write is refused;
/// `gc|DIR|BUDGET` runs gc once.
#[test]
#[ignore = "a child process, run by the fault tests with --ignored; alone it does nothing"]
fn fault_child() -> Result<()> {
    let Some(spec) = std::env::var_os(CHILD_ENV) else {
        return Ok(());
    };
    let spec = spec.to_string_lossy().to_string();
    let parts: Vec<&str> = spec.split('|').collect();
    match parts.as_slice() {
        ["fill", dir] => {
            let s = open(Path::new(dir))?;
            println!("ready");
            for i in 0..100_000u64 {
                let (k, r) = common::nth(i);
                if let Err(e) = s.put(&k, r).and_then(|()| s.flush()) {
                    println!("refused {i}: {e}");
                    return Ok(());
                }
                println!("ack {i}");
            }
            println!("never refused");
        }
        ["gc", dir, budget] => {
            let s = open(Path::new(dir))?;
            println!("gc start");
            let rep = s.gc(Some(budget.parse()?))?;
            println!("gc done {rep:?}");
        }
        _ => anyhow::bail!("bad child spec {spec:?}"),
    }
    Ok(())
}

/// Runs the child with `spec` (under `limit_fsize` bytes of RLIMIT_FSIZE when given) and returns
/// its stdout lines and whether it exited normally.
fn child(spec: &str, limit_fsize: Option<u64>) -> Result<(Vec<String>, bool)> {
    let exe = std::env::current_exe()?;
    let mut cmd = match limit_fsize {
        // SIGXFSZ ignored (an ignored signal stays ignored across exec): a write past the limit
        // fails with EFBIG instead of killing the process. bash's ulimit -f counts 1024 bytes.
        Some(bytes) => {
            let mut c = Command::new("bash");
            c.arg("-c")
                .arg(format!("trap '' XFSZ; ulimit -f {}; exec \"$0\" \"$@\"", bytes / 1024))
                .arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let out = cmd
        .args(["--exact", "fault_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, spec)
        .stderr(Stdio::piped())
        .output()?;
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    if !out.status.success() {
        eprintln!("child stderr: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((lines, out.status.success()))
}

/// Fills the store at `dir` in a child until a write is refused; checks the refusal and that
/// every acknowledged record reads back intact. Returns (acknowledged, the refusal).
fn fill_until_refused(dir: &Path, limit_fsize: Option<u64>) -> Result<(u64, String)> {
    let (lines, ok) = child(&format!("fill|{}", dir.display()), limit_fsize)?;
    anyhow::ensure!(ok, "the writer did not exit cleanly (a panic or a signal): {lines:?}");
    let acked = lines.iter().filter(|l| l.starts_with("ack ")).count() as u64;
    let refused = lines
        .iter()
        .find_map(|l| {
            l.split_once(": ")
                .filter(|(h, _)| h.starts_with("refused "))
                .map(|(_, e)| e.to_string())
        })
        .with_context(|| format!("no write was refused: {:?}", lines.last()))?;
    anyhow::ensure!(acked > 0, "nothing was written before the disk filled up");
    Ok((acked, refused))
}

fn check_intact(dir: &Path, acked: u64) -> Result<()> {
    let s = open(dir)?;
    for i in 0..acked {
        let (k, r) = common::nth(i);
        let got = s.get(&k).with_context(|| format!("acknowledged record {i}"))?;
        anyhow::ensure!(got.as_deref() == Some(&r), "acknowledged record {i} lost or changed");
    }
    let v = s.verify()?;
    anyhow::ensure!(v.bad.is_empty(), "damaged records: {:?}", v.bad);
    Ok(())
}

#[test]
fn a_file_size_limit_refuses_writes_and_keeps_earlier_records() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (acked, refused) = fill_until_refused(dir.path(), Some(2 << 20))?;
    eprintln!("RLIMIT_FSIZE 2 MiB: {acked} records acknowledged, then: {refused}");
    assert!(refused.contains(&dir.path().display().to_string()), "{refused}");
    assert!(refused.contains("File too large"), "{refused}");
    check_intact(dir.path(), acked)
}

/// Needs root (mount); elsewhere it reports itself skipped (kamera_ops::testkit::skip) (the RLIMIT_FSIZE test runs everywhere).
#[test]
fn a_full_tmpfs_refuses_writes_and_keeps_earlier_records() -> Result<()> {
    let mnt = tempfile::tempdir()?;
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(mnt.path())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        kamera_ops::testkit::skip(
            "kamera-store faults::a_full_tmpfs_refuses_writes_and_keeps_earlier_records",
            "cannot mount a tmpfs here (not root)",
        );
        return Ok(());
    }
    let dir = mnt.path().join("store");
    let r = (|| -> Result<()> {
        let (acked, refused) = fill_until_refused(&dir, None)?;
        eprintln!("tmpfs 1 MiB: {acked} records acknowledged, then: {refused}");
        assert!(refused.contains(&dir.display().to_string()), "{refused}");
        assert!(refused.contains("No space left on device"), "{refused}");
        // sled writes when it opens: on the full disk that is the same clear error.
        if let Err(e) = open(&dir) {
            eprintln!("reopened on the full tmpfs: {e}");
            let e = e.to_string();
            assert!(
                e.contains(&dir.display().to_string()) && e.contains("No space left"),
                "{e}"
            );
        }
        // Room again (the user freed space): every acknowledged record is there, intact.
        let grown = Command::new("mount")
            .args(["-o", "remount,size=4m"])
            .arg(mnt.path())
            .status()?;
        anyhow::ensure!(grown.success(), "remount");
        check_intact(&dir, acked)
    })();
    let _ = Command::new("umount").arg(mnt.path()).status();
    r
}

#[test]
fn sigkill_during_gc_leaves_a_store_that_opens_and_verifies() -> Result<()> {
    const RECORDS: u64 = 600;
    const BAD: u64 = 40;
    const TRIALS: usize = 8;
    let mut rng = StdRng::seed_from_u64(0x6c);
    let exe = std::env::current_exe()?;
    let mut killed_mid_gc = 0;
    for trial in 0..TRIALS {
        let dir = tempfile::tempdir()?;
        let planted: Vec<kamera_store::Key> = (0..BAD).map(|i| common::nth(1_000_000 + i).0).collect();
        let budget = {
            let s = open(dir.path())?;
            for i in 0..RECORDS {
                let (k, r) = common::nth(i);
                s.put(&k, r)?;
                if i % 15 == 0 {
                    let key = &planted[(i / 15) as usize % planted.len()];
                    s.put_raw(key, b"KMRA this is not a record", 1)?;
                }
            }
            s.flush()?;
            s.total_bytes() / 4
        };
        let mut c = Command::new(&exe)
            .args(["--exact", "fault_child", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("gc|{}|{budget}", dir.path().display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut out = BufReader::new(c.stdout.take().context("stdout")?);
        let mut line = String::new();
        while !line.contains("gc start") {
            line.clear();
            anyhow::ensure!(
                out.read_line(&mut line)? > 0,
                "trial {trial}: the child did not start gc"
            );
        }
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(rng.random_range(0..150)));
        c.kill()?; // SIGKILL
        c.wait()?;
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut rest);
        let finished = rest.contains("gc done");
        if !finished {
            killed_mid_gc += 1;
        }
        let s = open(dir.path()).with_context(|| format!("trial {trial}: reopen after SIGKILL"))?;
        let v = s.verify()?;
        let planted_hex: Vec<String> = planted.iter().map(|k| k.to_string()).collect();
        for (key, why) in &v.bad {
            anyhow::ensure!(
                planted_hex.contains(key),
                "trial {trial}: a record damaged by the kill: {key} ({why})"
            );
        }
        let left_bad = v.bad.len();
        let mut kept = 0;
        for i in 0..RECORDS {
            let (k, r) = common::nth(i);
            if let Some(got) = s.get(&k)? {
                anyhow::ensure!(*got == r, "trial {trial}: record {i} changed");
                kept += 1;
            }
        }
        let rep = s.gc(Some(budget))?;
        let v = s.verify()?;
        anyhow::ensure!(
            v.bad.is_empty(),
            "trial {trial}: not clean after a full gc: {:?}",
            v.bad
        );
        anyhow::ensure!(s.total_bytes() <= budget, "trial {trial}: over budget after gc");
        eprintln!(
            "trial {trial}: SIGKILL {:?} after gc started ({}); {} planted damaged left, {kept} of {RECORDS} kept; \
             then a full gc: {rep:?}",
            t0.elapsed(),
            if finished { "it had finished" } else { "mid-gc" },
            left_bad
        );
    }
    eprintln!("{killed_mid_gc} of {TRIALS} kills landed before gc finished");
    anyhow::ensure!(killed_mid_gc > 0, "no kill landed during gc: nothing was tested");
    Ok(())
}
