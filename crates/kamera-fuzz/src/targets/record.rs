//! The record codec target: an input is the 81 key bytes then a record, decoded with
//! `codec::decode`. Most mutated inputs are resealed (checksum, and half the time the payload
//! length) as the README specifies, so that they reach the parser behind the checksum. An
//! accepted record must encode back to exactly the input bytes.

use kamera_ops::{Bases, Buf, ChunkKv, DType, KvLayout, LayerPatch, LowRank, Mat, Patch};
use kamera_store::codec::{self, CHECKSUM_LEN, HEADER_LEN};
use kamera_store::{ChunkId, KEY_LEN, Key, ModelFp, Record};

use super::{Outcome, Target, rejected};
use crate::error::Result;

pub(super) fn target() -> Result<Target> {
    // The store's golden files (format v1, pinned byte for byte by its tests) under their keys.
    let gm = ModelFp::of("golden-model");
    let gid = ChunkId::of(b"golden observation", "golden-encoder", gm);
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kamera-store/tests/golden");
    let mut seeds = Vec::new();
    for (file, key) in [
        ("canonical_v1.kmr", Key::canonical(gm, gid)),
        (
            "patch_v1.kmr",
            Key::patch(gm, gid, &[(ChunkId::of(b"antecedent", "golden-encoder", gm), 0)], 7),
        ),
    ] {
        let path = golden.join(file);
        let bytes = std::fs::read(&path).map_err(|e| crate::Error::Seed {
            target: "record",
            path,
            detail: e.to_string(),
        })?;
        let mut seed = key.to_bytes().to_vec();
        seed.extend(bytes);
        seeds.push(seed);
    }
    let m = ModelFp::of("fuzz-model");
    let id = ChunkId::of(b"fuzz observation", "fuzz-encoder", m);
    let layouts = [
        KvLayout::mha(2, 2, 4),
        KvLayout::gqa(2, 4, 2, 4),
        KvLayout::mla(1, 2, 8, 4),
    ];
    for (li, layout) in layouts.into_iter().enumerate() {
        for (di, dtype) in [DType::F32, DType::F16, DType::Bf16].into_iter().enumerate() {
            let n = 1 + (li + di) % 3;
            let kv = ChunkKv::new(
                layout,
                li as i64 - 1,
                (0..layout.n_layers).map(|_| layer(n, &layout, dtype)).collect(),
            )
            .map_err(|e| seed_err(e.to_string()))?;
            seeds.push(sealed(&Key::canonical(m, id), &Record::kv(m, 1000 + li as u64, kv))?);
            let patch = Patch::new(
                layout,
                n,
                (0..layout.n_layers)
                    .map(|l| LayerPatch {
                        k: low_rank(n, 1 + (l % n), layout.k_features(), dtype),
                        v: low_rank(n, 1, layout.v_features(), dtype),
                    })
                    .collect(),
            )
            .map_err(|e| seed_err(e.to_string()))?;
            let key = if di == 2 {
                Key::orbit(m, id, &[ChunkId::of(b"a", "fuzz-encoder", m), id])
            } else {
                Key::patch(m, id, &[(ChunkId::of(b"a", "fuzz-encoder", m), 3)], 9)
            };
            seeds.push(sealed(&key, &Record::patch(m, 7, patch))?);
        }
    }
    Ok(Target {
        name: "record",
        about: "key bytes + kamera-store record through codec::decode (re-encode must be exact); seeds: \
                canonical KV and (orbit) patches of MHA, GQA and MLA layouts in f32, f16, bf16"
            .into(),
        seeds,
        dict: Vec::new(),
        bound: |n| 16 * n + (1 << 20),
        bound_text: "16 x input + 1 MiB",
        fixup: Some(reseal),
        decode: Box::new(decode),
    })
}

fn seed_err(detail: String) -> crate::Error {
    crate::Error::Seed {
        target: "record",
        path: "(generated)".into(),
        detail,
    }
}

fn sealed(key: &Key, rec: &Record) -> Result<Vec<u8>> {
    let mut out = key.to_bytes().to_vec();
    out.extend(codec::encode(key, rec, None).map_err(|e| seed_err(e.to_string()))?);
    Ok(out)
}

fn values(n: usize, dtype: DType) -> Buf {
    let v: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    Buf::from_f32(dtype, &v)
}

fn layer(n: usize, layout: &KvLayout, dtype: DType) -> kamera_ops::LayerKv {
    let (kf, vf) = (layout.k_features(), layout.v_features());
    kamera_ops::LayerKv {
        k: Mat::new(n, kf, values(n * kf, dtype)).unwrap_or_else(|_| Mat::zeros(n, kf, dtype)),
        v: Mat::new(n, vf, values(n * vf, dtype)).unwrap_or_else(|_| Mat::zeros(n, vf, dtype)),
    }
}

fn low_rank(n: usize, rank: usize, features: usize, dtype: DType) -> LowRank {
    LowRank {
        p: Mat::new(n, rank, values(n * rank, dtype)).unwrap_or_else(|_| Mat::zeros(n, rank, dtype)),
        wt: Mat::new(rank, features, values(rank * features, dtype))
            .unwrap_or_else(|_| Mat::zeros(rank, features, dtype)),
        spectrum: (0..rank.min(features)).map(|i| 1.0 / (1 + i) as f32).collect(),
    }
}

/// Recomputes the payload length (every other input) and the checksum, as the README defines
/// them: blake3 (derive-key `kamera.record.v1`) of key bytes ‖ header ‖ payload, first 16 bytes.
fn reseal(b: &mut [u8]) {
    if b.len() < KEY_LEN + HEADER_LEN + CHECKSUM_LEN {
        return;
    }
    let end = b.len() - CHECKSUM_LEN;
    if b[KEY_LEN + 4] & 1 == 0 {
        let payload = (end - KEY_LEN - HEADER_LEN) as u64;
        b[KEY_LEN + 72..KEY_LEN + 80].copy_from_slice(&payload.to_le_bytes());
    }
    let mut h = blake3::Hasher::new_derive_key("kamera.record.v1");
    h.update(&b[..end]);
    let sum = h.finalize();
    b[end..].copy_from_slice(&sum.as_bytes()[..CHECKSUM_LEN]);
}

fn decode(b: &[u8]) -> std::result::Result<Outcome, String> {
    if b.len() < KEY_LEN {
        return Ok(Outcome::Rejected(format!("{} bytes: shorter than a key", b.len())));
    }
    let key = match Key::from_bytes(&b[..KEY_LEN]) {
        Ok(k) => k,
        Err(e) => return Ok(Outcome::Rejected(e.to_string())),
    };
    let bytes = &b[KEY_LEN..];
    match codec::decode(&key, bytes, &Bases::new()) {
        Ok(rec) => {
            let dtype = codec::verify(&key, bytes)
                .map_err(|e| format!("decoded but verify fails: {e}"))?
                .dtype;
            let again =
                codec::encode(&key, &rec, Some(dtype)).map_err(|e| format!("decoded record does not encode: {e}"))?;
            if again != bytes {
                return Err(format!(
                    "decoded record encodes to {} other bytes than the {} it came from",
                    again.len(),
                    bytes.len()
                ));
            }
            Ok(Outcome::Accepted)
        }
        Err(e) => rejected(&key.to_string(), e.to_string()),
    }
}
