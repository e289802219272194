//! Mixed storage per matrix, simulated (`/m8=N`, `/d8=N`, `/d4=N`): the N (layer, K/V) matrices
//! the layer-sensitivity table ranks highest keep int8 factors (`m8`) or their whole deficit as
//! a dense int8 / int4 matrix (`d8`, `d4`), every other int4 factors, within one greedy byte
//! budget that prices each direction at its own matrix's bytes (dense matrices first).
//!
//! Codes carry an f16 scale per group of 32 either way; factors are quantised with the
//! error-aware refit (kamera-ops `quantise_refit_ranges`, ±127 or ±7). Bytes are those of a
//! v2-like record ([`crate::tail::simulated_bytes`]: per matrix a 4-bit and an 8-bit rank, one
//! form byte per layer, a dense matrix's codes and scales).

use kamera_ops::{Grain, INT4_GROUP, KvLayout, LayerPatch, LowRank, Mat, Patch, PatchConfig, Quant, RankPolicy, Svd};

use crate::deficit::ChunkDeficit;
use crate::error::{Error, OpsCtx, Result};
use crate::tail::{HeadTail, direction_bytes, simulated_bytes};

/// How the chosen matrices are stored ([`crate::PatchSpec::mixed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Factors with int8 codes (`m8`).
    Int8Factors,
    /// The deficit itself, tokens x features, int8 codes (`d8`).
    Dense8,
    /// The deficit itself, int4 codes (`d4`).
    Dense4,
    /// Dense int4 matrices where the budget itself finds them worth their bytes (`da4`, no
    /// count): see [`auto_dense`].
    DenseAuto4,
}

impl Form {
    pub(crate) fn letters(self) -> &'static str {
        match self {
            Form::Int8Factors => "m8",
            Form::Dense8 => "d8",
            Form::Dense4 => "d4",
            Form::DenseAuto4 => "da4",
        }
    }
    /// Whether the budget picks the matrices (no count).
    pub(crate) fn auto(self) -> bool {
        self == Form::DenseAuto4
    }
    pub(crate) fn parse(s: &str) -> Option<Form> {
        [Form::Int8Factors, Form::Dense8, Form::Dense4, Form::DenseAuto4]
            .into_iter()
            .find(|f| f.letters() == s)
    }
    fn dense_bits(self) -> Option<usize> {
        match self {
            Form::Int8Factors => None,
            Form::Dense8 => Some(8),
            Form::Dense4 | Form::DenseAuto4 => Some(4),
        }
    }
}

/// Bytes of a dense `bits`-bit matrix of `n` tokens x `f` features: the codes and an f16 scale
/// per group of 32 tokens of each feature.
pub(crate) fn dense_bytes(n: usize, f: usize, bits: usize) -> usize {
    (n * f * bits).div_ceil(8) + 2 * f * n.div_ceil(INT4_GROUP)
}

/// The deficit behind `s`, whole, quantised to `bits`-bit codes with an f16 scale per group of 32
/// tokens of each feature; as factors P = the codes' values, Wᵀ = the identity (not stored).
fn dense(s: &Svd, bits: usize) -> Result<LowRank> {
    let full = s.truncate(s.max_rank(), kamera_ops::DType::F32).ops("truncate")?;
    let f = full.wt.cols();
    let n = full.p.rows();
    let eye: Vec<f32> = (0..f * f).map(|i| if i % (f + 1) == 0 { 1.0 } else { 0.0 }).collect();
    let lr = LowRank {
        p: Mat::from_f32(n, f, full.dense()).ops("dense deficit")?,
        wt: Mat::from_f32(f, f, eye).ops("identity")?,
        spectrum: full.spectrum.clone(),
    };
    let q = if bits == 8 { Quant::Int8 } else { Quant::Int4 };
    let (mut out, _) = kamera_ops::quantise_grains(&lr, q, [Grain::Group; 2]).ops("dense quantise")?;
    out.wt = lr.wt;
    Ok(out)
}

