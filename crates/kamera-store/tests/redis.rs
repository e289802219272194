//! RedisStore against real `redis-server`s started by each test (loopback, temp dir, killed on
//! drop): round trips with pieces and TTLs, a model-based test against a BTreeMap, namespaces,
//! damage, eviction, SIGKILL with AOF, `Layered` through an outage, and a Redis Cluster.

mod common;
#[path = "common/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kamera_ops::{Bases, DType};
use kamera_store::{ChunkId, ChunkStore, Error, Key, ModelFp, Record, RedisConfig, RedisStore, codec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::Commands;
use redis_server::RedisServer;

use redis_server::store;

/// Raw names of `key`'s pieces, in piece order.
fn pieces(raw: &mut redis::Connection, s: &RedisStore, key: &Key) -> Vec<String> {
    let mut names: Vec<String> = raw.keys(format!("{}:*", s.manifest_key(key))).unwrap();
    names.sort_by_key(|n| n.rsplit(':').next().and_then(|i| i.parse::<u64>().ok()));
    names
}

#[test]
fn round_trip_with_pieces_overwrites_and_ttl() -> Result<()> {
    let srv = RedisServer::start(&[])?;
    let mut raw = srv.raw();
    let s = store(&srv.url(), "rt", 1024);
    for i in 0..12 {
        let (k, r) = common::nth(i);
        assert!(!s.contains(&k)?);
        s.put(&k, r)?;
    }
    let mut multi = 0;
    let s2 = store(&srv.url(), "rt", 1 << 20); // another client, other piece size: same records
    for i in 0..12 {
        let (k, r) = common::nth(i);
        let len = codec::encode(&k, &r, None)?.len();
        assert_eq!(*s2.get(&k)?.context("present")?, r, "record {i}");
        assert!(s2.contains(&k)?);
        assert_eq!(
            pieces(&mut raw, &s, &k).len(),
            if len > 1024 { len.div_ceil(1024) } else { 0 }
        );
        multi += usize::from(len > 1024);
    }
    ensure!(multi >= 4, "only {multi} records were split in pieces");
    let mut want: Vec<Key> = (0..12).map(|i| common::nth(i).0).collect();
    want.sort();
    assert_eq!(s.keys(Some(common::model()))?, want);
    assert_eq!(s.keys(None)?, want);
    assert_eq!(s.keys(Some(ModelFp::of("other")))?, vec![]);
    assert_eq!(s2.stats().remote_hits, 12);

    // Overwrites: a bigger record, then an inline one; old pieces go, the new ones serve.
    let (k, _) = common::nth(0);
    let big = kamera_store::Record::kv(
        common::model(),
        1,
        common::chunk(common::layouts()[0], 90, 5, DType::Bf16),
    );
    s.put(&k, big.clone())?;
    let n_big = pieces(&mut raw, &s, &k).len();
    assert!(n_big > 2);
    assert_eq!(*s.get(&k)?.context("big")?, big);
    let small = kamera_store::Record::kv(
        common::model(),
        1,
        common::chunk(common::layouts()[1], 2, 6, DType::Bf16),
    );
    s.put(&k, small.clone())?;
    assert_eq!(pieces(&mut raw, &s, &k), Vec::<String>::new(), "stale pieces left");
    assert_eq!(*s.get(&k)?.context("small")?, small);

    // Removal takes the pieces too.
    let (k3, _) = common::nth(3);
    assert!(!pieces(&mut raw, &s, &k3).is_empty());
    assert!(s.remove(&k3)?);
    assert!(!s.remove(&k3)?);
    assert!(s.get(&k3)?.is_none() && !s.contains(&k3)?);
    assert_eq!(pieces(&mut raw, &s, &k3).len(), 0);
    assert_eq!(s.keys(None)?.len(), 11);

    // TTL on the manifest and on every piece; bf16 by default.
    let t = RedisStore::open(RedisConfig {
        prefix: "ttl".into(),
        piece_bytes: 1024,
        ttl: Some(Duration::from_secs(60)),
        ..RedisConfig::at(srv.url())
    })?;
    let m = common::model();
    let kv = common::chunk(common::layouts()[0], 40, 3, DType::F32);
    let k = Key::canonical(m, ChunkId::of(b"f32", "enc", m));
    t.put(&k, kamera_store::Record::kv(m, 0, kv.clone()))?;
    assert_eq!(
        t.get(&k)?.context("ttl record")?.as_kv(),
        Some(&kv.to_dtype(DType::Bf16))
    );
    let names = [vec![t.manifest_key(&k)], pieces(&mut raw, &t, &k)].concat();
    assert!(names.len() > 2);
    for n in &names {
        let ttl: i64 = raw.pttl(n)?;
        assert!(ttl > 50_000 && ttl <= 60_000, "{n}: pttl {ttl}");
    }
    Ok(())
}

/// The store behaves like a BTreeMap across puts (inline and in pieces), removes, gets and
/// reopens (a new client); each case in its own prefix on one server.
#[test]
fn behaves_like_a_btreemap() -> Result<()> {
    let srv = RedisServer::start(&[])?;
    let case = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config {
        cases: 16,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(common::op(12), 1..30), |ops| {
        case.set(case.get() + 1);
        let prefix = format!("model-{}", case.get());
        let m = common::model();
        let key = |k: u8| Key::canonical(m, ChunkId::of(&[k], "e", m));
        let mut model: BTreeMap<u8, u8> = BTreeMap::new();
        let mut s = store(&srv.url(), &prefix, 160);
        for op in ops {
            match op {
                common::Op::Put(k, v) => {
                    s.put(&key(k), common::rec_of(v)).unwrap();
                    model.insert(k, v);
                }
                common::Op::Remove(k) => prop_assert_eq!(s.remove(&key(k)).unwrap(), model.remove(&k).is_some()),
                common::Op::Get(k) => {
                    let got = s.get(&key(k)).unwrap();
                    prop_assert_eq!(got.map(Arc::unwrap_or_clone), model.get(&k).map(|v| common::rec_of(*v)));
                    prop_assert_eq!(s.contains(&key(k)).unwrap(), model.contains_key(&k));
                }
                common::Op::Reopen => s = store(&srv.url(), &prefix, 333),
            }
            let mut want: Vec<Key> = model.keys().map(|k| key(*k)).collect();
            want.sort();
            prop_assert_eq!(s.keys(Some(m)).unwrap(), want);
        }
        let st = s.stats();
        prop_assert_eq!(st.all_misses() - st.misses, 0);
        Ok(())
    });
    result.map_err(|e| anyhow::anyhow!("{e}"))
}

#[test]
fn other_prefixes_and_models_are_never_served() -> Result<()> {
    let srv = RedisServer::start(&[])?;
    let mut raw = srv.raw();
    let (a, b) = (store(&srv.url(), "a", 512), store(&srv.url(), "b", 512));
    let other = ModelFp::of("other");
    for i in 0..6 {
        let (k, r) = common::nth(i);
        a.put(&k, r)?;
        assert!(b.get(&k)?.is_none() && !b.contains(&k)?);
        assert!(a.get(&Key { model: other, ..k })?.is_none());
        // The very bytes copied under the other prefix's name, or another model's key: refused.
        for (s, to) in [(&b, k), (&a, Key { model: other, ..k })] {
            let value: Vec<u8> = raw.get(a.manifest_key(&k))?;
            let _: () = raw.set(s.manifest_key(&to), value)?;
            for p in pieces(&mut raw, &a, &k) {
                let v: Vec<u8> = raw.get(&p)?;
                let _: () = raw.set(p.replace(&a.manifest_key(&k), &s.manifest_key(&to)), v)?;
            }
            let e = s.get(&to).expect_err("copied record served");
            assert!(matches!(e, Error::Corrupt { .. }), "{e}");
            assert!(s.lookup(&to)?.is_none());
        }
        let _: () = raw.del(b.manifest_key(&k))?;
    }
    assert_eq!(b.stats().corrupt, 12);
    assert_eq!(b.keys(None)?, vec![]);
    assert_eq!(a.keys(Some(common::model()))?.len(), 6);
    // A record whose header names another model, under this model's key: typed, counted.
    let (k, mut r) = common::nth(0);
    r.model = other;
    a.put_raw(&k, &codec::encode(&k, &r, None)?)?;
    assert!(matches!(a.get(&k), Err(Error::ForeignModel { .. })));
    assert!(a.put(&k, r).is_err(), "put refuses a record of another model");
    let (k, r) = common::nth(1);
    let mut bytes = codec::encode(&k, &r, None)?;
    bytes[4] = 9;
    a.put_raw(&k, &bytes)?;
    assert!(matches!(a.get(&k), Err(Error::Version { found: 9, .. })));
    let st = a.stats();
    // Each copy above was read twice (get, lookup): 6 records × 2 refusals.
    assert_eq!((st.foreign, st.version, st.corrupt), (1, 1, 12));
    Ok(())
}

#[test]
fn damaged_and_incomplete_records_are_refused_and_counted() -> Result<()> {
    let srv = RedisServer::start(&[])?;
    let mut raw = srv.raw();
    let s = store(&srv.url(), "dmg", 512);
    let (k, r) = common::nth(2); // ~2 KB: 4+ pieces
    s.put(&k, r.clone())?;
    let names = pieces(&mut raw, &s, &k);
    assert!(names.len() >= 3, "{names:?}");
    let mut refused = 0u64;
    let mut flip = |raw: &mut redis::Connection, name: &str, at: usize| -> Result<()> {
        let old: Vec<u8> = redis::cmd("GETRANGE").arg(name).arg(at).arg(at).query(raw)?;
        let _: i64 = redis::cmd("SETRANGE")
            .arg(name)
            .arg(at)
            .arg(&[old[0] ^ 0x20][..])
            .query(raw)?;
        let e = s.get(&k).expect_err("damaged record served");
        assert!(
            e.is_miss() && matches!(e, Error::Corrupt { .. } | Error::Version { .. }),
            "{e}"
        );
        let _: i64 = redis::cmd("SETRANGE").arg(name).arg(at).arg(&old[..]).query(raw)?;
        assert_eq!(*s.get(&k)?.context("restored")?, r);
        refused += 1;
        Ok(())
    };
    // Every byte of the manifest header, and bytes spread over every piece.
    for at in 0..56 {
        flip(&mut raw, &s.manifest_key(&k), at)?;
    }
    for p in &names {
        let len: usize = raw.strlen(p)?;
        for at in (0..len).step_by(37) {
            flip(&mut raw, p, at)?;
        }
    }
    // An inline record: every byte after the header.
    let (ki, ri) = common::nth(4);
    s.put(&ki, ri)?;
    let len: usize = raw.strlen(s.manifest_key(&ki))?;
    for at in 0..len {
        let name = s.manifest_key(&ki);
        let old: Vec<u8> = redis::cmd("GETRANGE").arg(&name).arg(at).arg(at).query(&mut raw)?;
        let _: i64 = redis::cmd("SETRANGE")
            .arg(&name)
            .arg(at)
            .arg(&[!old[0]][..])
            .query(&mut raw)?;
        assert!(s.get(&ki).is_err_and(|e| e.is_miss()), "inline flip at {at} served");
        let _: i64 = redis::cmd("SETRANGE")
            .arg(&name)
            .arg(at)
            .arg(&old[..])
            .query(&mut raw)?;
    }
    assert!(s.get(&ki)?.is_some());
    let st = s.stats();
    assert_eq!(st.corrupt + st.version, refused + len as u64, "every refusal counted");
    // A truncated piece, a piece of another record, a missing piece.
    let v: Vec<u8> = raw.get(&names[1])?;
    let _: () = raw.set(&names[1], &v[..v.len() - 1])?;
    assert!(matches!(s.get(&k), Err(Error::Corrupt { .. })));
    let _: () = raw.set(
        &names[1],
        &names[0].as_bytes().repeat(v.len() / names[0].len() + 1)[..v.len()],
    )?;
    assert!(matches!(s.get(&k), Err(Error::Corrupt { .. })));
    let _: () = raw.del(&names[1])?;
    let e = s.get(&k).expect_err("incomplete record served");
    assert!(matches!(e, Error::Incomplete { .. }) && e.is_miss(), "{e}");
    assert!(s.lookup(&k)?.is_none());
    assert_eq!(s.stats().incomplete, 2);
    assert!(
        s.contains(&k)?,
        "the manifest is still there (possibly damaged, as for sled)"
    );
    Ok(())
}

/// A transform-coded patch decodes in the bases the Redis store is opened with: served by a
/// client given the model's basis, refused by name and counted by one without it, and healthy to
/// that client's `verify` (checked short of the basis).
#[test]
fn coded_patches_decode_in_the_bases_the_store_is_given() -> Result<()> {
    let srv = RedisServer::start(&[])?;
    let m = common::model();
    let layout = common::layouts()[1];
    let basis = Arc::new(common::basis(layout, 1));
    let key = Key::orbit(m, ChunkId::of(b"coded", "enc", m), &[ChunkId::of(b"a", "enc", m)]);
    let rec = Record::patch(m, 5, common::coded_patch(layout, 12, 3, basis.clone(), true, 0.3));
    let open_with = |bases: Bases| {
        RedisStore::open(RedisConfig {
            prefix: "coded".into(),
            bases,
            ..RedisConfig::at(srv.url())
        })
    };
    let s = open_with(Bases::from(basis.clone()))?;
    s.put(&key, rec.clone())?;
    assert_eq!(*s.get(&key)?.context("present")?, rec);
    let blind = open_with(Bases::new())?;
    let e = blind.get(&key).unwrap_err();
    assert!(
        matches!(&e, Error::MissingBasis { basis: b, .. } if *b == basis.fp().to_string()),
        "{e}"
    );
    assert_eq!(blind.stats().version, 1);
    let v = blind.verify()?;
    assert_eq!((v.ok, v.bad.len()), (1, 0));
    Ok(())
}

#[test]
fn open_checks_settings_and_takes_credentials_from_the_url() -> Result<()> {
    let refused = |cfg: RedisConfig, what: &str| {
        let e = RedisStore::open(cfg).expect_err(what);
        assert!(matches!(e, Error::Invalid { .. }), "{what}: {e}");
        e.to_string()
    };
    // TLS settings: a CA file needs a rediss:// URL, and must be readable (named when not).
    let msg = refused(
        RedisConfig {
            tls_ca: Some("/etc/ca.pem".into()),
            ..RedisConfig::at("redis://u:hunter2@cache:6380/")
        },
        "tls_ca without TLS",
    );
    assert!(
        msg.contains("redis://u:***@cache:6380/") && msg.contains("/etc/ca.pem") && !msg.contains("hunter2"),
        "{msg}"
    );
    let msg = refused(
        RedisConfig {
            tls_ca: Some("/nonexistent/ca.pem".into()),
            ..RedisConfig::at("rediss://cache:6380/")
        },
        "missing CA file",
    );
    assert!(msg.contains("/nonexistent/ca.pem"), "{msg}");
    RedisStore::open(RedisConfig::at("rediss://u:hunter2@cache:6380/"))?;
    for prefix in ["", "a{b}", "a*", "a b"] {
        refused(
            RedisConfig {
                prefix: prefix.into(),
                ..RedisConfig::default()
            },
            prefix,
        );
    }
    refused(
        RedisConfig {
            piece_bytes: 0,
            ..RedisConfig::default()
        },
        "piece_bytes",
    );
    refused(RedisConfig::at("http://x"), "scheme");

    let srv = RedisServer::start(&["--requirepass", "s3cret"])?;
    let url = |auth: &str| format!("redis://{auth}127.0.0.1:{}/", srv.port);
    for auth in [":s3cret@", "default:s3cret@"] {
        let s = store(&url(auth), "auth", 4096);
        s.ping()?;
        let (k, r) = common::nth(2);
        s.put(&k, r.clone())?;
        assert_eq!(*s.get(&k)?.context("auth record")?, r);
        assert_eq!(s.is_cluster(), Some(false));
    }
    let wrong = store(&url(":wrong-pw@"), "auth", 4096);
    let e = wrong.ping().expect_err("a wrong password");
    assert!(e.is_unavailable() && !e.to_string().contains("wrong-pw"), "{e}");
    // Nothing listens: a connection error, typed as unavailable (what `Layered` skips).
    let port = redis_server::free_port()?;
    let gone = store(&format!("redis://127.0.0.1:{port}/"), "x", 4096);
    let e = gone.get(&common::nth(0).0).expect_err("no server");
    assert!(e.is_unavailable() && !e.is_miss(), "{e}");
    Ok(())
}
