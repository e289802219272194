//! SledStore and the memory tier: reopen, typed misses, budgets, a model-based test against a
//! BTreeMap with reopens, and random byte flips in the database files.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use kamera_ops::{Bases, DType};
use kamera_store::{
    ChunkId, ChunkStore, Error, EvictionPolicy, Key, MemStore, ModelFp, Record, SledStore, StackOptions, StoreConfig,
    Tiered, codec,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

fn open(dir: &std::path::Path) -> SledStore {
    SledStore::open(StoreConfig::at(dir)).expect("open")
}

#[test]
fn put_get_survives_reopen_and_other_models_are_not_served() -> Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let s = open(dir.path());
        for i in 0..12 {
            let (k, r) = common::nth(i);
            s.put(&k, r)?;
        }
        s.flush()?;
    }
    let s = open(dir.path());
    for i in 0..12 {
        let (k, r) = common::nth(i);
        assert_eq!(*s.get(&k)?.expect("present"), r, "record {i}");
        assert!(s.contains(&k)?);
        // The same chunk asked for under another model is a plain miss.
        let other = Key {
            model: ModelFp::of("other"),
            ..k
        };
        assert!(s.get(&other)?.is_none());
    }
    assert_eq!(s.keys(Some(common::model()))?.len(), 12);
    assert_eq!(s.keys(Some(ModelFp::of("other")))?.len(), 0);
    assert_eq!(s.stats().disk_hits, 12);

    // A record whose header names another model, under this model's key: typed, counted, None.
    let (k, mut r) = common::nth(0);
    r.model = ModelFp::of("other");
    s.put_raw(&k, &codec::encode(&k, &r, None)?, 0)?;
    assert!(matches!(s.get(&k), Err(kamera_store::Error::ForeignModel { .. })));
    assert!(s.lookup(&k)?.is_none());
    assert_eq!(s.stats().foreign, 2);
    // put refuses to write it in the first place.
    assert!(s.put(&k, r).is_err());

    // A future format version: typed, counted.
    let (k, r) = common::nth(1);
    let mut bytes = codec::encode(&k, &r, None)?;
    bytes[4] = 9;
    s.put_raw(&k, &bytes, 0)?;
    assert!(matches!(s.get(&k), Err(kamera_store::Error::Version { found: 9, .. })));
    assert_eq!(s.stats().version, 1);
    let v = s.verify()?;
    assert_eq!((v.ok, v.bad.len()), (10, 2));
    let gc = s.gc(None)?;
    assert_eq!(gc.removed_bad, 2);
    assert_eq!(s.verify()?.bad.len(), 0);
    Ok(())
}

/// A transform-coded patch decodes in the bases the store is opened with: a store given the
/// model's basis serves it (the stack too), one given only another basis refuses it by name and
/// counts it, and `verify` calls it healthy either way (checked short of the basis).
#[test]
fn coded_patches_decode_in_the_bases_the_store_is_given() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let m = common::model();
    let layout = common::layouts()[0];
    let (basis, other) = (Arc::new(common::basis(layout, 1)), Arc::new(common::basis(layout, 2)));
    let key = Key::orbit(m, ChunkId::of(b"coded", "enc", m), &[ChunkId::of(b"a", "enc", m)]);
    let rec = Record::patch(m, 5, common::coded_patch(layout, 12, 3, basis.clone(), true, 0.3));
    let open_with = |bases: Bases| {
        SledStore::open(StoreConfig {
            bases,
            ..StoreConfig::at(dir.path())
        })
    };
    {
        let s = open_with(Bases::from(basis.clone()))?;
        s.put(&key, rec.clone())?;
        assert_eq!(*s.get(&key)?.expect("stored"), rec);
        s.flush()?;
    }
    {
        let s = open_with(Bases::from(other.clone()))?;
        let e = s.get(&key).unwrap_err();
        assert!(
            matches!(&e, Error::MissingBasis { basis: b, .. } if *b == basis.fp().to_string()),
            "{e}"
        );
        assert!(s.lookup(&key)?.is_none());
        assert_eq!(s.stats().version, 2);
        let v = s.verify()?;
        assert_eq!((v.ok, v.bad.len()), (1, 0));
    }
    {
        let s = open_with(Bases::new().with(other).with(basis.clone()))?;
        assert_eq!(*s.get(&key)?.expect("stored"), rec);
    }
    let opts = StackOptions {
        memory_bytes: 1 << 20,
        bases: Bases::from(basis),
        ..StackOptions::default()
    };
    let stack = kamera_store::open_stack_with(dir.path(), None, &opts)?;
    assert_eq!(*stack.get(&key)?.expect("stored"), rec);
    Ok(())
}

