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
    let weight = |t: usize| rows.map_or(1.0, |r| r[t] as f64);
    // G = P̂ᵀ R P̂ (m x m), H = P̂ᵀ R P (m x m): the refit is G⁻¹ H Wᵀ.
    let mut g = vec![0f64; m * m];
    let mut h = vec![0f64; m * m];
    for t in 0..n {
        let (a, b, rt) = (&pq[t * m..(t + 1) * m], &p[t * m..(t + 1) * m], weight(t));
        for i in 0..m {
            let ai = a[i] as f64 * rt;
            if ai == 0.0 {
                continue;
            }
            for j in 0..m {
                g[i * m + j] += ai * a[j] as f64;
                h[i * m + j] += ai * b[j] as f64;
            }
        }
    }
    let refit = match solve_spd(&mut g, &h, m) {
        Some(x) => {
            // Wᵀ' = X Wᵀ with X = G⁻¹ H.
            let mut out = vec![0f32; m * f];
            for i in 0..m {
                for k in 0..m {
                    let c = x[i * m + k] as f32;
                    if c == 0.0 {
                        continue;
                    }
                    for (o, &y) in out[i * f..(i + 1) * f].iter_mut().zip(&w[k * f..(k + 1) * f]) {
                        *o += c * y;
                    }
                }
            }
            out
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

/// X = G⁻¹ H for a symmetric positive semi-definite `g` (m x m, overwritten by its Cholesky
/// factor; a ridge of 1e-9 of its mean diagonal keeps it definite); `None` if it is not.
fn solve_spd(g: &mut [f64], h: &[f64], m: usize) -> Option<Vec<f64>> {
    let ridge = 1e-9 * (0..m).map(|i| g[i * m + i]).sum::<f64>() / m as f64;
    for i in 0..m {
        g[i * m + i] += ridge.max(f64::MIN_POSITIVE);
    }
    for j in 0..m {
        let mut d = g[j * m + j];
        for k in 0..j {
            d -= g[j * m + k] * g[j * m + k];
        }
        if d <= 0.0 || !d.is_finite() {
            return None;
        }
        let d = d.sqrt();
        g[j * m + j] = d;
        for i in j + 1..m {
            let mut s = g[i * m + j];
            for k in 0..j {
                s -= g[i * m + k] * g[j * m + k];
            }
            g[i * m + j] = s / d;
        }
    }
    let mut x = h.to_vec();
    for c in 0..m {
        // L y = h[:, c], then Lᵀ x = y.
        for i in 0..m {
            let mut s = x[i * m + c];
            for k in 0..i {
                s -= g[i * m + k] * x[k * m + c];
            }
            x[i * m + c] = s / g[i * m + i];
        }
        for i in (0..m).rev() {
            let mut s = x[i * m + c];
            for k in i + 1..m {
                s -= g[k * m + i] * x[k * m + c];
            }
            x[i * m + c] = s / g[i * m + i];
        }
    }
    Some(x)
}
