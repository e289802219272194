//! Rank policies: how many directions each layer's K and V patch keeps, from a fixed rank, an
//! energy share or a byte budget spent greedily by singular energy (optionally weighed per
//! layer), with negligible layers dropped.

use super::{PatchConfig, RankPolicy};
use crate::error::{Result, invalid, shape};
use crate::layout::KvLayout;
use crate::svd::Svd;

/// Per layer, the (K, V) ranks `cfg` picks from these spectra (its rank policy, then its dropped
/// layers), as [`patch_from_svds`] truncates them.
pub fn policy_ranks(
    svds: &[(Svd, Svd)],
    n: usize,
    layout: &KvLayout,
    kv_bytes: usize,
    cfg: &PatchConfig,
) -> Result<Vec<(usize, usize)>> {
    const OP: &str = "patch_from_svds";
    if svds.len() != layout.n_layers {
        return Err(shape(OP, "deficit layers", layout.n_layers, svds.len()));
    }
    let ranks: Vec<(usize, usize)> = match &cfg.rank {
        RankPolicy::Fixed(m) => vec![(*m, *m); layout.n_layers],
        RankPolicy::PerLayerKv(rs) if rs.len() == layout.n_layers => rs.clone(),
        RankPolicy::PerLayerKv(rs) => return Err(shape(OP, "per-layer (K, V) ranks", layout.n_layers, rs.len())),
        RankPolicy::PerLayer(rs) if rs.len() == layout.n_layers => rs.iter().map(|&m| (m, m)).collect(),
        RankPolicy::PerLayer(rs) => return Err(shape(OP, "per-layer ranks", layout.n_layers, rs.len())),
        RankPolicy::Budget { fraction }
        | RankPolicy::BudgetShare { fraction }
        | RankPolicy::BudgetGains { fraction, .. } => {
            check_share(OP, "budget fraction", *fraction)?;
            let budget = ((*fraction * kv_bytes as f64).floor() as usize).saturating_sub(cfg.layer_bytes(layout));
            let gain = match &cfg.rank {
                RankPolicy::BudgetShare { .. } => Gain::Share,
                RankPolicy::BudgetGains { gains, .. } => {
                    if gains.len() != layout.n_layers {
                        return Err(shape(OP, "per-layer gains", layout.n_layers, gains.len()));
                    }
                    for &(k, v) in gains {
                        check_share(OP, "layer gain", k)?;
                        check_share(OP, "layer gain", v)?;
                    }
                    Gain::Layers(gains)
                }
                _ => Gain::Energy,
            };
            let cost = [
                cfg.direction_bytes(n, layout.k_features()),
                cfg.direction_bytes(n, layout.v_features()),
            ];
            budget_ranks(svds, cost, [budget, budget], true, gain)
        }
        RankPolicy::BudgetKv { k, v } => {
            check_share(OP, "K budget fraction", *k)?;
            check_share(OP, "V budget fraction", *v)?;
            let b =
                |f: f64| ((f * kv_bytes as f64).floor() as usize).saturating_sub(cfg.layer_bytes(layout).div_ceil(2));
            let cost = [
                cfg.direction_bytes(n, layout.k_features()),
                cfg.direction_bytes(n, layout.v_features()),
            ];
            budget_ranks(svds, cost, [b(*k), b(*v)], false, Gain::Energy)
        }
        RankPolicy::Energy { k, v } => {
            check_share(OP, "K energy share", *k)?;
            check_share(OP, "V energy share", *v)?;
            svds.iter()
                .map(|(sk, sv)| (energy_rank(sk, *k), energy_rank(sv, *v)))
                .collect()
        }
    };
    check_share(OP, "drop_below", cfg.drop_below)?;
    Ok(drop_negligible(svds, ranks, cfg.drop_below))
}

fn check_share(op: &'static str, what: &'static str, x: f64) -> Result<()> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(invalid(op, what, format!("{x} must be finite and >= 0")))
    }
}

/// The smallest rank whose directions hold `share` of the matrix's energy.
fn energy_rank(s: &Svd, share: f64) -> usize {
    let total = s.tail_energy(0);
    if total <= 0.0 || share <= 0.0 {
        return 0;
    }
    let mut acc = 0.0;
    for (j, &x) in s.singular.iter().enumerate() {
        acc += (x as f64) * (x as f64);
        if acc >= share.min(1.0) * total * (1.0 - 1e-12) {
            return j + 1;
        }
    }
    s.max_rank()
}

/// Rank 0 for the (layer, K/V) matrices holding less than `below` of their channel's deficit
/// energy summed over layers.
fn drop_negligible(svds: &[(Svd, Svd)], mut ranks: Vec<(usize, usize)>, below: f64) -> Vec<(usize, usize)> {
    if below <= 0.0 {
        return ranks;
    }
    let total_k: f64 = svds.iter().map(|(k, _)| k.tail_energy(0)).sum();
    let total_v: f64 = svds.iter().map(|(_, v)| v.tail_energy(0)).sum();
    for ((sk, sv), r) in svds.iter().zip(ranks.iter_mut()) {
        if sk.tail_energy(0) < below * total_k {
            r.0 = 0;
        }
        if sv.tail_energy(0) < below * total_v {
            r.1 = 0;
        }
    }
    ranks
}

/// What a direction's σ² is multiplied by in the greedy budget.
enum Gain<'a> {
    /// 1: σ² as it is.
    Energy,
    /// 1/‖Δ‖² of its own matrix (its energy share).
    Share,
    /// Its layer's (K, V) gain.
    Layers(&'a [(f64, f64)]),
}

/// Greedy knapsack over directions: highest gain per byte first, the gain being σ² times a
/// [`Gain`]. Within one matrix the cost per direction is constant and the gain descends, so
/// every matrix keeps a prefix of its directions. With `joint` K and V share `budget[0]`;
/// otherwise K spends `budget[0]` and V `budget[1]`.
fn budget_ranks(
    svds: &[(Svd, Svd)],
    cost: [usize; 2],
    budget: [usize; 2],
    joint: bool,
    gain: Gain<'_>,
) -> Vec<(usize, usize)> {
    let mut items: Vec<(f64, usize, usize, usize)> = Vec::new();
    for (l, (sk, sv)) in svds.iter().enumerate() {
        for (ch, s) in [sk, sv].into_iter().enumerate() {
            let g = match &gain {
                Gain::Energy => 1.0,
                Gain::Share => 1.0 / s.tail_energy(0),
                Gain::Layers(gs) => [gs[l].0, gs[l].1][ch],
            };
            if !(g.is_finite() && g > 0.0) {
                continue;
            }
            for (j, &x) in s.singular.iter().enumerate() {
                items.push(((x as f64).powi(2) * g / cost[ch] as f64, l, ch, j));
            }
        }
    }
    items.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.3.cmp(&b.3)));
    let mut ranks = vec![(0usize, 0usize); svds.len()];
    let mut used = [0usize; 2];
    for (gain, l, ch, j) in items {
        let r = if ch == 0 { &mut ranks[l].0 } else { &mut ranks[l].1 };
        let pot = if joint { 0 } else { ch };
        if gain > 0.0 && *r == j && used[pot] + cost[ch] <= budget[pot] {
            *r += 1;
            used[pot] += cost[ch];
        }
    }
    ranks
}
