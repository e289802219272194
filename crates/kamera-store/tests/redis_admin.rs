//! `RedisStore::usage | verify | gc | memory` (what `kamera store --store redis://…` runs)
//! against real `redis-server`s: counts match what was put, values damaged through a raw client
//! are listed by verify and removed by gc with their pieces, orphan pieces go only when still
//! orphaned after the grace period, and nothing of another prefix is ever touched.

mod common;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kamera_ops::DType;
use kamera_store::{ChunkId, ChunkStore, Key, Kind, ModelFp, Record, RedisStore, codec};
use redis::Commands;
use redis_server::{RedisServer, store};

/// Every name in the server, sorted (KEYS is fine in a test's own server).
fn names(raw: &mut redis::Connection) -> Vec<String> {
    let mut n: Vec<String> = raw.keys("*").unwrap();
    n.sort();
    n
}

/// Pieces of `key`'s record, by name.
fn pieces_of(raw: &mut redis::Connection, s: &RedisStore, key: &Key) -> Vec<String> {
    let mut n: Vec<String> = raw.keys(format!("{}:*", s.manifest_key(key))).unwrap();
    n.sort();
    n
}

/// Records 0..12 of `common::nth`, plus two canonical records of a second model.
fn fill(s: &RedisStore) -> Result<Vec<(Key, Record)>> {
    let mut all: Vec<(Key, Record)> = (0..12).map(common::nth).collect();
    let m2 = ModelFp::of("second-model");
    for i in 0..2u64 {
        let kv = common::chunk(common::layouts()[0], 30 + i as usize, 77 + i, DType::Bf16);
        all.push((
            Key::canonical(m2, ChunkId::of(&i.to_le_bytes(), "enc", m2)),
            Record::kv(m2, 5, kv),
        ));
    }
    for (k, r) in &all {
        s.put(k, r.clone())?;
    }
    Ok(all)
}

