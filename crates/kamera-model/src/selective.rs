//! Selective recompute over a reused KV region, the runner capability behind the token-recompute
//! baselines: CacheBlend (recompute every token up to a check layer, keep the tokens whose KV
//! deviates most from the cache, recompute only those through the remaining layers) and EPIC
//! (recompute a fixed set of tokens, e.g. the first K of each chunk, through every layer).
//!
//! The selected tokens attend to the prefix, to the cached K/V of the tokens not selected and to
//! their own recomputed K/V (causally, by position); the cached rows of the tokens not selected
//! are kept as they are.

use candle_core::{Device, Tensor};
use kamera_ops::{ChunkKv, LayerKv, Mat};

use crate::block::{LayerOut, attend_and_mlp, layer_forward, project_qkv};
use crate::config::Config;
use crate::context::{Context, heads_first, tensor_to_mat};
use crate::error::{CandleCtx, Error, OpsCtx, Result};
use crate::model::{Input, Model};
use crate::weights::LayerWeights;

const OP: &str = "Model::selective_recompute";

/// Which tokens of the reused region get recomputed.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// These token indices (into the region), recomputed through every layer.
    Tokens(Vec<usize>),
    /// CacheBlend: every token is recomputed through layers `0..=check_layer`; then within each
    /// group `(start, len)` of the region the `ceil(fraction * len)` tokens whose K and V at
    /// `check_layer` deviate most (squared L2) from the cached ones are recomputed through the
    /// remaining layers.
    Deviation {
        check_layer: usize,
        fraction: f64,
        groups: Vec<(usize, usize)>,
    },
}

/// The region's KV after selective recompute, and which tokens were recomputed past the
/// fully recomputed layers.
#[derive(Debug, Clone)]
pub struct Selective {
    pub chunk: ChunkKv,
    pub selected: Vec<usize>,
}

impl Model {
    /// Recomputes part of a reused region: `tokens` sit at `prefix.end()..`, `cached` holds their
    /// reused K/V at the same positions (e.g. relocated canonical chunks).
    // Long: one forward pass (full layers, then the selected tokens) over shared positions and KV state.
    pub fn selective_recompute(
        &self,
        tokens: &[u32],
        prefix: &Context,
        cached: &ChunkKv,
        selection: &Selection,
    ) -> Result<Selective> {
        self.require_gqa("Model::selective_recompute")?;
        let cfg = self.config();
        let n = tokens.len();
        let start = prefix.end();
        if cached.n_tokens() != n || cached.offset() != start || *cached.layout() != self.layout() {
            return Err(Error::Shape {
                op: OP,
                detail: format!(
                    "cached region: expected {n} tokens at {start} in {:?}, got {} tokens at {} in {:?}",
                    self.layout(),
                    cached.n_tokens(),
                    cached.offset(),
                    cached.layout()
                ),
            });
        }
        if n == 0 {
            return Err(Error::Invalid {
                op: OP,
                detail: "empty region".into(),
            });
        }
        let dev = Device::Cpu;
        let positions: Vec<i64> = (0..n as i64).map(|i| start + i).collect();
        let prefix_pos: Vec<i64> = (prefix.offset()..prefix.end()).collect();
        let window = |l: usize| cfg.sliding_window.filter(|_| cfg.local_layers[l]);
        let (full_layers, fixed) = match selection {
            Selection::Tokens(sel) => {
                let mut s: Vec<usize> = sel.clone();
                s.sort_unstable();
                s.dedup();
                if let Some(&bad) = s.iter().find(|&&i| i >= n) {
                    return Err(Error::Invalid {
                        op: OP,
                        detail: format!("selected token {bad} outside the region of {n} tokens"),
                    });
                }
                (0, Some(s))
            }
            Selection::Deviation {
                check_layer,
                fraction,
                groups,
            } => {
                if *check_layer >= cfg.n_layers || !(0.0..=1.0).contains(fraction) {
                    return Err(Error::Invalid {
                        op: OP,
                        detail: format!(
                            "check layer {check_layer} (model has {}) / fraction {fraction} (0..=1)",
                            cfg.n_layers
                        ),
                    });
                }
                if let Some(g) = groups.iter().find(|(s, l)| s + l > n) {
                    return Err(Error::Invalid {
                        op: OP,
                        detail: format!("group {g:?} outside the region of {n} tokens"),
                    });
                }
                (check_layer + 1, None)
            }
        };
        let mut x = self.embed(Input::Tokens(tokens))?;
        let mut layers: Vec<LayerKv> = Vec::with_capacity(cfg.n_layers);
        let mut all_k = prefix_pos.clone();
        all_k.extend(&positions);
        let mut selected = fixed.unwrap_or_default();
        for l in 0..full_layers {
            let w = &self.weights().layers[l];
            let out = layer_forward(
                cfg,
                w,
                l,
                self.rope(),
                &x,
                &positions,
                prefix.layer(l)?,
                &all_k,
                window(l),
                None,
            )?;
            let (k, v) = (tensor_to_mat(&out.k)?, tensor_to_mat(&out.v)?);
            if let Selection::Deviation {
                check_layer,
                fraction,
                groups,
            } = selection
                && l == *check_layer
            {
                let c = &cached.layers()[l];
                let dev_k = row_sq_dist(&k, &c.k);
                let dev_v = row_sq_dist(&v, &c.v);
                let score: Vec<f64> = dev_k.iter().zip(&dev_v).map(|(a, b)| a + b).collect();
                for &(gs, gl) in groups {
                    let take = (fraction * gl as f64).ceil() as usize;
                    let mut idx: Vec<usize> = (gs..gs + gl).collect();
                    idx.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
                    selected.extend(idx.into_iter().take(take));
                }
                selected.sort_unstable();
                selected.dedup();
            }
            layers.push(LayerKv { k, v });
            x = out.x;
        }
        let sel_pos: Vec<i64> = selected.iter().map(|&i| positions[i]).collect();
        let mut xs = if selected.is_empty() {
            None
        } else {
            let idx: Vec<u32> = selected.iter().map(|&i| i as u32).collect();
            let idx = Tensor::from_vec(idx, selected.len(), &dev).ctx(OP)?;
            Some(x.index_select(&idx, 0).ctx(OP)?)
        };
        for l in full_layers..cfg.n_layers {
            let c = &cached.layers()[l];
            let Some(xsel) = xs.take() else {
                layers.push(c.clone());
                continue;
            };
            let w = &self.weights().layers[l];
            let keys = MixedKeys {
                prefix: prefix.layer(l)?,
                cached: (&c.k, &c.v),
                rows: &selected,
                k_pos: &all_k,
            };
            let out = layer_mixed(cfg, w, l, self.rope(), &xsel, &sel_pos, &keys, window(l))?;
            let (nk, nv) = (tensor_to_mat(&out.k)?, tensor_to_mat(&out.v)?);
            layers.push(LayerKv {
                k: scatter_rows(&c.k, &selected, &nk)?,
                v: scatter_rows(&c.v, &selected, &nv)?,
            });
            xs = Some(out.x);
        }
        let chunk = ChunkKv::new(self.layout(), start, layers).ops(OP)?;
        Ok(Selective { chunk, selected })
    }
}

