//! The record encoding: round trips, golden bytes, and every damaged byte detected.

mod common;

use anyhow::Result;
use kamera_ops::{Bases, DType, Grain, Patch, Quant};
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
            assert_eq!(codec::decode(&key, &bytes, &Bases::new())?, rec);
            let p = common::patch(layout, 5, 3, li as u64, dtype);
            let key = Key::patch(m, id, &[(ChunkId::of(b"x", "enc", m), 0)], 9);
            let rec = Record::patch(m, 7, p);
            let bytes = codec::encode(&key, &rec, None)?;
            assert_eq!(codec::decode(&key, &bytes, &Bases::new())?, rec);
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
    let back = codec::decode(&key, &bytes, &Bases::new())?;
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
                match codec::decode(&key, &bad, &Bases::new()) {
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
            assert!(codec::decode(&key, &bytes[..cut], &Bases::new()).is_err_and(|e| e.is_miss()));
        }
        // The same bytes under another key (another chunk) are not served either.
        let other = Key::canonical(m, ChunkId::of(b"other", "enc", m));
        assert!(
            codec::decode(
                &Key {
                    kind: key.kind,
                    ..other
                },
                &bytes,
                &Bases::new()
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
    assert!(
        matches!(codec::decode(&key, &bytes, &Bases::new()), Err(Error::Version { found, .. }) if found == FORMAT_VERSION + 1)
    );
    let mut foreign = rec.clone();
    foreign.model = ModelFp::of("another-model");
    let bytes = codec::encode(&key, &foreign, None)?;
    assert!(matches!(
        codec::decode(&key, &bytes, &Bases::new()),
        Err(Error::ForeignModel { .. })
    ));
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
        assert_eq!(codec::decode(&key, &golden, &Bases::new())?, rec);
        let h = codec::verify(&key, &golden)?;
        assert_eq!((h.version, h.n_tokens, h.layout), (1, 3, layout));
    }
    Ok(())
}

/// Version 2 adds quantised patch factors; these golden files pin it byte for byte (and the
/// version-1 files above still decode: old records stay readable).
#[test]
fn golden_record_v2_quantised() -> Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let m = ModelFp::of("golden-model");
    let id = ChunkId::of(b"golden observation", "golden-encoder", m);
    let layout = kamera_ops::KvLayout::gqa(2, 4, 2, 4);
    for (file, quant, code) in [
        ("patch_q8_v2.kmr", Quant::Int8, codec::DTYPE_INT8),
        ("orbit_q4_v2.kmr", Quant::Int4, codec::DTYPE_INT4),
        ("patch_q4_mixed_v2.kmr", Quant::Int4Mixed, codec::DTYPE_INT4_MIXED),
    ] {
        let key = match quant {
            Quant::Int4 => Key::orbit(m, id, &[id, ChunkId::of(b"antecedent", "golden-encoder", m)]),
            _ => Key::patch(m, id, &[(ChunkId::of(b"antecedent", "golden-encoder", m), 0)], 7),
        };
        let float = common::patch(layout, 3, 2, 5, DType::F32);
        let p = match quant {
            // Both layouts in one record: layer 0 per direction, layer 1 per group.
            Quant::Int4Mixed => {
                let (d, g) = (
                    float.quantise_with(quant, Some(Grain::Direction.everywhere()))?,
                    float.quantise_with(quant, Some(Grain::Group.everywhere()))?,
                );
                let layers = vec![d.layers()[0].clone(), g.layers()[1].clone()];
                let scales = vec![d.scales()[0].clone(), g.scales()[1].clone()];
                Patch::with_quant(layout, 3, layers, quant, scales)?
            }
            _ => float.quantise(quant)?,
        };
        let rec = Record::patch(m, 99, p);
        let path = dir.join(file);
        let bytes = codec::encode(&key, &rec, Some(DType::Bf16))?;
        if std::env::var_os("KAMERA_BLESS").is_some() {
            std::fs::write(&path, &bytes)?;
        }
        let golden = std::fs::read(&path)?;
        assert_eq!(golden, bytes, "{file}: the v2 encoding changed");
        assert_eq!(codec::decode(&key, &golden, &Bases::new())?, rec);
        let h = codec::verify(&key, &golden)?;
        assert_eq!((h.version, h.quant, golden[7]), (2, quant, code));
    }
    Ok(())
}