#[test]
fn usage_counts_what_was_put_by_model_and_kind() -> Result<()> {
    let srv = RedisServer::start(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"])?;
    let s = store(&srv.url(), "adm", 1024);
    let all = fill(&s)?;
    // Another prefix on the same server is not counted.
    let other = store(&srv.url(), "adm2", 1024);
    other.put(&all[0].0, all[0].1.clone())?;

    let mut want: BTreeMap<(ModelFp, Kind), (u64, u64)> = BTreeMap::new();
    for (k, r) in &all {
        let e = want.entry((k.model, k.kind)).or_default();
        e.0 += 1;
        e.1 += codec::encode(k, r, None)?.len() as u64;
    }
    let u = s.usage()?;
    let got: BTreeMap<(ModelFp, Kind), (u64, u64)> = u
        .rows
        .iter()
        .map(|r| ((r.model, r.kind), (r.records, r.bytes)))
        .collect();
    assert_eq!(got, want);
    assert_eq!((u.records(), u.unreadable), (14, 0));
    assert_eq!(other.usage()?.records(), 1);

    let mem = s.memory()?;
    assert_eq!(mem.len(), 1, "{mem:?}");
    assert_eq!((mem[0].max_bytes, mem[0].policy.as_str()), (64 << 20, "allkeys-lru"));
    ensure!(
        mem[0].used_bytes > u.bytes(),
        "{mem:?} holds {} record bytes",
        u.bytes()
    );
    assert!(mem[0].evicts(false));
    Ok(())
}

#[test]
fn verify_lists_damaged_records_and_gc_removes_them_with_orphan_pieces() -> Result<()> {
    let srv = RedisServer::start(&[])?;
    let mut raw = srv.raw();
    let s = store(&srv.url(), "adm", 1024);
    let all = fill(&s)?;
    let other = store(&srv.url(), "adm2", 1024);
    other.put(&all[2].0, all[2].1.clone())?;
    let _: () = raw.set("adm:not-a-record", b"someone else's value")?;
    let clean = s.verify()?;
    assert_eq!((clean.ok, clean.bad.len(), clean.orphan_pieces), (14, 0, 0));
    assert_eq!(clean.by_kind.iter().map(|r| r.1).sum::<u64>(), 14);

    let len = |k: &Key, r: &Record| codec::encode(k, r, None).map(|b| b.len());
    let inline = all
        .iter()
        .find(|(k, r)| len(k, r).is_ok_and(|n| n <= 1024))
        .context("inline")?;
    let split: Vec<&(Key, Record)> = all.iter().filter(|(k, r)| len(k, r).is_ok_and(|n| n > 2048)).collect();
    ensure!(split.len() >= 2, "{} records in 3+ pieces", split.len());
    // 1. A byte of an inline record's bytes flipped.
    let name = s.manifest_key(&inline.0);
    let _: i64 = redis::cmd("SETRANGE")
        .arg(&name)
        .arg(100)
        .arg(&[0xA5u8][..])
        .query(&mut raw)?;
    // 2. A byte of a piece flipped.
    let p = pieces_of(&mut raw, &s, &split[0].0);
    let _: i64 = redis::cmd("SETRANGE")
        .arg(&p[1])
        .arg(7)
        .arg(&[0x5Au8][..])
        .query(&mut raw)?;
    // 3. A piece gone (an eviction): incomplete.
    let gone = pieces_of(&mut raw, &s, &split[1].0);
    let _: () = raw.del(&gone[0])?;
    // 4. An orphan piece: a writer that died before publishing its manifest.
    let orphan = format!("{}:00112233445566ff:0", s.manifest_key(&split[1].0));
    let _: () = raw.set(&orphan, b"left over")?;

    let v = s.verify()?;
    let bad: Vec<&str> = v.bad.iter().map(|(k, _)| k.as_str()).collect();
    let mut want_bad = vec![inline.0.to_string(), split[0].0.to_string(), split[1].0.to_string()];
    want_bad.sort();
    let mut got_bad: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
    got_bad.sort();
    assert_eq!(got_bad, want_bad, "{:?}", v.bad);
    assert!(v.bad.iter().any(|(_, why)| why.contains("incomplete")), "{:?}", v.bad);
    assert_eq!((v.ok, v.orphan_pieces), (11, 1));

    let before = names(&mut raw);
    let gc = s.gc(Duration::ZERO)?;
    assert_eq!((gc.removed_bad, gc.orphan_pieces, gc.evicted), (3, 1, 0), "{gc:?}");
    let after = names(&mut raw);
    let removed: Vec<&String> = before.iter().filter(|n| !after.contains(n)).collect();
    // The three manifests, every piece they named, and the orphan: nothing else.
    let mut want_removed: Vec<String> = [inline, split[0], split[1]]
        .iter()
        .map(|(k, _)| s.manifest_key(k))
        .collect();
    want_removed.extend(p.iter().cloned());
    want_removed.extend(gone[1..].iter().cloned());
    want_removed.push(orphan);
    want_removed.sort();
    assert_eq!(removed, want_removed.iter().collect::<Vec<_>>());
    let freed: u64 = want_removed.len() as u64; // at least a byte each
    ensure!(gc.freed_bytes > freed, "{gc:?}");

    let v = s.verify()?;
    assert_eq!((v.ok, v.bad.len(), v.orphan_pieces), (11, 0, 0));
    assert_eq!(gc.remaining_bytes, s.usage()?.bytes());
    for (k, r) in &all {
        let damaged = [&inline.0, &split[0].0, &split[1].0].contains(&k);
        assert_eq!(s.get(k)?.map(|x| (*x).clone()), (!damaged).then(|| r.clone()), "{k}");
    }
    assert_eq!(*other.get(&all[2].0)?.context("other prefix kept")?, all[2].1);
    assert!(after.contains(&"adm:not-a-record".to_string()));
    Ok(())
}

#[test]
fn gc_keeps_pieces_that_a_manifest_publishes_within_the_grace_period() -> Result<()> {
    let srv = RedisServer::start(&[])?;
    let mut raw = srv.raw();
    let s = store(&srv.url(), "adm", 512);
    let (k, r) = common::nth(2);
    s.put(&k, r.clone())?;
    let name = s.manifest_key(&k);
    let manifest: Vec<u8> = raw.get(&name)?;
    // A put in flight: its pieces are written, its manifest not yet.
    let _: () = raw.del(&name)?;
    assert_eq!(s.verify()?.orphan_pieces, pieces_of(&mut raw, &s, &k).len() as u64);
    let publish = std::thread::spawn({
        let (mut raw, name, manifest) = (srv.raw(), name.clone(), manifest.clone());
        move || {
            std::thread::sleep(Duration::from_millis(300));
            let _: () = raw.set(&name, &manifest).unwrap();
        }
    });
    let gc = s.gc(Duration::from_millis(1500))?;
    publish.join().expect("publisher");
    assert_eq!((gc.removed_bad, gc.orphan_pieces), (0, 0), "{gc:?}");
    assert_eq!(*s.get(&k)?.context("published record")?, r);

    // Never published: the pieces go.
    let n = pieces_of(&mut raw, &s, &k).len() as u64;
    let _: () = raw.del(&name)?;
    let gc = s.gc(Duration::from_millis(50))?;
    assert_eq!(gc.orphan_pieces, n);
    assert!(names(&mut raw).is_empty());
    Ok(())
}
