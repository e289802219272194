//! Attention-aware weights of a patch factorisation. What a patch must get right is not the KV
//! deficit itself but what attention reads from it: for K the logits q·k of the queries that will
//! read the chunk, for V the attention-weighted sum Σ_t a_t v_t. Both errors are quadratic forms
//! of the deficit's error; their separable (diagonal) parts are per-token row weights and
//! per-feature column weights, under which [`crate::Svd::compute_weighted`] is the exact optimum.
//!
//! - K columns: the second moment of the queries of each kv head (its group's query heads summed)
//!   per dim, averaged over each RoPE pair: a relocation rotates every pair by an angle unknown at
//!   formation time, and the rotation-averaged 2 x 2 second moment of a pair is its mean diagonal.
//! - Rows (K and V): the attention each token receives (Σ a, or Σ a² for the error of Σ_t a_t e_t
//!   under independent token errors), summed over the kv head's query heads and over kv heads.

use crate::error::{Result, invalid, shape};
use crate::layout::{Attention, KvLayout};
use crate::rope::{PairLayout, RopeSpec};

/// Separable importance of the squared error of one tokens x features matrix (`None`: all 1).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatWeights {
    pub rows: Option<Vec<f32>>,
    pub cols: Option<Vec<f32>>,
}

impl MatWeights {
    /// No weighting: the plain SVD.
    pub fn none() -> MatWeights {
        MatWeights::default()
    }
    pub fn is_none(&self) -> bool {
        self.rows.is_none() && self.cols.is_none()
    }
}

/// Per layer, the (K, V) weights of a chunk's patch factorisation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PatchWeights {
    pub layers: Vec<(MatWeights, MatWeights)>,
}

/// `w` scaled to mean 1 and floored at `floor` (relative to that mean), so that every weight is
/// positive (a factor is divided by its square root) and the weighted spectra of different
/// matrices stay on the scale of their plain ones (what a byte budget across layers compares).
pub fn normalise_weights(w: &[f32], floor: f32) -> Result<Vec<f32>> {
    const OP: &str = "normalise_weights";
    if !(floor.is_finite() && floor > 0.0) {
        return Err(invalid(OP, "floor", format!("{floor} (finite and > 0 expected)")));
    }
    if let Some(i) = w.iter().position(|x| !(x.is_finite() && *x >= 0.0)) {
        return Err(invalid(OP, "weights", format!("weight {i} is {} (finite, >= 0)", w[i])));
    }
    let mean = w.iter().map(|&x| x as f64).sum::<f64>() / w.len().max(1) as f64;
    if mean <= 0.0 {
        return Ok(vec![1.0; w.len()]);
    }
    Ok(w.iter().map(|&x| ((x as f64 / mean) as f32).max(floor)).collect())
}

/// Per key feature (`kv_heads · head_dim`), the queries' second moment: `q_sq` holds Σ q² per
/// query head and dim (`heads · head_dim`, post RoPE); each kv head sums its group's query heads
/// and each rotary pair gets the mean of its two dims (dims past `rotary_dims` keep their own).
pub fn key_feature_weights(layout: &KvLayout, rope: &RopeSpec, q_sq: &[f32]) -> Result<Vec<f32>> {
    const OP: &str = "key_feature_weights";
    if matches!(layout.attention, Attention::Mla { .. }) {
        return Err(invalid(
            OP,
            "layout",
            "MLA keys are a shared latent; query weights need MHA or GQA",
        ));
    }
    let (heads, kvh, hd) = (layout.heads(), layout.kv_heads(), layout.head_dim);
    if q_sq.len() != heads * hd {
        return Err(shape(
            OP,
            "query second moments (heads x head_dim)",
            heads * hd,
            q_sq.len(),
        ));
    }
    if rope.head_dim != hd || rope.rotary_dims > hd || rope.rotary_dims % 2 != 0 {
        return Err(invalid(
            OP,
            "rope",
            format!(
                "head_dim {} / rotary_dims {} against the layout's head_dim {hd}",
                rope.head_dim, rope.rotary_dims
            ),
        ));
    }
    let g = heads / kvh.max(1);
    let mut out = vec![0f32; kvh * hd];
    for (qh, row) in q_sq.chunks(hd).enumerate() {
        let h = qh / g.max(1);
        for (o, &x) in out[h * hd..(h + 1) * hd].iter_mut().zip(row) {
            *o += x;
        }
    }
    let rd = rope.rotary_dims;
    for head in out.chunks_mut(hd) {
        for i in 0..rd / 2 {
            let (a, b) = match rope.layout {
                PairLayout::Interleaved => (2 * i, 2 * i + 1),
                PairLayout::HalfSplit => (i, i + rd / 2),
            };
            let m = 0.5 * (head[a] + head[b]);
            head[a] = m;
            head[b] = m;
        }
    }
    Ok(out)
}

/// Per value feature (`kv_heads · v_head_dim`), how much an error there moves the layer's
/// output: `wo_sq` holds per query head and dim (`heads · v_head_dim`) the squared norm of the
/// output projection's column it feeds; each kv head sums its group's query heads.
pub fn value_feature_weights(layout: &KvLayout, wo_sq: &[f32]) -> Result<Vec<f32>> {
    const OP: &str = "value_feature_weights";
    if matches!(layout.attention, Attention::Mla { .. }) {
        return Err(invalid(
            OP,
            "layout",
            "MLA values are a shared latent; output weights need MHA or GQA",
        ));
    }
    let (heads, kvh, hd) = (layout.heads(), layout.kv_heads(), layout.v_head_dim);
    if wo_sq.len() != heads * hd {
        return Err(shape(
            OP,
            "output column norms (heads x v_head_dim)",
            heads * hd,
            wo_sq.len(),
        ));
    }
    let g = heads / kvh.max(1);
    let mut out = vec![0f32; kvh * hd];
    for (qh, row) in wo_sq.chunks(hd).enumerate() {
        let h = qh / g.max(1);
        for (o, &x) in out[h * hd..(h + 1) * hd].iter_mut().zip(row) {
            *o += x;
        }
    }
    Ok(out)
}