#[test]
fn quantised_patches_round_trip_and_their_size_is_what_patch_bytes_says() -> Result<()> {
    let m = common::model();
    for (li, layout) in common::layouts().into_iter().enumerate() {
        for (quant, grain) in [
            (Quant::Int8, None),
            (Quant::Int4, None),
            (Quant::Int4Mixed, None),
            (Quant::Int4Mixed, Some(Grain::Direction.everywhere())),
            (
                Quant::Int4Mixed,
                Some([[Grain::Group, Grain::Direction], [Grain::Direction, Grain::Group]]),
            ),
        ] {
            for n in [1, 4, 7, 40] {
                let id = ChunkId::of(&[li as u8, n as u8], "enc", m);
                let p = common::patch(layout, n, 3, li as u64, DType::F32).quantise_with(quant, grain)?;
                let key = Key::patch(m, id, &[(ChunkId::of(b"x", "enc", m), 0)], 9);
                let rec = Record::patch(m, 7, p.clone());
                // The store's float dtype does not touch quantised factors.
                let bytes = codec::encode(&key, &rec, Some(DType::Bf16))?;
                assert_eq!(codec::decode(&key, &bytes, &Bases::new())?, rec);
                let spectra: usize = p.layers().iter().map(|l| l.k.spectrum.len() + l.v.spectrum.len()).sum();
                let header = HEADER_LEN + codec::CHECKSUM_LEN + 16 * layout.n_layers + 4 * spectra;
                assert_eq!(bytes.len(), header + p.bytes(), "{quant:?} n {n}");
                assert_eq!(rec.bytes(), p.bytes() + 4 * spectra);
            }
        }
    }
    Ok(())
}

#[test]
fn every_byte_flip_of_a_quantised_record_is_detected() -> Result<()> {
    let m = common::model();
    let layout = common::layouts()[0];
    let key = Key::patch(m, ChunkId::of(b"q", "enc", m), &[(ChunkId::of(b"x", "enc", m), 0)], 1);
    for quant in [Quant::Int4, Quant::Int4Mixed] {
        let rec = Record::patch(m, 3, common::patch(layout, 3, 2, 1, DType::F32).quantise(quant)?);
        let bytes = codec::encode(&key, &rec, None)?;
        for pos in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[pos] ^= 0x10;
            assert!(
                codec::decode(&key, &bad, &Bases::new()).is_err_and(|e| e.is_miss()),
                "{quant:?} flip at {pos}"
            );
        }
    }
    Ok(())
}

/// Version 3 adds transform-coded patches (coefficient codes in a per-model basis): they round
/// trip when the decoder is given the basis, their size is what `Patch::bytes` says, a record whose
/// basis is not among those given is refused by name, and these golden files pin the encoding byte for byte.
#[test]
fn transform_coded_patches_round_trip_and_golden_record_v3() -> Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let m = ModelFp::of("golden-model");
    let id = ChunkId::of(b"golden observation", "golden-encoder", m);
    let layout = kamera_ops::KvLayout::gqa(2, 4, 2, 4);
    let basis = std::sync::Arc::new(common::basis(layout, 1));
    let mut known = Bases::from(basis.clone());
    for (file, entropy, code) in [
        ("patch_basis_v3.kmr", false, codec::DTYPE_BASIS),
        ("patch_basis_entropy_v3.kmr", true, codec::DTYPE_BASIS_ENTROPY),
    ] {
        let key = Key::patch(m, id, &[(ChunkId::of(b"antecedent", "golden-encoder", m), 0)], 7);
        let p = common::coded_patch(layout, 40, 5, basis.clone(), entropy, 0.4);
        assert!(
            p.layers().iter().any(|l| l.k.rank() > 0),
            "the budget codes some columns"
        );
        let rec = Record::patch(m, 99, p.clone());
        let bytes = codec::encode(&key, &rec, Some(DType::Bf16))?;
        assert_eq!(bytes.len(), HEADER_LEN + codec::CHECKSUM_LEN + p.bytes());
        let path = dir.join(file);
        if std::env::var_os("KAMERA_BLESS").is_some() {
            std::fs::write(&path, &bytes)?;
        }
        let golden = std::fs::read(&path)?;
        assert_eq!(golden, bytes, "{file}: the v3 encoding changed");
        assert_eq!(codec::decode(&key, &golden, &known)?, rec);
        let h = codec::verify(&key, &golden)?;
        assert_eq!((h.version, h.coded, golden[7]), (3, Some(entropy), code));
        // Every damaged byte is detected.
        for pos in (0..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[pos] ^= 0x10;
            assert!(
                codec::decode(&key, &bad, &known).is_err_and(|e| e.is_miss()),
                "flip at {pos}"
            );
        }
    }
    for layout in common::layouts() {
        let basis = known.insert(std::sync::Arc::new(common::basis(layout, 3)));
        for (n, entropy) in [(1, false), (7, true), (70, true)] {
            let key = Key::orbit(m, id, &[id]);
            let rec = Record::patch(m, 1, common::coded_patch(layout, n, 9, basis.clone(), entropy, 0.2));
            assert_eq!(codec::decode(&key, &codec::encode(&key, &rec, None)?, &known)?, rec);
        }
    }
    // A basis the decoder is not given (it holds every other one): the record names it instead
    // of decoding garbage.
    let unknown = std::sync::Arc::new(common::basis(layout, 1000));
    let rec = Record::patch(m, 1, common::coded_patch(layout, 9, 2, unknown.clone(), true, 0.4));
    let bytes = codec::encode(&key_of(m, id), &rec, None)?;
    let e = codec::decode(&key_of(m, id), &bytes, &known).unwrap_err();
    assert!(
        matches!(&e, Error::MissingBasis { basis, .. } if *basis == unknown.fp().to_string()),
        "{e}"
    );
    Ok(())
}

fn key_of(m: ModelFp, id: ChunkId) -> Key {
    Key::patch(m, id, &[(id, 0)], 3)
}