/// The keys a selected token sees: the prefix, then the region's cached rows with the selected
/// rows (`rows`) replaced by their recomputed K/V; all at `k_pos` (increasing).
struct MixedKeys<'a> {
    /// Head-first `[kv_heads, t, hd]`.
    prefix: Option<(Tensor, Tensor)>,
    cached: (&'a Mat, &'a Mat),
    rows: &'a [usize],
    k_pos: &'a [i64],
}

/// One layer for the selected tokens only (the block of `block::layer_forward`, with the new
/// K/V written into the region at their own positions instead of appended).
// Many arguments: `layer_forward`'s inputs, with the mixed region's keys in place of the past KV.
#[allow(clippy::too_many_arguments)]
fn layer_mixed(
    cfg: &Config,
    w: &LayerWeights,
    layer: usize,
    spec: &kamera_ops::RopeSpec,
    x: &Tensor,
    positions: &[i64],
    keys: &MixedKeys<'_>,
    window: Option<usize>,
) -> Result<LayerOut> {
    let (q, k, v) = project_qkv(cfg, w, layer, spec, x, positions, None)?;
    let (nk, nv) = (tensor_to_mat(&k)?, tensor_to_mat(&v)?);
    let dev = x.device();
    let region = |base: &Mat, new: &Mat| -> Result<Tensor> {
        let m = scatter_rows(base, keys.rows, new)?;
        Tensor::from_vec(m.to_f32_vec(), (m.rows(), m.cols()), dev).ctx(OP)
    };
    let g = cfg.kv_heads;
    let (rk, rv) = (
        heads_first(&region(keys.cached.0, &nk)?, g)?,
        heads_first(&region(keys.cached.1, &nv)?, g)?,
    );
    let (k_all, v_all) = match &keys.prefix {
        Some((pk, pv)) => (Tensor::cat(&[pk, &rk], 1).ctx(OP)?, Tensor::cat(&[pv, &rv], 1).ctx(OP)?),
        None => (rk, rv),
    };
    let x = attend_and_mlp(cfg, w, x, &q, (&k_all, &v_all), positions, keys.k_pos, window)?;
    Ok(LayerOut { x, k, v })
}

/// Squared L2 distance of each row of `a` to the same row of `b`.
fn row_sq_dist(a: &Mat, b: &Mat) -> Vec<f64> {
    let cols = a.cols().max(1);
    let (a, b) = (a.to_f32_vec(), b.to_f32_vec());
    a.chunks(cols)
        .zip(b.chunks(cols))
        .map(|(x, y)| x.iter().zip(y).map(|(p, q)| ((p - q) as f64).powi(2)).sum())
        .collect()
}

/// `base` with rows `rows[i]` replaced by row `i` of `new`.
fn scatter_rows(base: &Mat, rows: &[usize], new: &Mat) -> Result<Mat> {
    let cols = base.cols();
    let mut out = base.to_f32_vec();
    let src = new.to_f32_vec();
    for (i, &r) in rows.iter().enumerate() {
        out[r * cols..(r + 1) * cols].copy_from_slice(&src[i * cols..(i + 1) * cols]);
    }
    Mat::from_f32(base.rows(), cols, out).ops(OP)
}