/// Per token, the attention it receives summed over kv heads: `mass` is `[tokens, kv_heads]`.
pub fn token_weights(mass: &[f32], kv_heads: usize) -> Result<Vec<f32>> {
    if kv_heads == 0 || mass.len() % kv_heads != 0 {
        return Err(shape(
            "token_weights",
            "attention mass (tokens x kv heads)",
            "a multiple of kv heads",
            mass.len(),
        ));
    }
    Ok(mass.chunks(kv_heads).map(|r| r.iter().sum()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Svd;
    use crate::tensor::Mat;
    use proptest::prelude::*;

    fn mat(rows: usize, cols: usize, seed: u64) -> Mat {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let v = (0..rows * cols)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect();
        Mat::from_f32(rows, cols, v).unwrap()
    }

    fn weighted_err(m: &Mat, lr: &crate::LowRank, r: &[f32], c: &[f32]) -> f64 {
        let (d, x) = (m.to_f32_vec(), lr.dense());
        let cols = m.cols();
        d.iter()
            .zip(&x)
            .enumerate()
            .map(|(i, (a, b))| r[i / cols] as f64 * c[i % cols] as f64 * ((a - b) as f64).powi(2))
            .sum()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// With unit weights the weighted factorisation is the plain SVD; with weights it is the
        /// weighted optimum: its weighted error equals its weighted tail energy and is never above
        /// the plain truncation's weighted error.
        #[test]
        fn weighted_svd_is_the_weighted_optimum(seed in 0u64..1000, rows in 4usize..24, cols in 4usize..16, m in 1usize..4) {
            let a = mat(rows, cols, seed);
            let plain = Svd::compute(&a).unwrap();
            let ones = MatWeights { rows: Some(vec![1.0; rows]), cols: Some(vec![1.0; cols]) };
            let unit = Svd::compute_weighted(&a, &ones).unwrap();
            for (x, y) in plain.singular.iter().zip(&unit.singular) {
                prop_assert!((x - y).abs() < 1e-4);
            }
            let (p, u) = (plain.truncate(m, crate::DType::F32).unwrap(), unit.truncate(m, crate::DType::F32).unwrap());
            for (x, y) in p.dense().iter().zip(u.dense()) {
                prop_assert!((x - y).abs() < 1e-4);
            }
            let r: Vec<f32> = (0..rows).map(|i| 0.05 + ((i as u64 * 7 + seed) % 11) as f32).collect();
            let c: Vec<f32> = (0..cols).map(|j| 0.1 + ((j as u64 * 5 + seed) % 7) as f32 * 3.0).collect();
            let w = MatWeights { rows: Some(r.clone()), cols: Some(c.clone()) };
            let ws = Svd::compute_weighted(&a, &w).unwrap();
            let wl = ws.truncate(m, crate::DType::F32).unwrap();
            let (ew, ep) = (weighted_err(&a, &wl, &r, &c), weighted_err(&a, &p, &r, &c));
            let tail = ws.tail_energy(m);
            prop_assert!((ew - tail).abs() <= 1e-3 * tail.max(1e-3), "error {ew} vs tail {tail}");
            prop_assert!(ew <= ep * (1.0 + 1e-4) + 1e-6, "weighted {ew} > plain {ep}");
            // Full rank reproduces the matrix whatever the weights.
            let full = ws.truncate(rows.min(cols), crate::DType::F32).unwrap();
            for (x, y) in full.dense().iter().zip(a.to_f32_vec()) {
                prop_assert!((x - y).abs() < 1e-3);
            }
        }
    }

    #[test]
    fn key_weights_sum_groups_and_average_rope_pairs() {
        let layout = KvLayout::gqa(1, 4, 2, 4);
        let q: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let half = RopeSpec::new(4, 10_000.0, PairLayout::HalfSplit);
        // kv head 0 = query heads 0, 1: dims [0+4, 1+5, 2+6, 3+7] = [4, 6, 8, 10]; pairs (0,2), (1,3).
        let w = key_feature_weights(&layout, &half, &q).unwrap();
        assert_eq!(&w[..4], &[6.0, 8.0, 6.0, 8.0]);
        let inter = RopeSpec::new(4, 10_000.0, PairLayout::Interleaved);
        let w = key_feature_weights(&layout, &inter, &q).unwrap();
        assert_eq!(&w[..4], &[5.0, 5.0, 9.0, 9.0]);
        assert!(key_feature_weights(&layout, &half, &q[..8]).is_err());
        assert_eq!(
            &value_feature_weights(&layout, &q).unwrap()[4..],
            &[20.0, 22.0, 24.0, 26.0]
        );
        let n = normalise_weights(&[0.0, 1.0, 3.0], 0.1).unwrap();
        assert_eq!(n, vec![0.1, 0.75, 2.25]);
        assert!(normalise_weights(&[1.0, f32::NAN], 0.1).is_err());
        assert_eq!(token_weights(&[1.0, 2.0, 3.0, 4.0], 2).unwrap(), vec![3.0, 7.0]);
        let bad = MatWeights {
            rows: Some(vec![0.0; 3]),
            cols: None,
        };
        assert!(Svd::compute_weighted(&mat(3, 2, 1), &bad).is_err());
    }
}
