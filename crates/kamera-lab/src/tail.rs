//! Mixed-bit factors, simulated (`/t2=F`, `/t3=F`): a byte budget's share F on the 4-bit
//! directions the budget's greedy picks, the rest on further directions with 2-bit (ternary,
//! −1..=1) or 3-bit (−3..=3) codes, an f16 scale per group of 32 as for 4-bit, quantised
//! together with the error-aware refit (kamera-ops `quantise_refit_ranges`). More directions
//! per byte where the deficit's tail is long.
//!
//! The record codec has no such type yet: the quality is measured on the dequantised factors as
//! they would be stored, and the bytes are what a format-v2-like record would hold
//! ([`simulated_bytes`]: the int4 layout plus, per matrix, the head rank and the tail's 2-bit
//! codes; a test checks that with no tail it equals kamera-store's encoding of the int4 patch
//! plus the head ranks).

use kamera_ops::{
    Grain, INT4_GROUP, KvLayout, LayerPatch, Patch, PatchConfig, RankPolicy, Svd, policy_ranks, quantise_refit_ranges,
};

use crate::deficit::ChunkDeficit;
use crate::error::{Error, OpsCtx, Result};

/// The split of a mixed-bit budget (`PatchSpec::tail`, `/t2=F`, `/t3=F`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tail {
    /// Share of the byte budget on the 4-bit directions the budget's greedy picks (1: none
    /// after them, the int4 patch).
    pub head_share: f64,
    /// Bits of each tail code: 2 (codes −1..=1) or 3 (−3..=3).
    pub bits: u8,
}

/// Bytes of the codes and f16 group scales of one factor pair: `head` directions of 4-bit
/// codes and `tail` of `bits`-bit ones over `n` tokens and `f` features (codes packed per
/// matrix and width, P's then Wᵀ's).
fn factor_bytes(n: usize, f: usize, (head, tail): HeadTail, bits: usize) -> usize {
    let m = head + tail;
    let scales = m * (n.div_ceil(INT4_GROUP) + f.div_ceil(INT4_GROUP)) * 2;
    let packed = |codes: usize, b: usize| (codes * b).div_ceil(8);
    packed(n * head, 4) + packed(n * tail, bits) + packed(head * f, 4) + packed(tail * f, bits) + scales
}

/// Bytes of one direction of `bits`-bit codes (an upper bound, as a budget's own
/// per-direction cost).
pub(crate) fn direction_bytes(n: usize, f: usize, bits: usize) -> usize {
    (n * bits).div_ceil(8) + (f * bits).div_ceil(8) + 2 * (n.div_ceil(INT4_GROUP) + f.div_ceil(INT4_GROUP))
}

/// A factor pair's (4-bit, 2-bit) direction counts.
pub(crate) type HeadTail = (usize, usize);

/// Record bytes of a mixed-bit patch: kamera-store's header (80) and checksum (16), per layer
/// the four u32 ranks and spectrum lengths (16) and two u16 head ranks (4), the factors, and
/// the kept singular values (f32 each).
pub(crate) fn simulated_bytes(layout: &KvLayout, n: usize, ranks: &[(HeadTail, HeadTail)], bits: usize) -> usize {
    let (kf, vf) = (layout.k_features(), layout.v_features());
    80 + 16
        + ranks
            .iter()
            .map(|&(k, v)| {
                20 + factor_bytes(n, kf, k, bits) + factor_bytes(n, vf, v, bits) + 4 * (k.0 + k.1 + v.0 + v.1)
            })
            .sum::<usize>()
}

