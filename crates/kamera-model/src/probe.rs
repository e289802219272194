//! A prefill that also reports what the new tokens' queries look like and where their attention
//! goes, per layer: the statistics an attention-aware patch factorisation weighs the deficit by
//! (kamera-ops `PatchWeights`). A separate entry point, so the ordinary prefill pays nothing.

use candle_core::Tensor;
use kamera_ops::{ChunkKv, LayerKv};

use crate::attention::softmax_row;
use crate::block::{attend_and_mlp, project_qkv};
use crate::context::{Context, heads_first, tensor_to_mat};
use crate::error::{CandleCtx, Error, OpsCtx, Result};
use crate::model::{Input, Model};

const OP: &str = "Model::prefill_probe";

/// One layer's statistics, per group `g` of queries: the new tokens at rows `from[g]..` (the
/// `from` given to [`Model::prefill_probe`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerProbe {
    /// Per group, Σ q² over the group's queries, per query head and dim (`heads · head_dim`,
    /// post QK-norm and RoPE).
    pub q_sq: Vec<Vec<f32>>,
    /// Per group, the attention each new token receives from the group's queries, summed over
    /// the query heads of each kv head: `[new tokens, kv_heads]`, row-major.
    pub mass: Vec<Vec<f32>>,
    /// As `mass`, of the squared attention weights (Σ a²).
    pub mass_sq: Vec<Vec<f32>>,
    /// Per query head and dim (`heads · head_dim`), the squared norm of the output projection's
    /// column it feeds (each output row scaled by the post-attention norm's weight, where the
    /// model has one): how much an error in that value dim moves the layer's output.
    pub wo_sq: Vec<f32>,
}

/// Statistics of a probed prefill, one entry per layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// Query rows each group starts at (as given).
    pub from: Vec<usize>,
    /// Queries in each group.
    pub queries: Vec<usize>,
    pub layers: Vec<LayerProbe>,
}

impl Model {
    /// [`Model::prefill`] of `tokens` at `start_pos` after `context`, returning also per layer
    /// the query second moments and the attention each new token receives, summed over the
    /// queries at new-token rows `from[g]..` for each group `g` (`from` ascending, each ≤ the
    /// number of tokens). Costs one more pass over the attention scores per layer.
    pub fn prefill_probe(
        &self,
        tokens: &[u32],
        start_pos: i64,
        context: &Context,
        from: &[usize],
    ) -> Result<(ChunkKv, Probe)> {
        self.require_gqa(OP)?;
        let cfg = self.config();
        let n = tokens.len();
        if n == 0 || (!context.is_empty() && context.end() != start_pos) {
            return Err(Error::Invalid {
                op: OP,
                detail: format!(
                    "{n} tokens at {start_pos} after a context ending at {} (need tokens, at its end)",
                    context.end()
                ),
            });
        }
        if from.windows(2).any(|w| w[0] > w[1]) || from.iter().any(|&f| f > n) {
            return Err(Error::Invalid {
                op: OP,
                detail: format!("query groups {from:?}: ascending starts within {n} tokens expected"),
            });
        }
        let positions: Vec<i64> = (0..n as i64).map(|i| start_pos + i).collect();
        let past_pos: Vec<i64> = (context.offset()..context.end()).collect();
        let mut k_pos = past_pos.clone();
        k_pos.extend(&positions);
        let mut x = self.embed(Input::Tokens(tokens))?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let mut stats = Vec::with_capacity(cfg.n_layers);
        for (l, w) in self.weights().layers.iter().enumerate() {
            let window = cfg.sliding_window.filter(|_| cfg.local_layers[l]);
            let (q, k, v) = project_qkv(cfg, w, l, self.rope(), &x, &positions, None)?;
            let (kn, vn) = (heads_first(&k, cfg.kv_heads)?, heads_first(&v, cfg.kv_heads)?);
            let (k_all, v_all) = match context.layer(l)? {
                Some((pk, pv)) => (
                    Tensor::cat(&[&pk, &kn], 1).ctx(OP)?,
                    Tensor::cat(&[&pv, &vn], 1).ctx(OP)?,
                ),
                None => (kn, vn),
            };
            let shape = Shapes {
                heads: cfg.heads,
                kv_heads: cfg.kv_heads,
                head_dim: cfg.head_dim,
                past: past_pos.len(),
            };
            let mut st = layer_stats(
                &q,
                &k_all,
                &shape,
                &positions,
                &k_pos,
                cfg.attn_scale as f32,
                window,
                from,
            )?;
            st.wo_sq = output_weights(&w.wo, w.post_attn_norm.as_ref())?;
            stats.push(st);
            x = attend_and_mlp(cfg, w, &x, &q, (&k_all, &v_all), &positions, &k_pos, window)?;
            layers.push(LayerKv {
                k: tensor_to_mat(&k)?,
                v: tensor_to_mat(&v)?,
            });
        }
        let chunk = ChunkKv::new(self.layout(), start_pos, layers).ops(OP)?;
        let probe = Probe {
            from: from.to_vec(),
            queries: from.iter().map(|&f| n - f).collect(),
            layers: stats,
        };
        Ok((chunk, probe))
    }
}

