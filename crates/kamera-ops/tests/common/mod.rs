//! Shared helpers for kamera-ops tests: deterministic random chunks and tolerance checks.
#![allow(dead_code)]

use kamera_ops::{Attention, ChunkKv, DType, KvLayout, LayerKv, Mat, PairLayout, RopeSpec};

/// SplitMix64 → uniform in [-1, 1).
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// A random chunk of `n` tokens at `offset`, stored as `dtype`.
pub fn chunk(layout: KvLayout, n: usize, offset: i64, seed: u64, dtype: DType) -> ChunkKv {
    let mut rng = Rng(seed);
    let layers = (0..layout.n_layers)
        .map(|_| LayerKv {
            k: Mat::from_f32(n, layout.k_features(), rng.vec(n * layout.k_features()))
                .unwrap()
                .to_dtype(dtype),
            v: Mat::from_f32(n, layout.v_features(), rng.vec(n * layout.v_features()))
                .unwrap()
                .to_dtype(dtype),
        })
        .collect();
    ChunkKv::new(layout, offset, layers).unwrap()
}

/// Keys as a model writes them: raw keys rotated to positions offset..offset+n.
pub fn prefilled(layout: KvLayout, rope: &RopeSpec, n: usize, offset: i64, seed: u64) -> ChunkKv {
    let raw = chunk(layout, n, offset, seed, DType::F32);
    let (heads, _) = layout.rope_heads();
    let positions: Vec<i64> = (0..n as i64).map(|t| offset + t).collect();
    let layers = raw
        .layers()
        .iter()
        .enumerate()
        .map(|(l, kv)| {
            let mut k = kv.k.to_f32_vec();
            rope.apply(l, &mut k, heads, &positions).unwrap();
            LayerKv {
                k: Mat::from_f32(n, layout.k_features(), k).unwrap(),
                v: kv.v.clone(),
            }
        })
        .collect();
    ChunkKv::new(layout, offset, layers).unwrap()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Max |a − b| over every K and V of two chunks (of the same shape).
pub fn chunk_diff(a: &ChunkKv, b: &ChunkKv) -> f32 {
    a.max_abs_diff(b).expect("chunks of the same shape")
}

/// The RoPE flavours the operator must handle, with a matching layout.
pub fn flavours(n_layers: usize) -> Vec<(&'static str, KvLayout, RopeSpec)> {
    vec![
        (
            "interleaved-gqa",
            KvLayout::gqa(n_layers, 6, 2, 16),
            RopeSpec::new(16, 1e5, PairLayout::Interleaved),
        ),
        (
            "half-split-mha",
            KvLayout::mha(n_layers, 3, 16),
            RopeSpec::new(16, 1e4, PairLayout::HalfSplit),
        ),
        (
            "partial-half-split",
            KvLayout::gqa(n_layers, 4, 1, 32),
            RopeSpec::new(32, 1e4, PairLayout::HalfSplit).with_rotary_dims(16),
        ),
        (
            "per-layer-base",
            KvLayout::gqa(n_layers, 4, 1, 16),
            RopeSpec::new(16, 1e4, PairLayout::HalfSplit)
                .with_layer_bases((0..n_layers).map(|l| if l % 2 == 0 { 1e4 } else { 1e6 }).collect()),
        ),
        (
            "mrope",
            KvLayout::gqa(n_layers, 4, 2, 16),
            RopeSpec::new(16, 1e6, PairLayout::HalfSplit).with_mrope([2, 3, 3]),
        ),
        (
            "mla",
            KvLayout {
                attention: Attention::Mla {
                    heads: 4,
                    latent_dim: 24,
                    rope_dim: 8,
                },
                head_dim: 8,
                v_head_dim: 24,
                n_layers,
            },
            RopeSpec::new(8, 1e4, PairLayout::Interleaved),
        ),
    ]
}
