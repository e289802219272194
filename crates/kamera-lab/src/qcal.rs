//! Calibrated query weights for K factors (`/wq=cal`). The logit error a K patch leaves on a
//! query q is q·e for the residual e of a key, so the expected squared error over the queries
//! that will read the chunk is tr(E Σ_q Eᵀ), Σ_q their second moment. The queries that read a
//! page are the question's and the answer's, not the later pages' (what `w=q` uses, from the
//! task itself), so this table is measured once per model on calibration tasks (never the
//! scored ones): per layer, the mean second moment of the question and answer tokens' queries
//! per query head and dim, post QK-norm and RoPE, as the model computes them. Its diagonal is
//! what a separable weighted SVD (kamera-ops `Svd::compute_weighted`) can use; averaged over
//! each RoPE pair (kamera-ops `key_feature_weights`) it is invariant under the relocation's
//! rotation, so the frame the question's queries were measured in does not matter.

use kamera_ops::{
    DType, KvLayout, LayerPatch, LowRank, Mat, MatWeights, Patch, PatchConfig, PatchWeights, Quant, RankPolicy, Svd,
    patch_from_weighted_svds, policy_ranks,
};
use serde::{Deserialize, Serialize};

use kamera_eval::Task;

use crate::config::EvalConfig;
use crate::error::{Error, ModelCtx, OpsCtx, Result};
use crate::evaluator::{Evaluator, stored_bytes};

/// A per-model table of the question queries' second moments (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryCalibration {
    /// The model the table was measured on (as named on the command line).
    pub model: String,
    /// The calibration tasks' ids.
    pub tasks: Vec<String>,
    /// Per layer, `heads · head_dim` mean squared query entries: per task the mean over its
    /// question and answer tokens, then the mean over tasks.
    pub q_sq: Vec<Vec<f32>>,
}

impl QueryCalibration {
    /// Checks the table against a model's layer count and query width.
    pub fn check(&self, layers: usize, width: usize) -> Result<()> {
        if self.q_sq.len() != layers || self.q_sq.iter().any(|l| l.len() != width) {
            return Err(Error::Invalid {
                op: "query calibration",
                detail: format!(
                    "table of {} layers x {:?} for a model of {layers} layers x {width} (heads x head_dim): measured on another model?",
                    self.q_sq.len(),
                    self.q_sq.first().map(Vec::len)
                ),
            });
        }
        Ok(())
    }
}

/// Measures the table on `tasks` (calibration tasks, not the scored ones): each task's pages
/// prefilled in order after the system prefix (the conditioned context), then its question and
/// answer probed on top (kamera-model `Model::prefill_probe`).
pub fn calibrate_queries(
    model: &kamera_model::Model,
    model_name: &str,
    tasks: &[Task],
    cfg: EvalConfig,
) -> Result<QueryCalibration> {
    let ev = Evaluator::new(model, cfg);
    let cfgm = model.config();
    let width = cfgm.heads * cfgm.head_dim;
    let mut acc = vec![vec![0f64; width]; cfgm.n_layers];
    for t in tasks {
        let p = ev.prepare(t)?;
        let ctx = ev.with_region(&p, &p.conditioned)?;
        let (_, probe) = model
            .prefill_probe(&p.qa, ctx.end(), &ctx, &[0])
            .model("question probe")?;
        let n = probe.queries[0].max(1) as f64;
        for (a, lp) in acc.iter_mut().zip(&probe.layers) {
            for (x, &q) in a.iter_mut().zip(&lp.q_sq[0]) {
                *x += q as f64 / n;
            }
        }
    }
    if tasks.is_empty() {
        return Err(Error::Invalid {
            op: "query calibration",
            detail: "no calibration tasks".into(),
        });
    }
    let k = tasks.len() as f64;
    Ok(QueryCalibration {
        model: model_name.to_string(),
        tasks: tasks.iter().map(|t| t.id.clone()).collect(),
        q_sq: acc
            .into_iter()
            .map(|l| l.into_iter().map(|x| (x / k) as f32).collect())
            .collect(),
    })
}

/// K's Wᵀ with its columns multiplied by `f(c_j)` (`cols`: K's column weights; `None`: as is).
fn scale_cols(lr: &LowRank, cols: Option<&[f32]>, f: impl Fn(f32) -> f32) -> Result<LowRank> {
    let Some(c) = cols else { return Ok(lr.clone()) };
    let (m, feats) = (lr.wt.rows(), lr.wt.cols());
    if c.len() != feats {
        return Err(Error::Invalid {
            op: "weighted-domain patch",
            detail: format!("{} column weights for {feats} key features", c.len()),
        });
    }
    let mut w = lr.wt.to_f32_vec();
    for row in w.chunks_mut(feats.max(1)) {
        for (x, &cj) in row.iter_mut().zip(c) {
            *x *= f(cj);
        }
    }
    Ok(LowRank {
        p: lr.p.to_dtype(DType::F32),
        wt: Mat::from_f32(m, feats, w).ops("weighted-domain patch")?,
        spectrum: lr.spectrum.clone(),
    })
}