struct Shapes {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    past: usize,
}

/// The statistics of one layer from its queries `q: [n, heads·hd]` and keys `k_all: [kvh, t, hd]`.
#[allow(clippy::too_many_arguments)]
fn layer_stats(
    q: &Tensor,
    k_all: &Tensor,
    s: &Shapes,
    positions: &[i64],
    k_pos: &[i64],
    scale: f32,
    window: Option<usize>,
    from: &[usize],
) -> Result<LayerProbe> {
    let (n, hd, heads, kvh) = (positions.len(), s.head_dim, s.heads, s.kv_heads);
    let g = heads / kvh.max(1);
    let qv = q.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?;
    // The bucket of query row i: the last group starting at or before it (None before the first).
    let bucket = |i: usize| from.partition_point(|&f| f <= i).checked_sub(1);
    let groups = from.len();
    let mut q_sq = vec![vec![0f32; heads * hd]; groups];
    for (i, row) in qv.chunks(heads * hd).enumerate() {
        if let Some(b) = bucket(i) {
            for (a, &x) in q_sq[b].iter_mut().zip(row) {
                *a += x * x;
            }
        }
    }
    // Scores of every query head against its kv head's keys, one matmul per kv head.
    let qh = heads_first(q, heads)?.reshape((kvh, g * n, hd)).ctx(OP)?;
    let scores = qh.matmul(&k_all.t().ctx(OP)?).ctx("probe scores")?;
    let t = k_pos.len();
    let sv = scores.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?;
    let mut mass = vec![vec![0f32; n * kvh]; groups];
    let mut mass_sq = vec![vec![0f32; n * kvh]; groups];
    let mut p = vec![0f32; t];
    for h in 0..kvh {
        for gi in 0..g {
            for i in 0..n {
                let Some(b) = bucket(i) else { continue };
                let row = &sv[((h * g + gi) * n + i) * t..][..t];
                let qp = positions[i];
                let hi = k_pos.partition_point(|&k| k <= qp);
                let lo = window.map_or(0, |w| k_pos.partition_point(|&k| k <= qp - w as i64));
                if lo >= hi {
                    continue;
                }
                softmax_row(&row[lo..hi], &mut p[lo..hi], scale);
                for j in lo.max(s.past)..hi {
                    let a = p[j];
                    let at = (j - s.past) * kvh + h;
                    mass[b][at] += a;
                    mass_sq[b][at] += a * a;
                }
            }
        }
    }
    // Buckets to suffix sums: group g counts every query from its start on.
    for b in (0..groups.saturating_sub(1)).rev() {
        let (lo, hi) = (b, b + 1);
        for arr in [&mut q_sq, &mut mass, &mut mass_sq] {
            let (a, rest) = arr.split_at_mut(hi);
            for (x, y) in a[lo].iter_mut().zip(&rest[0]) {
                *x += y;
            }
        }
    }
    Ok(LayerProbe {
        q_sq,
        mass,
        mass_sq,
        wo_sq: Vec::new(),
    })
}

/// Σ_r (γ_r · wo[r][j])² per input column j of the output projection `wo: [hidden, heads·hd]`.
fn output_weights(wo: &crate::quant::Linear, post_norm: Option<&Tensor>) -> Result<Vec<f32>> {
    let (rows, cols) = wo.dims()?;
    let w = wo.to_f32()?;
    let gamma = match post_norm {
        Some(g) => g.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?,
        None => vec![1.0; rows],
    };
    let mut out = vec![0f32; cols];
    for (row, g) in w.chunks(cols).zip(&gamma) {
        for (o, &x) in out.iter_mut().zip(row) {
            *o += (g * x) * (g * x);
        }
    }
    Ok(out)
}
