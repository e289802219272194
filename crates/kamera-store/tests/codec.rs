//! The record encoding: round trips, golden bytes, and every damaged byte detected.

mod common;

use anyhow::Result;
use kamera_ops::DType;
use kamera_store::codec::{self, FORMAT_VERSION, HEADER_LEN};
use kamera_store::{ChunkId, Error, Key, ModelFp, Record};

#[test]
fn round_trips_kv_and_patches_in_every_dtype_and_layout() -> Result<()> {
    let m = common::model();
    for (li, layout) in common::layouts().into_iter().enumerate() {
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let id = ChunkId::of(&[li as u8], "enc", m);
            let kv = common::chunk(layout, 5, li as u64, dtype);
            let key = Key::canonical(m, id);
            let rec = Record::kv(m, 42, kv);
            let bytes = codec::encode(&key, &rec, None)?;
            assert_eq!(codec::decode(&key, &bytes)?, rec);
            let p = common::patch(layout, 5, 3, li as u64, dtype);
            let key = Key::patch(m, id, &[(ChunkId::of(b"x", "enc", m), 0)], 9);
            let rec = Record::patch(m, 7, p);
            let bytes = codec::encode(&key, &rec, None)?;
            assert_eq!(codec::decode(&key, &bytes)?, rec);
        }
    }
    Ok(())
}

#[test]
fn f32_is_stored_as_bf16_when_asked_and_sizes_are_exact() -> Result<()> {
    let m = common::model();
    let layout = common::layouts()[0];
    let kv = common::chunk(layout, 10, 1, DType::F32);
    let key = Key::canonical(m, ChunkId::of(b"c", "enc", m));
    let bytes = codec::encode(&key, &Record::kv(m, 0, kv.clone()), Some(DType::Bf16))?;
    assert_eq!(bytes.len(), HEADER_LEN + kv.kv_bytes() / 2 + codec::CHECKSUM_LEN);
    let back = codec::decode(&key, &bytes)?;
    assert_eq!(back.as_kv(), Some(&kv.to_dtype(DType::Bf16)));
    Ok(())
}

#[test]
fn every_single_byte_flip_is_detected() -> Result<()> {
    let m = common::model();
    for i in 0..3u64 {
        let (key, rec) = common::nth(i);
        let rec = match i {
            0 => Record::kv(m, 1, common::chunk(common::layouts()[0], 2, 3, DType::Bf16)),
            _ => rec,
        };
        let bytes = codec::encode(&key, &rec, None)?;
        for pos in 0..bytes.len() {
            for bit in [0x01u8, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[pos] ^= bit;
                match codec::decode(&key, &bad) {
                    Ok(r) => panic!(
                        "flip {bit:#x} at byte {pos} of {} served a record: {:?}",
                        bytes.len(),
                        r.cost_us
                    ),
                    Err(e) => assert!(e.is_miss(), "flip at {pos}: {e} is not a miss"),
                }
            }
        }
        for cut in [0, 10, HEADER_LEN, bytes.len() - 1] {
            assert!(codec::decode(&key, &bytes[..cut]).is_err_and(|e| e.is_miss()));
        }
        // The same bytes under another key (another chunk) are not served either.
        let other = Key::canonical(m, ChunkId::of(b"other", "enc", m));
        assert!(
            codec::decode(
                &Key {
                    kind: key.kind,
                    ..other
                },
                &bytes
            )
            .is_err()
        );
    }
    Ok(())
}

#[test]
fn version_and_model_mismatches_are_typed() -> Result<()> {
    let (key, rec) = common::nth(0);
    let mut bytes = codec::encode(&key, &rec, None)?;
    bytes[4..6].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert!(matches!(codec::decode(&key, &bytes), Err(Error::Version { found, .. }) if found == FORMAT_VERSION + 1));
    let mut foreign = rec.clone();
    foreign.model = ModelFp::of("another-model");
    let bytes = codec::encode(&key, &foreign, None)?;
    assert!(matches!(codec::decode(&key, &bytes), Err(Error::ForeignModel { .. })));
    Ok(())
}

/// The golden file pins format version 1 byte for byte: a change to the encoding must bump the
/// version (and keep reading old files) instead of silently changing this file.
/// Regenerate only on a version bump: `KAMERA_BLESS=1 cargo test -p kamera-store --test codec`.
#[test]
fn golden_record_v1() -> Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let m = ModelFp::of("golden-model");
    let id = ChunkId::of(b"golden observation", "golden-encoder", m);
    let layout = kamera_ops::KvLayout::gqa(2, 4, 2, 4);
    let cases = [
        (
            "canonical_v1.kmr",
            Key::canonical(m, id),
            Record::kv(m, 1234, common::chunk(layout, 3, 5, DType::Bf16)),
        ),
        (
            "patch_v1.kmr",
            Key::patch(m, id, &[(ChunkId::of(b"antecedent", "golden-encoder", m), 0)], 7),
            Record::patch(m, 99, common::patch(layout, 3, 2, 5, DType::F16)),
        ),
    ];
    for (file, key, rec) in cases {
        let path = dir.join(file);
        let bytes = codec::encode(&key, &rec, None)?;
        if std::env::var_os("KAMERA_BLESS").is_some() {
            std::fs::write(&path, &bytes)?;
        }
        let golden = std::fs::read(&path)?;
        assert_eq!(golden, bytes, "{file}: the v1 encoding changed");
        assert_eq!(codec::decode(&key, &golden)?, rec);
        let h = codec::verify(&key, &golden)?;
        assert_eq!((h.version, h.n_tokens, h.layout), (1, 3, layout));
    }
    Ok(())
}