/// Per layer, whether K and V get the special form: the `count` matrices with the largest
/// sensitivities (ties to the lower layer, K before V).
pub(crate) fn widest(sens: &[(f64, f64)], count: usize) -> Vec<(bool, bool)> {
    let mut all: Vec<(f64, usize, usize)> = sens
        .iter()
        .enumerate()
        .flat_map(|(l, &(k, v))| [(k, l, 0), (v, l, 1)])
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut out = vec![(false, false); sens.len()];
    for &(_, l, ch) in all.iter().take(count) {
        if ch == 0 {
            out[l].0 = true;
        } else {
            out[l].1 = true;
        }
    }
    out
}

/// Bits of a factor matrix's codes.
fn bits(wide: bool) -> usize {
    if wide { 8 } else { 4 }
}

/// Per layer, the (K, V) ranks of a greedy budget whose directions cost their own matrix's
/// bytes (8-bit where `wide`), the gain of each being σ² times its layer's (K, V) gain; a
/// matrix with gain 0 gets none.
pub(crate) fn mixed_ranks(
    svds: &[(Svd, Svd)],
    gains: &[(f64, f64)],
    wide: &[(bool, bool)],
    n: usize,
    layout: &KvLayout,
    budget: usize,
) -> Vec<(usize, usize)> {
    let f = [layout.k_features(), layout.v_features()];
    let mut items: Vec<(f64, usize, usize, usize, usize)> = Vec::new();
    for (l, (sk, sv)) in svds.iter().enumerate() {
        for (ch, s) in [sk, sv].into_iter().enumerate() {
            let g = [gains[l].0, gains[l].1][ch];
            let w = [wide[l].0, wide[l].1][ch];
            let cost = direction_bytes(n, f[ch], bits(w));
            if !(g.is_finite() && g > 0.0) {
                continue;
            }
            for (j, &x) in s.singular.iter().enumerate() {
                items.push(((x as f64).powi(2) * g / cost as f64, l, ch, j, cost));
            }
        }
    }
    items.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.3.cmp(&b.3)));
    let mut ranks = vec![(0usize, 0usize); svds.len()];
    let mut used = 0;
    for (gain, l, ch, j, cost) in items {
        let r = if ch == 0 { &mut ranks[l].0 } else { &mut ranks[l].1 };
        if gain > 0.0 && *r == j && used + cost <= budget {
            *r += 1;
            used += cost;
        }
    }
    ranks
}

