//! Error-aware quantisation: P quantised first, then Wᵀ refitted to the quantised P by weighted
//! least squares before it is quantised itself, each scale clipped where that lowers the
//! weighted rounding error.

use super::{Grain, Quant, Scales, quantise_grains, quantise_mat_clipped};
use crate::error::{Result, shape};
use crate::svd::LowRank;
use crate::tensor::Mat;

/// Quantises `lr` with P's and Wᵀ's scale layouts given, P first, then Wᵀ refitted to the
/// quantised P before it is quantised itself: Wᵀ = argmin ‖diag(√r)(P Wᵀ − P̂ Wᵀ')‖ (least
/// squares, `rows` the per-token weights r of the error, `None` for 1), so the error P's
/// rounding leaves is partly absorbed by Wᵀ (column weights do not change this fit). Each
/// scale is clipped where that lowers its entries' rounding error weighted by `rows` (P) or
/// `cols` (Wᵀ, per feature).
pub fn quantise_refit(
    lr: &LowRank,
    q: Quant,
    grain: [Grain; 2],
    rows: Option<&[f32]>,
    cols: Option<&[f32]>,
) -> Result<(LowRank, Scales)> {
    let max = q.max_code() as f32;
    if max == 0.0 || lr.rank() == 0 {
        return quantise_grains(lr, q, grain);
    }
    match quantise_refit_ranges(lr, grain, &vec![max; lr.rank()], rows, cols)? {
        Some(out) => Ok(out),
        None => quantise_grains(lr, q, grain),
    }
}

/// As [`quantise_refit`], direction j's codes in −`max[j]`..=`max[j]` (e.g. 7 for the leading
/// directions and 1 for the tail: fewer bits where the deficit holds less energy). `Ok(None)`
/// when the refit is not finite (the caller falls back to plain rounding).
pub fn quantise_refit_ranges(
    lr: &LowRank,
    grain: [Grain; 2],
    max: &[f32],
    rows: Option<&[f32]>,
    cols: Option<&[f32]>,
) -> Result<Option<(LowRank, Scales)>> {
    const OP: &str = "quant::quantise_refit";
    let (n, m, f) = (lr.p.rows(), lr.rank(), lr.wt.cols());
    if max.len() != m {
        return Err(shape(OP, "code ranges", m, max.len()));
    }
    if let Some(r) = rows
        && r.len() != n
    {
        return Err(shape(OP, "row weights", n, r.len()));
    }
    if let Some(c) = cols
        && c.len() != f
    {
        return Err(shape(OP, "column weights", f, c.len()));
    }
    let p = lr.p.to_f32_vec();
    let (sp, pq) = quantise_mat_clipped(&p, (n, m), true, grain[0], max, rows);
    let w = lr.wt.to_f32_vec();
    // G = P̂ᵀ R P̂ (m x m), H = P̂ᵀ R P (m x m): the refit is G⁻¹ H Wᵀ. Both products in f64
    // (G's condition grows as (σ₁/σ_m)²) on faer's kernels; R P̂ is P̂ itself without row weights.
    let codes = faer::Mat::<f64>::from_fn(n, m, |t, j| pq[t * m + j] as f64);
    let exact = faer::Mat::<f64>::from_fn(n, m, |t, j| p[t * m + j] as f64);
    let weighted = rows.map(|r| faer::Mat::<f64>::from_fn(n, m, |t, j| codes[(t, j)] * r[t] as f64));
    let rp = weighted.as_ref().unwrap_or(&codes);
    let (gm, hm) = (rp.transpose() * &codes, rp.transpose() * &exact);
    let refit = match solve_spd(gm, &hm) {
        Some(x) => {
            // Wᵀ' = X Wᵀ with X = G⁻¹ H.
            let x = faer::Mat::<f32>::from_fn(m, m, |i, k| x[(i, k)] as f32);
            let wt = faer::Mat::<f32>::from_fn(m, f, |k, c| w[k * f + c]);
            let out = x * wt;
            (0..m * f).map(|i| out[(i / f, i % f)]).collect()
        }
        None => w,
    };
    if refit.iter().any(|x| !x.is_finite()) {
        return Ok(None);
    }
    let (sw, wq) = quantise_mat_clipped(&refit, (m, f), false, grain[1], max, cols);
    let out = LowRank {
        p: Mat::from_f32(n, m, pq)?,
        wt: Mat::from_f32(m, f, wq)?,
        spectrum: lr.spectrum.clone(),
    };
    Ok(Some((out, Scales { p: sp, wt: sw, grain })))
}

/// X = G⁻¹ H for a symmetric positive semi-definite `g` (m x m; a ridge of 1e-9 of its mean
/// diagonal keeps it definite), by faer's Cholesky factorisation; `None` if it is not definite
/// or the solution is not finite.
fn solve_spd(mut g: faer::Mat<f64>, h: &faer::Mat<f64>) -> Option<faer::Mat<f64>> {
    use faer::prelude::Solve;
    let m = g.nrows();
    let ridge = 1e-9 * (0..m).map(|i| g[(i, i)]).sum::<f64>() / m as f64;
    if !ridge.is_finite() {
        return None;
    }
    for i in 0..m {
        g[(i, i)] += ridge.max(f64::MIN_POSITIVE);
    }
    let x = g.llt(faer::Side::Lower).ok()?.solve(h);
    (0..m)
        .all(|i| (0..x.ncols()).all(|c| x[(i, c)].is_finite()))
        .then_some(x)
}
