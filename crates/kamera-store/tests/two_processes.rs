//! Two processes on one sled store: the second open is a clear error naming the store and the
//! lock, and the first process's records are intact afterwards. The holder is this test binary
//! re-invoked.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use kamera_store::{ChunkStore, Error, SledStore, StoreConfig};

const CHILD_ENV: &str = "KAMERA_STORE_HOLDER_CHILD";
const RECORDS: u64 = 20;

/// The child: writes and flushes the records, says so, then holds the store open until killed.
#[test]
#[ignore = "a child process, run by the two-process test with --ignored; alone it does nothing"]
fn holder_child() -> Result<()> {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return Ok(());
    };
    let s = SledStore::open(StoreConfig::at(std::path::PathBuf::from(dir)))?;
    for i in 0..RECORDS {
        let (k, r) = common::nth(i);
        s.put(&k, r)?;
    }
    s.flush()?;
    println!("ready");
    std::thread::sleep(std::time::Duration::from_secs(120));
    Ok(())
}

#[test]
fn a_second_process_gets_a_clear_error_and_nothing_is_corrupted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--exact", "holder_child", "--ignored", "--nocapture"])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().context("stdout")?;
    let ready = BufReader::new(out)
        .lines()
        .any(|l| l.is_ok_and(|l| l.contains("ready")));
    assert!(ready, "the holder did not start");
    let second = SledStore::open(StoreConfig::at(dir.path()));
    let _ = child.kill();
    let _ = child.wait();
    match second {
        Err(e @ Error::Db { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&dir.path().display().to_string()) && text.contains("lock"),
                "{text}"
            );
        }
        Err(e) => panic!("expected Error::Db naming the lock, got {e}"),
        Ok(_) => panic!("a second process opened a store another process holds"),
    }
    let s = SledStore::open(StoreConfig::at(dir.path()))?;
    for i in 0..RECORDS {
        let (k, r) = common::nth(i);
        let back = s.lookup(&k)?.context("a record the holder flushed is missing")?;
        assert_eq!(back.n_tokens(), r.n_tokens(), "record {i}");
    }
    assert_eq!(s.stats().corrupt, 0);
    Ok(())
}