/// The mixed-bit patch of one chunk and its simulated record bytes. `cfg` holds the budget
/// (`Budget` or `BudgetGains`, its gains already set) with 4-bit codes; `tail.head_share` of
/// its bytes go to the 4-bit directions it picks, the rest (with what the head leaves unspent,
/// unless the share is 1) to `tail.bits`-bit directions after them, greedily by gain · σ² per
/// byte.
pub(crate) fn tail_patch(deficit: &ChunkDeficit, cfg: &PatchConfig, tail: Tail) -> Result<(Patch, usize)> {
    let (svds, weights, n, layout, kv_bytes) = deficit.parts();
    let (head_share, bits) = (tail.head_share, tail.bits as usize);
    let invalid = |detail: String| Error::Invalid {
        op: "mixed-bit patch",
        detail,
    };
    let (fraction, gains) = match &cfg.rank {
        RankPolicy::Budget { fraction } => (*fraction, vec![(1.0, 1.0); svds.len()]),
        RankPolicy::BudgetGains { fraction, gains } => (*fraction, gains.clone()),
        other => return Err(invalid(format!("/t2 needs a byte budget, not {other:?}"))),
    };
    let head_cfg = PatchConfig {
        rank: match &cfg.rank {
            RankPolicy::BudgetGains { gains, .. } => RankPolicy::BudgetGains {
                fraction: fraction * head_share,
                gains: gains.clone(),
            },
            _ => RankPolicy::Budget {
                fraction: fraction * head_share,
            },
        },
        ..cfg.clone()
    };
    let head = policy_ranks(svds, n, layout, kv_bytes, &head_cfg).ops("head ranks")?;
    let (kf, vf) = (layout.k_features(), layout.v_features());
    let used: usize = head
        .iter()
        .map(|&(rk, rv)| factor_bytes(n, kf, (rk, 0), bits) + factor_bytes(n, vf, (rv, 0), bits))
        .sum();
    let mut left = if head_share >= 1.0 {
        0
    } else {
        (fraction * kv_bytes as f64) as i64 - used as i64
    };
    // Tail candidates: (gain per byte, layer, K or V); within a matrix σ falls, so the sorted
    // order takes each matrix's directions in order.
    let mut cand = Vec::new();
    for (l, ((sk, sv), &(rk, rv))) in svds.iter().zip(&head).enumerate() {
        for (ch, (s, r, f, g)) in [(sk, rk, kf, gains[l].0), (sv, rv, vf, gains[l].1)]
            .into_iter()
            .enumerate()
        {
            let cost = direction_bytes(n, f, bits) as f64;
            for &x in s.singular.iter().skip(r) {
                let e = g * (x as f64) * (x as f64);
                if e > 0.0 {
                    cand.push((e / cost, l, ch));
                }
            }
        }
    }
    cand.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut tails = vec![(0usize, 0usize); svds.len()];
    for (_, l, ch) in cand {
        let cost = direction_bytes(n, if ch == 0 { kf } else { vf }, bits) as i64;
        if cost > left {
            continue;
        }
        left -= cost;
        if ch == 0 {
            tails[l].0 += 1;
        } else {
            tails[l].1 += 1;
        }
    }
    let mut layers = Vec::with_capacity(svds.len());
    let mut ranks = Vec::with_capacity(svds.len());
    for (l, ((sk, sv), (&(hk, hv), &(tk, tv)))) in svds.iter().zip(head.iter().zip(&tails)).enumerate() {
        let w = weights.map(|w| &w.layers[l]);
        let q = |s: &Svd, h: usize, t: usize, ch: usize| -> Result<kamera_ops::LowRank> {
            let lr = s.truncate(h + t, cfg.dtype).ops("truncate")?;
            if h + t == 0 {
                return Ok(lr);
            }
            let low = if bits == 2 { 1.0 } else { 3.0 };
            let max: Vec<f32> = (0..h + t).map(|j| if j < h { 7.0 } else { low }).collect();
            let mw = w.map(|(k, v)| if ch == 0 { k } else { v });
            let rows = mw.and_then(|m| m.rows.as_deref());
            let cols = mw.and_then(|m| m.cols.as_deref());
            let out = quantise_refit_ranges(&lr, [Grain::Group; 2], &max, rows, cols).ops("mixed-bit quantise")?;
            out.map(|(lr, _)| lr)
                .ok_or_else(|| invalid(format!("layer {l}: the refit is not finite")))
        };
        layers.push(LayerPatch {
            k: q(sk, hk, tk, 0)?,
            v: q(sv, hv, tv, 1)?,
        });
        ranks.push(((hk, tk), (hv, tv)));
    }
    let patch = Patch::new(*layout, n, layers).ops("mixed-bit patch")?.compact_spectra();
    Ok((patch, simulated_bytes(layout, n, &ranks, bits)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kamera_ops::{Mat, Quant};
    use kamera_store::{ChunkId, Key, ModelFp, Record, codec};

    #[test]
    fn without_tail_the_bytes_are_the_int4_records_plus_head_ranks() {
        let layout = KvLayout::gqa(2, 2, 1, 16);
        let n = 40;
        let mut rng = kamera_eval::Rng::new(3);
        let mut mat = |r: usize, c: usize| {
            Mat::from_f32(
                r,
                c,
                (0..r * c).map(|_| (rng.below(1000) as f32 / 1000.0) - 0.5).collect(),
            )
            .unwrap()
        };
        let svds: Vec<(Svd, Svd)> = (0..2)
            .map(|_| (Svd::compute(&mat(n, 16)).unwrap(), Svd::compute(&mat(n, 16)).unwrap()))
            .collect();
        let cfg = PatchConfig {
            rank: RankPolicy::PerLayerKv(vec![(3, 5), (0, 7)]),
            quant: Quant::Int4,
            refit: true,
            ..PatchConfig::fixed(0, kamera_ops::DType::Bf16)
        };
        let p = kamera_ops::patch_from_weighted_svds(&svds, None, n, &layout, 1000, &cfg)
            .unwrap()
            .compact_spectra();
        let m = ModelFp::of("t");
        let key = Key::patch(m, ChunkId::of(b"c", "t", m), &[], 0);
        let stored = codec::encode(&key, &Record::patch(m, 0, p), None).unwrap().len();
        let ranks = [((3, 0), (5, 0)), ((0, 0), (7, 0))];
        assert_eq!(simulated_bytes(&layout, n, &ranks, 2), stored + 4 * 2);
        assert_eq!(simulated_bytes(&layout, n, &ranks, 3), stored + 4 * 2);
        // A 2-bit direction over 40 tokens and 16 features: 10 + 4 code bytes, 2 + 1 f16 scales.
        assert_eq!(direction_bytes(n, 16, 2), 14 + 6);
    }
}
