//! Regressions from kamera-fuzz: records whose checksum passes but whose header declares more
//! than the payload holds, or encodes one record two ways.

mod common;

use anyhow::Result;
use kamera_ops::{Bases, DType};
use kamera_store::codec::{self, CHECKSUM_LEN, MAX_LAYERS};
use kamera_store::{ChunkId, Error, Key, Record};

/// Rewrites header bytes `at..` and reseals the checksum as the README defines it.
fn patched(key: &Key, bytes: &[u8], at: usize, with: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at..at + with.len()].copy_from_slice(with);
    let end = b.len() - CHECKSUM_LEN;
    let mut h = blake3::Hasher::new_derive_key("kamera.record.v1");
    h.update(&key.to_bytes());
    h.update(&b[..end]);
    b[end..].copy_from_slice(&h.finalize().as_bytes()[..CHECKSUM_LEN]);
    b
}

fn corrupt(key: &Key, bytes: &[u8]) -> String {
    match codec::decode(key, bytes, &Bases::new()) {
        Err(e @ Error::Corrupt { .. }) => {
            assert!(e.to_string().contains(&key.to_string()), "names the key: {e}");
            e.to_string()
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn canonical(n_tokens: usize) -> Result<(Key, Vec<u8>)> {
    let m = common::model();
    let key = Key::canonical(m, ChunkId::of(b"c", "enc", m));
    let kv = common::chunk(common::layouts()[0], n_tokens, 1, DType::Bf16);
    let bytes = codec::encode(&key, &Record::kv(m, 0, kv), None)?;
    Ok((key, bytes))
}

#[test]
fn zero_token_layers_cannot_declare_millions_of_layers() -> Result<()> {
    // n_tokens 0 makes every layer zero bytes: 4e9 declared layers once allocated ~400 GB.
    let (key, bytes) = canonical(0)?;
    for layers in [MAX_LAYERS as u32 + 1, 51_457, u32::MAX] {
        let e = corrupt(&key, &patched(&key, &bytes, 48, &layers.to_le_bytes()));
        assert!(e.contains("layers (at most 4096)"), "{e}");
    }
    Ok(())
}

#[test]
fn canonical_payload_must_match_the_header_before_allocating() -> Result<()> {
    let (key, bytes) = canonical(3)?;
    let e = corrupt(&key, &patched(&key, &bytes, 52, &1_000_000u32.to_le_bytes()));
    assert!(e.contains("payload of"), "{e}");
    Ok(())
}

#[test]
fn one_record_has_one_encoding() -> Result<()> {
    let (key, bytes) = canonical(2)?;
    // Reserved bytes, the MHA/GQA fields it does not use.
    for (at, with) in [(25usize, &[1u8][..]), (36, &[1u8][..])] {
        let e = corrupt(&key, &patched(&key, &bytes, at, with));
        assert!(e.contains("not zero"), "{e}");
    }
    // A patch's frame offset is 0 (decode ignored it, so two byte strings gave one patch).
    let m = common::model();
    let id = ChunkId::of(b"p", "enc", m);
    let key = Key::patch(m, id, &[(ChunkId::of(b"x", "enc", m), 0)], 9);
    let p = common::patch(common::layouts()[0], 3, 2, 1, DType::F16);
    let bytes = codec::encode(&key, &Record::patch(m, 0, p), None)?;
    let e = corrupt(&key, &patched(&key, &bytes, 56, &5i64.to_le_bytes()));
    assert!(e.contains("frame offset 5"), "{e}");
    Ok(())
}

#[test]
fn an_invalid_layout_is_corrupt_and_names_the_key() -> Result<()> {
    let (key, bytes) = canonical(2)?;
    let e = corrupt(&key, &patched(&key, &bytes, 28, &0u32.to_le_bytes()));
    assert!(e.contains("layout"), "{e}");
    Ok(())
}
