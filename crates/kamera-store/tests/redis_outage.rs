//! RedisStore when things go wrong, against real `redis-server`s started by each test: SIGKILL
//! during writes with `appendfsync always`, `Layered` through an outage, eviction under
//! `maxmemory`, and a three-primary Redis Cluster.

mod common;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kamera_ops::DType;
use kamera_store::{ChunkId, ChunkStore, Error, EvictionPolicy, Key, Layered, Record, SledStore, StoreConfig, Tiered};
use rand::{Rng, SeedableRng, rngs::StdRng};
use redis::Commands;
use redis_server::{RedisCluster, RedisServer};

use redis_server::store;

const TRIALS: u64 = 8;

/// A writer thread puts records until the server is SIGKILLed at a random moment; after each
/// restart (AOF replay) every acknowledged record is intact and every record listed decodes to
/// exactly what was written: no half-written record is ever visible.
#[test]
fn sigkilled_server_with_aof_keeps_every_acknowledged_record_and_no_partial_one() -> Result<()> {
    let mut srv = RedisServer::start(&["--appendonly", "yes", "--appendfsync", "always"])?;
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let (mut acked, mut next) = (Vec::new(), 0u64);
    let mut index: HashMap<Key, u64> = HashMap::new();
    let t0 = Instant::now();
    for trial in 0..TRIALS {
        let s = Arc::new(store(&srv.url(), "crash", 8192));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut done = Vec::new();
                for i in next.. {
                    let (k, r) = common::nth(i);
                    if stop.load(Ordering::Relaxed) || s.put(&k, r).is_err() {
                        return (done, i);
                    }
                    done.push(i);
                }
                unreachable!()
            })
        };
        std::thread::sleep(Duration::from_millis(rng.random_range(30..300)));
        srv.kill();
        stop.store(true, Ordering::Relaxed);
        let (done, in_flight) = writer.join().expect("writer");
        acked.extend(done);
        // The record in flight may or may not have landed; its index is never reused.
        next = in_flight + 1;
        srv.restart()?;
        let s = store(&srv.url(), "crash", 8192);
        for &i in &acked {
            let (k, r) = common::nth(i);
            let got = s
                .get(&k)
                .with_context(|| format!("trial {trial}: acknowledged record {i}"))?;
            ensure!(
                got.as_deref() == Some(&r),
                "trial {trial}: acknowledged record {i} lost or changed"
            );
        }
        for i in index.len() as u64..next {
            index.insert(common::nth(i).0, i);
        }
        for k in s.keys(None)? {
            let i = *index.get(&k).context("unknown key")?;
            let got = s.get(&k).with_context(|| format!("trial {trial}: listed record {i}"))?;
            ensure!(
                got.as_deref() == Some(&common::nth(i).1),
                "trial {trial}: record {i} differs"
            );
        }
    }
    eprintln!(
        "{TRIALS} SIGKILL trials, {} acknowledged records, all intact ({:?})",
        acked.len(),
        t0.elapsed()
    );
    ensure!(
        acked.len() as u64 > TRIALS,
        "too few acknowledged writes to mean anything"
    );
    Ok(())
}