/// A `/wq=cal` patch with quantised factors, stored in the weighted domain: the factors of the
/// weighted SVDs `svds` at the ranks `cfg` picks, K's Wᵀ columns times √c (c: K's column
/// weights in `weights`, from the per-model table), quantised as `cfg` says with K's column
/// weights dropped (every feature weighs the same in that domain), then read back with K's
/// columns divided by √c. Returns the patch as applied (f32 factors, the decoded values) and
/// the bytes of the stored record: kamera-store's encoding of the weighted-domain quantised
/// patch (the same shapes as the unweighted record; decoding needs the model's table, which
/// is not per chunk).
pub(crate) fn domain_patch(
    svds: &[(Svd, Svd)],
    weights: &PatchWeights,
    n: usize,
    layout: &KvLayout,
    kv_bytes: usize,
    cfg: &PatchConfig,
) -> Result<(Patch, usize)> {
    let ranks = policy_ranks(svds, n, layout, kv_bytes, cfg).ops("patch ranks")?;
    let float_cfg = PatchConfig {
        rank: RankPolicy::PerLayerKv(ranks),
        dtype: DType::F32,
        quant: Quant::None,
        grain: None,
        drop_below: 0.0,
        refit: false,
        basis: None,
    };
    let float =
        patch_from_weighted_svds(svds, Some(weights), n, layout, kv_bytes, &float_cfg).ops("patch formation")?;
    let kcols = |l: usize| weights.layers[l].0.cols.as_deref();
    let dom = float
        .layers()
        .iter()
        .enumerate()
        .map(|(l, lp)| {
            Ok(LayerPatch {
                k: scale_cols(&lp.k, kcols(l), f32::sqrt)?,
                v: lp.v.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let dom = Patch::new(*layout, n, dom).ops("weighted-domain patch")?;
    let uniform = PatchWeights {
        layers: weights
            .layers
            .iter()
            .map(|(k, v)| {
                (
                    MatWeights {
                        rows: k.rows.clone(),
                        cols: None,
                    },
                    v.clone(),
                )
            })
            .collect(),
    };
    let stored = dom
        .quantise_rows(cfg.quant, cfg.grain, cfg.refit, Some(&uniform))
        .ops("weighted-domain quantisation")?
        .compact_spectra();
    let bytes = stored_bytes([&stored])?;
    let read = stored
        .layers()
        .iter()
        .enumerate()
        .map(|(l, lp)| {
            Ok(LayerPatch {
                k: scale_cols(&lp.k, kcols(l), |c| 1.0 / c.sqrt())?,
                v: LowRank {
                    p: lp.v.p.to_dtype(DType::F32),
                    wt: lp.v.wt.to_dtype(DType::F32),
                    spectrum: lp.v.spectrum.clone(),
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((Patch::new(*layout, n, read).ops("weighted-domain patch")?, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// With unit K column weights the weighted-domain patch is the ordinary quantised patch
    /// (same bytes, same decoded factors); with other weights it stores the same shapes, so the
    /// same bytes, and its decoded K factors are the stored codes times scales over √c.
    #[test]
    fn weighted_domain_patch_is_the_plain_one_at_unit_weights_and_costs_the_same() {
        let layout = KvLayout::gqa(2, 2, 1, 8);
        let n = 12;
        let feats = layout.k_features();
        let cfg = PatchConfig {
            rank: RankPolicy::Fixed(3),
            dtype: DType::F32,
            quant: Quant::Int4,
            grain: None,
            drop_below: 0.0,
            refit: true,
            basis: None,
        };
        let weigh = |cols: Vec<f32>| PatchWeights {
            layers: (0..2)
                .map(|_| {
                    (
                        MatWeights {
                            rows: None,
                            cols: Some(cols.clone()),
                        },
                        MatWeights::none(),
                    )
                })
                .collect(),
        };
        let svds_of = |w: &PatchWeights| -> Vec<(Svd, Svd)> {
            (0..2)
                .map(|l| {
                    let (k, v) = (mat(n, feats, l as u64), mat(n, feats, 10 + l as u64));
                    (
                        Svd::compute_weighted(&k, &w.layers[l].0).unwrap(),
                        Svd::compute(&v).unwrap(),
                    )
                })
                .collect()
        };
        let ones = weigh(vec![1.0; feats]);
        let svds = svds_of(&ones);
        let (dom, bytes) = domain_patch(&svds, &ones, n, &layout, 1 << 20, &cfg).unwrap();
        let plain = patch_from_weighted_svds(&svds, Some(&ones), n, &layout, 1 << 20, &cfg)
            .unwrap()
            .compact_spectra();
        assert_eq!(bytes, stored_bytes([&plain]).unwrap());
        for (a, b) in dom.layers().iter().zip(plain.layers()) {
            assert_eq!(a.k.dense(), b.k.dense());
            assert_eq!(a.v.dense(), b.v.dense());
        }
        let peaked = weigh((0..feats).map(|j| 0.5 + (j % 5) as f32 * 2.0).collect());
        let svds = svds_of(&peaked);
        let (_, b2) = domain_patch(&svds, &peaked, n, &layout, 1 << 20, &cfg).unwrap();
        assert_eq!(b2, bytes);
    }

    #[test]
    fn a_table_must_fit_the_model() {
        let t = QueryCalibration {
            model: "m".into(),
            tasks: vec!["a".into()],
            q_sq: vec![vec![1.0; 8]; 2],
        };
        assert!(t.check(2, 8).is_ok());
        assert!(t.check(3, 8).is_err());
        assert!(t.check(2, 16).is_err());
    }
}
