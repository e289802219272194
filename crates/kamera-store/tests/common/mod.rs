//! Deterministic synthetic records for the store tests.
#![allow(dead_code)]

use kamera_ops::{Buf, ChunkKv, DType, KvLayout, LayerKv, LayerPatch, LowRank, Mat, Patch};
use kamera_store::{ChunkId, Key, ModelFp, Record};

/// A small xorshift so records depend only on their seed.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        })
        .collect()
}

pub fn layouts() -> Vec<KvLayout> {
    vec![
        KvLayout::gqa(3, 4, 2, 8),
        KvLayout::mha(2, 2, 4),
        KvLayout::mla(2, 4, 12, 4),
    ]
}

pub fn chunk(layout: KvLayout, n: usize, seed: u64, dtype: DType) -> ChunkKv {
    let layers = (0..layout.n_layers)
        .map(|l| {
            let s = seed * 1000 + l as u64 * 2;
            let k = Mat::new(
                n,
                layout.k_features(),
                Buf::from_f32(dtype, &values(s, n * layout.k_features())),
            );
            let v = Mat::new(
                n,
                layout.v_features(),
                Buf::from_f32(dtype, &values(s + 1, n * layout.v_features())),
            );
            LayerKv {
                k: k.unwrap(),
                v: v.unwrap(),
            }
        })
        .collect();
    ChunkKv::new(layout, 0, layers).unwrap()
}

fn low_rank(rows: usize, m: usize, cols: usize, seed: u64, dtype: DType) -> LowRank {
    LowRank {
        p: Mat::new(rows, m, Buf::from_f32(dtype, &values(seed, rows * m))).unwrap(),
        wt: Mat::new(m, cols, Buf::from_f32(dtype, &values(seed + 7, m * cols))).unwrap(),
        spectrum: values(seed + 9, rows.min(cols)).iter().map(|x| x.abs()).collect(),
    }
}

pub fn patch(layout: KvLayout, n: usize, rank: usize, seed: u64, dtype: DType) -> Patch {
    let layers = (0..layout.n_layers)
        .map(|l| LayerPatch {
            k: low_rank(n, rank.min(n), layout.k_features(), seed + 100 * l as u64, dtype),
            v: low_rank(
                n,
                (rank + l).min(n),
                layout.v_features(),
                seed + 100 * l as u64 + 50,
                dtype,
            ),
        })
        .collect();
    Patch::new(layout, n, layers).unwrap()
}

pub fn model() -> ModelFp {
    ModelFp::of("test-model")
}

/// Record `i` of a deterministic sequence: canonical KV, patches and orbit patches in turn,
/// sizes from a few hundred bytes to ~100 KB, stored as bf16.
pub fn nth(i: u64) -> (Key, Record) {
    let m = model();
    let id = ChunkId::of(&i.to_le_bytes(), "enc", m);
    let layout = layouts()[(i % 3) as usize];
    let n = [3usize, 17, 200, 40][(i % 4) as usize];
    match i % 3 {
        0 => (
            Key::canonical(m, id),
            Record::kv(m, i * 10, chunk(layout, n, i, DType::Bf16)),
        ),
        1 => (
            Key::patch(m, id, &[(ChunkId::of(b"a", "enc", m), 0)], 5),
            Record::patch(m, i, patch(layout, n, 4, i, DType::Bf16)),
        ),
        _ => (
            Key::orbit(m, id, &[id]),
            Record::patch(m, i, patch(layout, n, 2, i, DType::Bf16)),
        ),
    }
}

/// One operation of a model-based store test (a store against a `BTreeMap`).
#[derive(Debug, Clone)]
pub enum Op {
    Put(u8, u8),
    Remove(u8),
    Get(u8),
    Reopen,
}

/// Operations over `keys` distinct keys, reopening now and then.
pub fn op(keys: u8) -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..keys, any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0..keys).prop_map(Op::Remove),
        3 => (0..keys).prop_map(Op::Get),
        1 => Just(Op::Reopen),
    ]
}

/// The record a model-based test stores for value `v` (layout, length and payload follow `v`).
pub fn rec_of(v: u8) -> Record {
    Record::kv(
        model(),
        v as u64,
        chunk(layouts()[(v % 3) as usize], 1 + v as usize % 7, v as u64, DType::Bf16),
    )
}

/// A signed permutation basis per layer (orthonormal, distinct per `seed`), with its fingerprint.
pub fn basis(layout: KvLayout, seed: usize) -> kamera_ops::PatchBasis {
    let perm = |f: usize, s: usize| {
        let mut m = vec![0f32; f * f];
        (0..f).for_each(|j| m[j * f + (j + s) % f] = if j % 2 == 0 { 1.0 } else { -1.0 });
        m
    };
    let (kf, vf) = (layout.k_features(), layout.v_features());
    let layers = (0..layout.n_layers)
        .map(|l| (perm(kf, seed + l), perm(vf, seed + 2 * l + 1)))
        .collect();
    kamera_ops::PatchBasis::new(kf, vf, layers, None).expect("a valid basis")
}

/// A transform-coded patch of a seeded deficit of `n` tokens in `basis`, at `fraction` of the KV.
pub fn coded_patch(
    layout: KvLayout,
    n: usize,
    seed: u64,
    basis: std::sync::Arc<kamera_ops::PatchBasis>,
    entropy: bool,
    fraction: f64,
) -> Patch {
    let d = kamera_ops::Deficit {
        layers: chunk(layout, n, seed, DType::F32)
            .layers()
            .iter()
            .map(|l| (l.k.clone(), l.v.clone()))
            .collect(),
    };
    let kv_bytes = n * layout.n_layers * (layout.k_features() + layout.v_features()) * 2;
    let coding = kamera_ops::BasisCoding { basis, entropy };
    kamera_ops::transform_patch(
        &d,
        &layout,
        kv_bytes,
        &kamera_ops::RankPolicy::Budget { fraction },
        &coding,
    )
    .expect("a coded patch")
}
