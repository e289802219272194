//! Attention-aware patch factorisation in the harness (`/w`, `/w=LETTERS`): one probed prefill of
//! the task's chunks in their order (the conditioned forward a patch is formed from, with its
//! query and attention statistics), then per chunk the weighted SVDs of its deficit
//! (kamera-ops `weights`). `/wq=cal` takes K's feature columns from the calibration table
//! instead (kamera-lab `qcal`), and needs no probe when nothing else is weighted.

use std::time::Instant;

use kamera_model::Probe;
use kamera_ops::{
    Deficit, MatWeights, PatchWeights, Svd, key_feature_weights, normalise_weights, token_weights,
    value_feature_weights,
};

use crate::error::{Error, ModelCtx, OpsCtx, Result, invalid};
use crate::evaluator::{Evaluator, Prepared, ms};
use crate::method::Weighting;

/// Per layer, a chunk's (K, V) deficit SVDs.
type ChunkSvds = Vec<(Svd, Svd)>;

/// The probe of a task (once a weighting needs it) and the weighted SVDs formed so far, per
/// weighting.
pub(crate) struct WeightState {
    probe: Option<Probe>,
    probe_ms: f64,
    done: Vec<Done>,
}

/// Per chunk, the weights and the weighted SVDs of its deficit under one weighting, and the
/// time they took.
struct Done {
    weighting: Weighting,
    weights: Vec<PatchWeights>,
    svds: Vec<ChunkSvds>,
    ms: f64,
}

impl Evaluator<'_> {
    /// A task's weight state, with no probe yet.
    pub(crate) fn weight_state(&self) -> WeightState {
        WeightState {
            probe: None,
            probe_ms: 0.0,
            done: Vec::new(),
        }
    }

    /// Prefills the task's chunks in order after the system prefix, with query statistics per
    /// chunk start (once per task).
    fn probe<'s>(&self, p: &Prepared, state: &'s mut WeightState) -> Result<&'s Probe> {
        if state.probe.is_none() {
            let t = Instant::now();
            let toks: Vec<u32> = p.chunk_toks.concat();
            let (_, probe) = self
                .model
                .prefill_probe(&toks, p.start, &p.sys_ctx, &p.offs)
                .model("probe prefill")?;
            state.probe = Some(probe);
            state.probe_ms = ms(t);
        }
        state.probe.as_ref().ok_or_else(|| invalid("probe"))
    }

    /// Per chunk, the SVDs of its deficit under `w`, and the time they took with the probe's.
    pub(crate) fn weighted_svds<'s>(
        &self,
        p: &Prepared,
        state: &'s mut WeightState,
        deficits: &[Deficit],
        w: Weighting,
    ) -> Result<(&'s [ChunkSvds], &'s [PatchWeights], f64)> {
        let i = match state.done.iter().position(|d| d.weighting == w) {
            Some(i) => i,
            None => {
                let probe = if w.needs_probe() {
                    Some(self.probe(p, state)?.clone())
                } else {
                    None
                };
                let t = Instant::now();
                let mut svds = Vec::with_capacity(deficits.len());
                let mut weights = Vec::with_capacity(deficits.len());
                for (c, d) in deficits.iter().enumerate() {
                    let ws = (0..d.layers.len())
                        .map(|l| self.layer_weights(p, probe.as_ref(), c, l, w))
                        .collect::<Result<Vec<_>>>()?;
                    let layers = d
                        .layers
                        .iter()
                        .zip(&ws)
                        .map(|((dk, dv), (wk, wv))| {
                            Ok((
                                Svd::compute_weighted(dk, wk).ops("weighted svd")?,
                                Svd::compute_weighted(dv, wv).ops("weighted svd")?,
                            ))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    svds.push(layers);
                    weights.push(PatchWeights { layers: ws });
                }
                state.done.push(Done {
                    weighting: w,
                    weights,
                    svds,
                    ms: ms(t),
                });
                state.done.len() - 1
            }
        };
        let d = &state.done[i];
        let probe_ms = if w.needs_probe() { state.probe_ms } else { 0.0 };
        Ok((&d.svds, &d.weights, d.ms + probe_ms))
    }

    /// The (K, V) weights of chunk `c` in layer `l`: K's columns from the queries of the chunk's
    /// own and later tokens, rows from the attention the later tokens' queries give each of the
    /// chunk's tokens (the chunk's own queries for the last chunk, which has no later tokens);
    /// with `/wq=cal` K's columns from the calibrated question queries of layer `l`.
    fn layer_weights(
        &self,
        p: &Prepared,
        probe: Option<&Probe>,
        c: usize,
        l: usize,
        w: Weighting,
    ) -> Result<(MatWeights, MatWeights)> {
        let layout = self.model.layout();
        let kvh = layout.kv_heads();
        let need = || invalid("weights need the task's probe");
        let q_sq = if w.k_cols {
            Some(&probe.ok_or_else(need)?.layers[l].q_sq[c])
        } else if w.k_cols_cal {
            let table = &self.cfg.query_calibration;
            Some(table.get(l).ok_or_else(|| Error::Invalid {
                op: "query calibration",
                detail: format!(
                    "wq=cal needs --query-calibration with layer {l} (the table has {})",
                    table.len()
                ),
            })?)
        } else {
            None
        };
        let cols = match q_sq {
            Some(q_sq) => {
                let q = key_feature_weights(&layout, self.model.rope(), q_sq).ops("key weights")?;
                let q = normalise_weights(&q, w.floor).ops("key weights")?;
                Some(q.into_iter().map(|x| w.cap.map_or(x, |c| x.min(c))).collect())
            }
            None => None,
        };
        let rows = if w.k_rows || w.v_rows {
            let probe = probe.ok_or_else(need)?;
            let lp = &probe.layers[l];
            let later = !w.own_mass && c + 1 < probe.from.len() && probe.queries[c + 1] > 0;
            let g = if later { c + 1 } else { c };
            let src = if w.squared_mass { &lp.mass_sq[g] } else { &lp.mass[g] };
            let (o, n) = (p.offs[c], p.chunk_toks[c].len());
            let m = token_weights(&src[o * kvh..(o + n) * kvh], kvh).ops("token weights")?;
            let m = normalise_weights(&m, w.floor).ops("token weights")?;
            Some(m.into_iter().map(|x| w.cap.map_or(x, |c| x.min(c))).collect())
        } else {
            None
        };
        let k = MatWeights {
            rows: rows.clone().filter(|_| w.k_rows),
            cols,
        };
        let v_cols = if w.v_cols {
            let o = value_feature_weights(&layout, &probe.ok_or_else(need)?.layers[l].wo_sq).ops("value weights")?;
            Some(normalise_weights(&o, w.floor).ops("value weights")?)
        } else {
            None
        };
        let v = MatWeights {
            rows: rows.filter(|_| w.v_rows),
            cols: v_cols,
        };
        Ok((k, v))
    }
}