#[test]
fn f32_input_is_stored_as_bf16_by_default() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let s = open(dir.path());
    let m = common::model();
    let kv = common::chunk(common::layouts()[0], 20, 3, DType::F32);
    let k = Key::canonical(m, ChunkId::of(b"f32", "enc", m));
    s.put(&k, Record::kv(m, 0, kv.clone()))?;
    let back = s.get(&k)?.expect("present");
    assert_eq!(back.as_kv(), Some(&kv.to_dtype(DType::Bf16)));
    assert!(s.total_bytes() < kv.kv_bytes() as u64 / 2 + 200);
    Ok(())
}

#[test]
fn disk_budget_evicts_cheap_and_old_records_first() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let m = common::model();
    let layout = common::layouts()[0];
    let rec = |cost| Record::kv(m, cost, common::chunk(layout, 40, cost, DType::Bf16));
    let one = codec::encode(&Key::canonical(m, ChunkId::of(b"x", "e", m)), &rec(1), None)?.len() as u64;
    let cfg = StoreConfig {
        budget_bytes: Some(one * 4),
        ..StoreConfig::at(dir.path())
    };
    let s = SledStore::open(cfg)?;
    let key = |i: u64| Key::canonical(m, ChunkId::of(&i.to_le_bytes(), "e", m));
    // Expensive records 0..3, then cheap ones; the cheap ones go first.
    for i in 0..3 {
        s.put(&key(i), rec(1_000_000 + i))?;
    }
    for i in 3..8 {
        s.put(&key(i), rec(1))?;
    }
    assert!(s.total_bytes() <= one * 4);
    for i in 0..3 {
        assert!(s.contains(&key(i))?, "expensive record {i} evicted");
    }
    assert!(s.contains(&key(7))?, "the record just written is kept");
    assert!(s.stats().evictions >= 4);
    Ok(())
}

/// Hits served by the memory tier count as uses on disk too: under the disk budget the record
/// read through the tier outlives an older-untouched one of the same worth.
#[test]
fn memory_tier_hits_keep_records_fresh_on_disk() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let m = common::model();
    let layout = common::layouts()[0];
    let rec = || Record::kv(m, 1000, common::chunk(layout, 40, 7, DType::Bf16));
    let key = |i: u64| Key::canonical(m, ChunkId::of(&i.to_le_bytes(), "e", m));
    let one = codec::encode(&key(0), &rec(), None)?.len() as u64;
    let cfg = StoreConfig {
        budget_bytes: Some(one * 3),
        ..StoreConfig::at(dir.path())
    };
    let t = Tiered::new(SledStore::open(cfg)?, one * 100, EvictionPolicy { half_life: 4.0 });
    for i in 0..3 {
        t.put(&key(i), rec())?;
    }
    for _ in 0..5 {
        assert!(t.get(&key(0))?.is_some());
    }
    assert!(t.stats().mem_hits >= 5, "the reads were memory hits");
    t.put(&key(3), rec())?;
    let disk = t.inner();
    assert!(
        disk.contains(&key(0))?,
        "the record read through the tier was evicted from disk"
    );
    assert!(!disk.contains(&key(1))?, "the oldest untouched record stayed");
    Ok(())
}