/// memory → sled → Redis. While Redis is down the local tiers keep serving and taking writes,
/// with one outage reported; after a restart Redis is written and read again.
#[test]
fn layered_serves_locally_while_redis_is_down_and_uses_it_again_after() -> Result<()> {
    let mut srv = RedisServer::start(&[])?;
    let dir = tempfile::tempdir()?;
    let near = SledStore::open(StoreConfig::at(dir.path()))?;
    let l = Layered::new(near, store(&srv.url(), "lay", 4096)).retry_after(Duration::from_millis(300));
    let direct = store(&srv.url(), "lay", 4096);
    for i in 0..4 {
        let (k, r) = common::nth(i);
        l.put(&k, r.clone())?;
        assert_eq!(*direct.get(&k)?.context("written through")?, r);
    }
    // A record only in Redis: served, and copied to the near store.
    let (k4, r4) = common::nth(4);
    direct.put(&k4, r4.clone())?;
    assert!(!l.near().contains(&k4)?);
    assert_eq!(*l.get(&k4)?.context("far hit")?, r4);
    assert!(l.near().contains(&k4)?);
    assert_eq!(l.stats().remote_hits, 1);

    srv.kill();
    let (k5, r5) = common::nth(5);
    for _ in 0..20 {
        for i in 0..5 {
            let (k, r) = common::nth(i);
            assert_eq!(*l.get(&k)?.context("near hit while down")?, r);
        }
        assert!(l.get(&common::nth(100).0)?.is_none());
        l.put(&k5, r5.clone())?;
        assert!(l.contains(&k5)? && l.remove(&k5)? && !l.contains(&k5)?);
        l.put(&k5, r5.clone())?;
        assert_eq!(l.keys(None)?.len(), 6);
        l.flush()?;
    }
    assert!(l.is_degraded());
    assert_eq!(l.outages(), 1, "one warning for the whole outage");
    std::thread::sleep(Duration::from_millis(350)); // tried again, still down: no new warning
    assert!(l.get(&common::nth(101).0)?.is_none());
    assert_eq!((l.outages(), l.is_degraded()), (1, true));

    srv.restart()?; // no persistence: an empty server
    std::thread::sleep(Duration::from_millis(350));
    let (k6, r6) = common::nth(6);
    l.put(&k6, r6.clone())?;
    assert!(!l.is_degraded());
    assert_eq!(*direct.get(&k6)?.context("written through after the restart")?, r6);
    assert!(direct.get(&k5)?.is_none(), "writes during the outage stay local");
    let (k7, r7) = common::nth(7);
    direct.put(&k7, r7.clone())?;
    assert_eq!(*l.get(&k7)?.context("far hit after the restart")?, r7);
    assert_eq!(l.outages(), 1);

    // The full stack: a far-only record comes up through sled into memory.
    let (k8, r8) = common::nth(8);
    direct.put(&k8, r8.clone())?;
    let t = Tiered::new(l, 1 << 20, EvictionPolicy::default());
    assert_eq!(*t.get(&k8)?.context("memory ← sled ← Redis")?, r8);
    assert!(t.in_memory(&k8) && t.inner().near().contains(&k8)?);
    Ok(())
}

/// allkeys-lru drops manifests and pieces independently: every record is then served whole or
/// is a miss (a counted `Incomplete` when a piece went first), never served in part.
#[test]
fn evicted_pieces_are_a_counted_miss_never_a_partial_record() -> Result<()> {
    let srv = RedisServer::start(&["--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"])?;
    let s = store(&srv.url(), "lru", 4096);
    let m = common::model();
    let rec = |i: u64| Record::kv(m, i, common::chunk(common::layouts()[0], 400, i, DType::Bf16));
    let key = |i: u64| Key::canonical(m, ChunkId::of(&i.to_le_bytes(), "lru", m));
    let n = 100; // ~77 KB each, 7.7 MB of records (more in memory) through an 8 MB server
    for i in 0..n {
        s.put(&key(i), rec(i))?;
    }
    // Redis' LRU clock ticks once a second: records written a tick later are the freshest and
    // survive whole (the flood above was written within one tick, so its pieces go at random).
    std::thread::sleep(Duration::from_millis(1100));
    for i in n..n + 4 {
        s.put(&key(i), rec(i))?;
    }
    for i in n..n + 4 {
        assert_eq!(*s.get(&key(i))?.context("a fresh record was evicted")?, rec(i));
    }
    let (mut served, mut gone, mut incomplete) = (0u64, 0u64, 0u64);
    for i in 0..n {
        match s.get(&key(i)) {
            Ok(Some(r)) => {
                assert_eq!(*r, rec(i), "record {i} served damaged");
                served += 1;
            }
            Ok(None) => gone += 1,
            Err(e) => {
                assert!(matches!(e, Error::Incomplete { .. }), "record {i}: {e}");
                incomplete += 1;
            }
        }
    }
    let info: String = redis::cmd("INFO").arg("stats").query(&mut srv.raw())?;
    let evicted: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("evicted_keys:"))
        .context("evicted_keys")?
        .trim()
        .parse()?;
    eprintln!(
        "eviction: of the flood {served} served whole, {gone} gone, {incomplete} incomplete; {evicted} keys evicted"
    );
    ensure!(
        evicted > 0 && gone + incomplete > 0,
        "nothing was evicted: the test proves nothing"
    );
    assert_eq!(s.stats().incomplete, incomplete);
    Ok(())
}

