//! `Layered::write_behind` against a real `redis-server` whose writes are held with
//! `CLIENT PAUSE … WRITE`: a write-behind put returns while Redis cannot take it and is on Redis
//! after `flush` (a write-through put waits), a full queue makes `put` wait (back-pressure), and
//! dropping the store writes what is queued: nothing is dropped.

mod common;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kamera_store::{ChunkStore, Layered, RedisStore, SledStore, StoreConfig};
use redis_server::{RedisServer, store};

/// Holds every write command of every client for `ms` (reads go on).
fn pause_writes(srv: &RedisServer, ms: u64) -> Result<()> {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query(&mut srv.raw())?;
    Ok(())
}

fn layered(srv: &RedisServer, dir: &std::path::Path) -> Result<Layered<SledStore, RedisStore>> {
    let near = SledStore::open(StoreConfig {
        dtype: None,
        ..StoreConfig::at(dir)
    })?;
    // The far store's timeout (2 s) outlasts the pauses below: a held write waits, not fails.
    Ok(Layered::new(near, store(&srv.url(), "wb", 1024)))
}

#[test]
fn a_write_behind_put_returns_at_once_and_is_on_redis_after_flush() -> Result<()> {
    let srv = RedisServer::start(&[])?;
    let dirs = (tempfile::tempdir()?, tempfile::tempdir()?);
    let reader = store(&srv.url(), "wb", 1 << 20); // another host

    // Write-through: the put waits for Redis.
    let through = layered(&srv, dirs.0.path())?;
    let (k, r) = common::nth(0);
    pause_writes(&srv, 600)?;
    let t = Instant::now();
    through.put(&k, r.clone())?;
    ensure!(
        t.elapsed() >= Duration::from_millis(450),
        "write-through put took {:?}",
        t.elapsed()
    );
    assert_eq!(*reader.get(&k)?.context("written through")?, r);

    let behind = layered(&srv, dirs.1.path())?.write_behind(8);
    pause_writes(&srv, 1000)?;
    let t = Instant::now();
    for i in 1..5 {
        let (k, r) = common::nth(i);
        behind.put(&k, r)?;
    }
    let put_time = t.elapsed();
    ensure!(
        put_time < Duration::from_millis(400),
        "write-behind puts took {put_time:?}"
    );
    assert!(behind.queued() > 0);
    for i in 1..5 {
        let (k, r) = common::nth(i);
        assert_eq!(*behind.get(&k)?.context("near copy")?, r);
        assert!(reader.get(&k)?.is_none(), "record {i} on Redis while writes are held");
    }
    behind.flush()?;
    ensure!(
        t.elapsed() >= Duration::from_millis(800),
        "flush returned before Redis took the writes"
    );
    assert_eq!((behind.queued(), behind.write_behind_errors()), (0, 0));
    for i in 1..5 {
        let (k, r) = common::nth(i);
        assert_eq!(*reader.get(&k)?.context("on Redis after flush")?, r, "record {i}");
    }
    Ok(())
}

#[test]
fn a_full_queue_makes_put_wait_and_drop_writes_what_is_queued() -> Result<()> {
    let srv = RedisServer::start(&[])?;
    let dir = tempfile::tempdir()?;
    let reader = store(&srv.url(), "wb", 1 << 20);
    let behind = layered(&srv, dir.path())?.write_behind(1);
    pause_writes(&srv, 1000)?;
    let t = Instant::now();
    let mut times = Vec::new();
    for i in 0..4 {
        let (k, r) = common::nth(i);
        behind.put(&k, r)?;
        times.push(t.elapsed());
    }
    // One put being written (held by Redis) and one queued: the next waits for room.
    ensure!(times[0] < Duration::from_millis(300), "first put {times:?}");
    ensure!(times[3] >= Duration::from_millis(800), "no back-pressure: {times:?}");
    let (k, r) = common::nth(4);
    behind.put(&k, r)?;
    drop(behind); // closes the queue and writes what it holds
    for i in 0..5 {
        let (k, r) = common::nth(i);
        assert_eq!(
            *reader.get(&k)?.context("written before drop returned")?,
            r,
            "record {i}"
        );
    }
    Ok(())
}