#[test]
fn memory_tier_respects_its_budget_and_prefers_valuable_records() -> Result<()> {
    let m = common::model();
    let layout = common::layouts()[0];
    let rec = |cost| Record::kv(m, cost, common::chunk(layout, 10, cost, DType::Bf16));
    let size = rec(0).bytes() as u64;
    let t = Tiered::new(MemStore::new(), size * 3, EvictionPolicy { half_life: 1e9 });
    let key = |i: u64| Key::canonical(m, ChunkId::of(&i.to_le_bytes(), "e", m));
    t.put(&key(0), rec(1000))?;
    t.put(&key(1), rec(1))?;
    t.put(&key(2), rec(1000))?;
    t.put(&key(3), rec(1000))?;
    assert!(t.mem_bytes() <= size * 3);
    assert!(!t.in_memory(&key(1)), "the cheap record leaves memory first");
    assert!(t.in_memory(&key(0)) && t.in_memory(&key(2)) && t.in_memory(&key(3)));
    // It is still in the backing store, and a read brings it back.
    assert!(t.get(&key(1))?.is_some());
    assert!(t.in_memory(&key(1)));
    assert!(t.mem_bytes() <= size * 3);
    let before = t.stats().mem_hits;
    let _ = t.get(&key(1))?;
    assert_eq!(t.stats().mem_hits, before + 1);
    // Recency: with a short half-life the least recently used of equal records goes.
    let t = Tiered::new(MemStore::new(), size * 2, EvictionPolicy { half_life: 1.0 });
    t.put(&key(0), rec(5))?;
    t.put(&key(1), rec(5))?;
    let _ = t.get(&key(0))?;
    t.put(&key(2), rec(5))?;
    assert!(t.in_memory(&key(0)) && !t.in_memory(&key(1)));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// The store behaves like a BTreeMap across puts, removes, gets and reopens (flushed), with
    /// a memory tier in front that must never serve a stale record.
    #[test]
    fn behaves_like_a_btreemap(ops in proptest::collection::vec(common::op(16), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let m = common::model();
        let key = |k: u8| Key::canonical(m, ChunkId::of(&[k], "e", m));
        let mut model: BTreeMap<u8, u8> = BTreeMap::new();
        let mut s = Tiered::new(open(dir.path()), 4096, EvictionPolicy::default());
        for op in ops {
            match op {
                common::Op::Put(k, v) => { s.put(&key(k), common::rec_of(v)).unwrap(); model.insert(k, v); }
                common::Op::Remove(k) => { prop_assert_eq!(s.remove(&key(k)).unwrap(), model.remove(&k).is_some()); }
                common::Op::Get(k) => {
                    let got = s.get(&key(k)).unwrap();
                    prop_assert_eq!(got.map(Arc::unwrap_or_clone), model.get(&k).map(|v| common::rec_of(*v)));
                }
                common::Op::Reopen => {
                    s.flush().unwrap();
                    drop(s);
                    s = Tiered::new(open(dir.path()), 4096, EvictionPolicy::default());
                }
            }
            let keys: Vec<Key> = s.keys(Some(m)).unwrap();
            let mut want: Vec<Key> = model.keys().map(|k| key(*k)).collect();
            want.sort();
            prop_assert_eq!(keys, want);
        }
        let total: u64 = model.iter().map(|(k, v)| codec::encode(&key(*k), &common::rec_of(*v), None).unwrap().len() as u64).sum();
        prop_assert_eq!(s.inner().total_bytes(), total);
    }
}

/// Flips random bytes in the database files, many times: every record is either served intact
/// or refused (typed miss, or sled's own error); never served damaged.
#[test]
fn byte_flips_in_the_database_files_are_never_served() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(7);
    let n = 30u64;
    let (mut served, mut refused, mut open_failed, mut detected) = (0u64, 0u64, 0u64, 0u64);
    for trial in 0..12 {
        let dir = tempfile::tempdir()?;
        {
            let s = open(dir.path());
            for i in 0..n {
                let (k, r) = common::nth(i);
                s.put(&k, r)?;
            }
            s.flush()?;
        }
        // sled's own config file only makes open fail; damage the data (log, snapshots, blobs).
        let files: Vec<_> = walk(dir.path())
            .into_iter()
            .filter(|(p, len)| *len > 0 && p.file_name().is_some_and(|n| n != "conf"))
            .collect();
        for _ in 0..(1 + trial % 4) * 8 {
            let (path, len) = &files[rng.random_range(0..files.len())];
            let mut bytes = std::fs::read(path)?;
            let pos = rng.random_range(0..*len as usize);
            bytes[pos] ^= rng.random_range(1..=255u8);
            std::fs::write(path, bytes)?;
        }
        let outcome = std::panic::catch_unwind(|| -> Result<(u64, u64, u64)> {
            let s = SledStore::open(StoreConfig::at(dir.path()))?;
            let (mut ok, mut bad, mut typed) = (0, 0, 0);
            for i in 0..n {
                let (k, r) = common::nth(i);
                match s.get(&k) {
                    Ok(Some(got)) => {
                        assert_eq!(*got, r, "trial {trial}: record {i} served damaged");
                        ok += 1;
                    }
                    Ok(None) => bad += 1,
                    Err(e) => {
                        assert!(e.is_miss(), "trial {trial}: record {i}: {e}");
                        bad += 1;
                        typed += 1;
                    }
                }
            }
            Ok((ok, bad, typed))
        });
        match outcome {
            Ok(Ok((ok, bad, typed))) => {
                served += ok;
                refused += bad;
                detected += typed;
            }
            Ok(Err(e)) => {
                eprintln!("trial {trial}: {e}");
                open_failed += 1
            }
            Err(p) => std::panic::resume_unwind(p),
        }
    }
    eprintln!(
        "byte flips: {served} records served intact, {refused} refused ({detected} by our checksum, the rest \
         dropped by sled's recovery), {open_failed} databases refused to open"
    );
    assert!(
        refused + open_failed > 0,
        "no damage observed: the flips missed every record"
    );
    Ok(())
}

fn walk(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if let Ok(m) = e.metadata() {
            out.push((p, m.len()));
        }
    }
    out
}