/// Three primaries: records spread over the nodes, each piece on its manifest's node (the hash
/// tag), keys listed from every node, and any node is a way in.
#[test]
fn works_against_a_redis_cluster_with_pieces_beside_their_manifest() -> Result<()> {
    let cluster = RedisCluster::start()?;
    let s = store(&cluster.nodes[0].url(), "fleet", 1024);
    let n = 24;
    for i in 0..n {
        let (k, r) = common::nth(i);
        s.put(&k, r)?;
    }
    assert_eq!(s.is_cluster(), Some(true));
    let other = store(&cluster.nodes[2].url(), "fleet", 1024);
    let mut want = Vec::new();
    for i in 0..n {
        let (k, r) = common::nth(i);
        assert_eq!(*other.get(&k)?.context("cluster record")?, r, "record {i}");
        want.push(k);
    }
    want.sort();
    assert_eq!(s.keys(None)?, want);
    let (mut nodes_used, mut pieces) = (0, 0);
    for node in &cluster.nodes {
        let mut raw = node.raw();
        let names: Vec<String> = raw.keys("fleet:*")?;
        nodes_used += usize::from(!names.is_empty());
        for p in names.iter().filter(|n| !n.ends_with('}')) {
            let manifest = &p[..=p.rfind('}').context("hash tag")?];
            let here: bool = raw
                .exists(manifest)
                .with_context(|| format!("{manifest} not on {p}'s node"))?;
            ensure!(here, "piece {p} without its manifest on node {}", node.port);
            pieces += 1;
        }
    }
    ensure!(
        nodes_used >= 2 && pieces > 0,
        "{nodes_used} nodes used, {pieces} pieces"
    );
    for i in 0..n / 2 {
        assert!(s.remove(&common::nth(i).0)?);
        assert!(other.get(&common::nth(i).0)?.is_none());
    }
    assert_eq!(other.keys(None)?.len() as u64, n - n / 2);
    // Maintenance sees every primary: usage, verify, memory; gc removes a damaged record on
    // its own node (the delete script runs where the hash tag sends it).
    assert_eq!(other.usage()?.records(), n - n / 2);
    assert_eq!(other.memory()?.len(), 3);
    let victim = common::nth(n - 1).0;
    let name = s.manifest_key(&victim);
    let node = cluster
        .nodes
        .iter()
        .find(|nd| nd.raw().exists::<_, bool>(&name).unwrap_or(false))
        .context("the victim's node")?;
    let _: i64 = redis::cmd("SETRANGE")
        .arg(&name)
        .arg(60)
        .arg(&[0xEEu8][..])
        .query(&mut node.raw())?;
    let v = other.verify()?;
    assert_eq!((v.ok, v.bad.len()), (n - n / 2 - 1, 1), "{:?}", v.bad);
    let gc = other.gc(std::time::Duration::ZERO)?;
    assert_eq!(gc.removed_bad, 1, "{gc:?}");
    assert!(!s.contains(&victim)?);
    assert_eq!(other.verify()?.bad.len(), 0);
    Ok(())
}