/// The matrices a greedy budget stores dense (`bits`-bit codes): starting from factors
/// everywhere, repeatedly the matrix whose dense form gains most over its factors at the
/// budget's marginal price λ (the lowest gain per byte the greedy bought): gain
/// g · (‖Δ‖² − the energy its factors hold) − λ · (dense bytes − its factors' bytes), if > 0
/// and affordable; then the greedy is rerun on what is left.
pub(crate) fn auto_dense(
    svds: &[(Svd, Svd)],
    gains: &[(f64, f64)],
    n: usize,
    layout: &KvLayout,
    budget: usize,
    bits: usize,
) -> Vec<(bool, bool)> {
    let f = [layout.k_features(), layout.v_features()];
    let dir = [direction_bytes(n, f[0], 4), direction_bytes(n, f[1], 4)];
    let mut on = vec![(false, false); svds.len()];
    let narrow = vec![(false, false); svds.len()];
    loop {
        let mut g = gains.to_vec();
        let mut left = budget;
        for (l, &(ck, cv)) in on.iter().enumerate() {
            for (ch, c) in [ck, cv].into_iter().enumerate() {
                if c {
                    if ch == 0 {
                        g[l].0 = 0.0
                    } else {
                        g[l].1 = 0.0
                    }
                    left = left.saturating_sub(dense_bytes(n, f[ch], bits));
                }
            }
        }
        let ranks = mixed_ranks(svds, &g, &narrow, n, layout, left);
        let at = |l: usize, ch: usize| {
            let s = if ch == 0 { &svds[l].0 } else { &svds[l].1 };
            let gain = if ch == 0 { g[l].0 } else { g[l].1 };
            let r = if ch == 0 { ranks[l].0 } else { ranks[l].1 };
            (s, gain, r)
        };
        let mut lambda = f64::INFINITY;
        let mut spent = 0;
        for l in 0..svds.len() {
            for ch in 0..2 {
                let (s, gain, r) = at(l, ch);
                if r > 0 {
                    lambda = lambda.min(gain * (s.singular[r - 1] as f64).powi(2) / dir[ch] as f64);
                    spent += r * dir[ch];
                }
            }
        }
        if !lambda.is_finite() {
            lambda = 0.0;
        }
        let mut best: Option<(f64, usize, usize)> = None;
        for l in 0..svds.len() {
            for ch in 0..2 {
                let (s, gain, r) = at(l, ch);
                let (held, cost) = (r * dir[ch], dense_bytes(n, f[ch], bits));
                if gain <= 0.0 || s.tail_energy(0) <= 0.0 || cost > left - spent + held {
                    continue;
                }
                let value = gain * s.tail_energy(r) - lambda * (cost as f64 - held as f64);
                if value > 0.0 && best.is_none_or(|b| value > b.0) {
                    best = Some((value, l, ch));
                }
            }
        }
        match best {
            Some((_, l, 0)) => on[l].0 = true,
            Some((_, l, _)) => on[l].1 = true,
            None => return on,
        }
    }
}

/// The mixed patch of one chunk and its simulated record bytes. `cfg` holds the byte budget
/// (`Budget` or `BudgetGains`, its gains already set); `chosen` marks the matrices stored as
/// `form`, the rest get int4 factors (ignored for [`Form::DenseAuto4`], whose budget picks them).
pub(crate) fn mixed_patch(
    deficit: &ChunkDeficit,
    cfg: &PatchConfig,
    (form, chosen): (Form, &[(bool, bool)]),
) -> Result<(Patch, usize)> {
    let (svds, weights, n, layout, kv_bytes) = deficit.parts();
    let invalid = |detail: String| Error::Invalid {
        op: "mixed patch",
        detail,
    };
    let (fraction, mut gains) = match &cfg.rank {
        RankPolicy::Budget { fraction } => (*fraction, vec![(1.0, 1.0); svds.len()]),
        RankPolicy::BudgetGains { fraction, gains } => (*fraction, gains.clone()),
        other => {
            return Err(invalid(format!(
                "/{} needs a byte budget, not {other:?}",
                form.letters()
            )));
        }
    };
    if chosen.len() != svds.len() || gains.len() != svds.len() {
        return Err(invalid(format!(
            "{} layers, {} form flags, {} gains",
            svds.len(),
            chosen.len(),
            gains.len()
        )));
    }
    let (kf, vf) = (layout.k_features(), layout.v_features());
    let mut budget = (fraction * kv_bytes as f64).floor() as usize;
    let picked;
    let chosen = if form.auto() {
        picked = auto_dense(svds, &gains, n, layout, budget, 4);
        &picked[..]
    } else {
        chosen
    };
    let mut dense_total = 0;
    let mut wide = chosen.to_vec();
    if let Some(b) = form.dense_bits() {
        // Dense matrices are paid first; the greedy spends the rest on the others' factors.
        for (l, (&(ck, cv), (sk, sv))) in chosen.iter().zip(svds).enumerate() {
            // A matrix without deficit (the first chunk's) stores nothing.
            if ck {
                gains[l].0 = 0.0;
                dense_total += if sk.tail_energy(0) > 0.0 {
                    dense_bytes(n, kf, b)
                } else {
                    0
                };
            }
            if cv {
                gains[l].1 = 0.0;
                dense_total += if sv.tail_energy(0) > 0.0 {
                    dense_bytes(n, vf, b)
                } else {
                    0
                };
            }
        }
        budget = budget.saturating_sub(dense_total);
        wide = vec![(false, false); svds.len()];
    }
    let ranks = mixed_ranks(svds, &gains, &wide, n, layout, budget);
    let mut layers = Vec::with_capacity(svds.len());
    let mut split: Vec<(HeadTail, HeadTail)> = Vec::with_capacity(svds.len());
    for (l, ((sk, sv), (&(rk, rv), &(wk, wv)))) in svds.iter().zip(ranks.iter().zip(&wide)).enumerate() {
        let w = weights.map(|w| &w.layers[l]);
        let q = |s: &Svd, r: usize, wide: bool, ch: usize| -> Result<LowRank> {
            let lr = s.truncate(r, cfg.dtype).ops("truncate")?;
            if r == 0 {
                return Ok(lr);
            }
            let max = vec![if wide { 127.0 } else { 7.0 }; r];
            let mw = w.map(|(k, v)| if ch == 0 { k } else { v });
            let rows = mw.and_then(|m| m.rows.as_deref());
            let cols = mw.and_then(|m| m.cols.as_deref());
            let out =
                kamera_ops::quantise_refit_ranges(&lr, [Grain::Group; 2], &max, rows, cols).ops("mixed quantise")?;
            out.map(|(lr, _)| lr)
                .ok_or_else(|| invalid(format!("layer {l}: the refit is not finite")))
        };
        let pick = |s: &Svd, r: usize, wide: bool, on: bool, ch: usize| match form.dense_bits() {
            Some(b) if on && s.tail_energy(0) > 0.0 => dense(s, b),
            _ => q(s, r, wide, ch),
        };
        layers.push(LayerPatch {
            k: pick(sk, rk, wk, chosen[l].0, 0)?,
            v: pick(sv, rv, wv, chosen[l].1, 1)?,
        });
        let ht = |r: usize, wide: bool| if wide { (0, r) } else { (r, 0) };
        split.push((ht(rk, wk), ht(rv, wv)));
    }
    let patch = Patch::new(*layout, n, layers).ops("mixed patch")?.compact_spectra();
    let form_bytes = if form.dense_bits().is_some() { svds.len() } else { 0 };
    Ok((patch, simulated_bytes(layout, n, &split, 8) + dense_total + form_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kamera_ops::{Mat, Quant};

    fn svds(layers: usize, n: usize, f: usize, seed: u64) -> Vec<(Svd, Svd)> {
        let mut rng = kamera_eval::Rng::new(seed);
        let mut mat = || {
            let v = (0..n * f).map(|_| (rng.below(1000) as f32 / 1000.0) - 0.5).collect();
            Svd::compute(&Mat::from_f32(n, f, v).unwrap()).unwrap()
        };
        (0..layers).map(|_| (mat(), mat())).collect()
    }

    #[test]
    fn widest_picks_the_most_sensitive_matrices() {
        let sens = [(0.1, 0.3), (0.4, 0.0), (0.3, 0.2)];
        assert_eq!(widest(&sens, 0), vec![(false, false); 3]);
        assert_eq!(widest(&sens, 2), vec![(false, true), (true, false), (false, false)]);
        // A tie goes to the lower layer.
        assert_eq!(widest(&sens, 3), vec![(false, true), (true, false), (true, false)]);
        assert_eq!(widest(&sens, 9), vec![(true, true); 3]);
    }

    #[test]
    fn without_int8_matrices_it_is_the_int4_budget_patch() {
        let layout = KvLayout::gqa(3, 2, 1, 32);
        let (n, kv) = (40, 3 * 2 * 40 * 32 * 2);
        let s = svds(3, n, 32, 5);
        let gains = vec![(1.0, 0.5), (2.0, 1.0), (0.0, 3.0)];
        let cfg = PatchConfig {
            rank: RankPolicy::BudgetGains {
                fraction: 0.1,
                gains: gains.clone(),
            },
            quant: Quant::Int4,
            refit: true,
            ..PatchConfig::fixed(0, kamera_ops::DType::Bf16)
        };
        let int4 = kamera_ops::patch_from_weighted_svds(&s, None, n, &layout, kv, &cfg)
            .unwrap()
            .compact_spectra();
        let (mixed, bytes) = mixed_patch(
            &ChunkDeficit::plain(&s, n, &layout, kv),
            &cfg,
            (Form::Int8Factors, &[(false, false); 3]),
        )
        .unwrap();
        assert!(int4.ranks().iter().any(|&(k, v)| k + v > 0));
        assert_eq!(mixed.ranks(), int4.ranks());
        // The same codes (an empty matrix may differ in its dtype only).
        for (a, b) in mixed.layers().iter().zip(int4.layers()) {
            assert_eq!(
                (a.k.p.to_f32_vec(), a.k.wt.to_f32_vec()),
                (b.k.p.to_f32_vec(), b.k.wt.to_f32_vec())
            );
            assert_eq!(
                (a.v.p.to_f32_vec(), a.v.wt.to_f32_vec()),
                (b.v.p.to_f32_vec(), b.v.wt.to_f32_vec())
            );
        }
        let ht: Vec<_> = int4.ranks().iter().map(|&(k, v)| ((k, 0), (v, 0))).collect();
        assert_eq!(bytes, simulated_bytes(&layout, n, &ht, 8));
    }

    #[test]
    fn int8_matrices_cost_more_per_direction_and_round_finer() {
        let layout = KvLayout::gqa(2, 2, 1, 32);
        let (n, kv) = (40, 2 * 2 * 40 * 32 * 2);
        let s = svds(2, n, 32, 7);
        let cfg = PatchConfig {
            rank: RankPolicy::Budget { fraction: 0.2 },
            quant: Quant::Int4,
            refit: true,
            ..PatchConfig::fixed(0, kamera_ops::DType::Bf16)
        };
        let narrow = [(false, false); 2];
        let wide = [(true, false), (false, false)];
        let (p4, b4) = mixed_patch(
            &ChunkDeficit::plain(&s, n, &layout, kv),
            &cfg,
            (Form::Int8Factors, &narrow),
        )
        .unwrap();
        let (p8, b8) = mixed_patch(
            &ChunkDeficit::plain(&s, n, &layout, kv),
            &cfg,
            (Form::Int8Factors, &wide),
        )
        .unwrap();
        let budget = (0.2 * kv as f64) as usize;
        let spent = |ranks: &[(usize, usize)], w: &[(bool, bool)]| -> usize {
            ranks
                .iter()
                .zip(w)
                .map(|(&(k, v), &(wk, wv))| k * direction_bytes(n, 32, bits(wk)) + v * direction_bytes(n, 32, bits(wv)))
                .sum()
        };
        assert!(spent(&p8.ranks(), &wide) <= budget && spent(&p4.ranks(), &narrow) <= budget);
        // Layer 0's K is bought at 8 bits: fewer of its directions fit.
        assert!(p8.ranks()[0].0 < p4.ranks()[0].0, "{:?} {:?}", p8.ranks(), p4.ranks());
        assert!(b8 <= b4 + 64 && b8 + 600 >= b4, "{b8} {b4}");
        // At the same rank, 8-bit codes leave less error than 4-bit ones.
        let err = |lr: &LowRank, exact: &LowRank| {
            let (a, b) = (lr.dense(), exact.dense());
            a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>()
        };
        let r = p8.ranks()[0].0;
        let exact = s[0].0.truncate(r, kamera_ops::DType::Bf16).unwrap();
        let four = kamera_ops::quantise_refit(&exact, Quant::Int4, [Grain::Group; 2], None, None)
            .unwrap()
            .0;
        assert!(err(&p8.layers()[0].k, &exact) * 20.0 < err(&four, &exact));
    }

    #[test]
    fn dense_matrices_hold_the_whole_deficit_and_are_paid_first() {
        let layout = KvLayout::gqa(2, 2, 1, 32);
        let (n, kv) = (40, 2 * 2 * 40 * 32 * 2);
        let s = svds(2, n, 32, 9);
        let cfg = PatchConfig {
            rank: RankPolicy::Budget { fraction: 0.3 },
            quant: Quant::Int4,
            refit: true,
            ..PatchConfig::fixed(0, kamera_ops::DType::Bf16)
        };
        let chosen = [(false, true), (false, false)];
        let none = [(false, false); 2];
        let (p0, b0) = mixed_patch(&ChunkDeficit::plain(&s, n, &layout, kv), &cfg, (Form::Dense8, &none)).unwrap();
        for (form, bits, tol) in [(Form::Dense8, 8, 1e-4), (Form::Dense4, 4, 2e-2)] {
            let (p, b) = mixed_patch(&ChunkDeficit::plain(&s, n, &layout, kv), &cfg, (form, &chosen)).unwrap();
            let exact = s[0].1.truncate(32, kamera_ops::DType::F32).unwrap().dense();
            let got = p.layers()[0].v.dense();
            let err: f64 = exact.iter().zip(&got).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let total: f64 = exact.iter().map(|&x| (x as f64).powi(2)).sum();
            assert!(err < tol * total, "{form:?}: {err} of {total}");
            // 40 x 32 codes and 32 features x 2 groups of f16 scales.
            assert_eq!(dense_bytes(n, 32, bits), 40 * 32 * bits / 8 + 32 * 2 * 2);
            // The others get what the dense matrix leaves of the budget.
            let spent: usize = p
                .ranks()
                .iter()
                .zip(&chosen)
                .map(|(&(k, v), &(ck, cv))| {
                    (if ck { 0 } else { k } + if cv { 0 } else { v }) * direction_bytes(n, 32, 4)
                })
                .sum();
            assert!(spent + dense_bytes(n, 32, bits) <= (0.3 * kv as f64) as usize);
            let others: usize = p.ranks().iter().map(|&(k, v)| k + v).sum::<usize>() - 32;
            let before: usize = p0.ranks().iter().map(|&(k, v)| k + v).sum();
            assert!(others < before, "{others} {before}");
            assert!(b <= b0 + dense_bytes(n, 32, bits) + 2, "{b} {b0}");
        }
    }

    #[test]
    fn the_budget_goes_dense_where_a_matrix_needs_every_direction() {
        // Layer 0's K: a flat spectrum (every direction matters, dense is cheaper than its
        // factors); the rest: one strong direction each, which factors hold for a few bytes.
        let layout = KvLayout::gqa(2, 2, 1, 32);
        let n = 64;
        let flat = svds(1, n, 32, 11).remove(0).0;
        let spike = |seed: u64| {
            let mut rng = kamera_eval::Rng::new(seed);
            let u: Vec<f32> = (0..n).map(|_| rng.below(100) as f32 / 100.0 - 0.5).collect();
            let w: Vec<f32> = (0..32).map(|_| rng.below(100) as f32 / 100.0 - 0.5).collect();
            let m: Vec<f32> = u.iter().flat_map(|&a| w.iter().map(move |&b| a * b)).collect();
            Svd::compute(&Mat::from_f32(n, 32, m).unwrap()).unwrap()
        };
        let s = vec![(flat, spike(1)), (spike(2), spike(3))];
        let gains = vec![(1.0, 1.0); 2];
        let budget = dense_bytes(n, 32, 4) + 10 * direction_bytes(n, 32, 4);
        assert_eq!(
            auto_dense(&s, &gains, n, &layout, budget, 4),
            vec![(true, false), (false, false)]
        );
        // Without the bytes for it, nothing goes dense.
        assert_eq!(
            auto_dense(&s, &gains, n, &layout, dense_bytes(n, 32, 4) - 1, 4),
            vec![(false, false); 2]
        );
    }
}
