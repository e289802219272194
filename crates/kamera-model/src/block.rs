//! The one transformer block shared by llama, qwen2 and gemma3 (config flags select QKV bias,
//! QK-norm, sandwich norms, activation). Attention runs over explicit past K/V plus the new tokens.

use candle_core::{D, Tensor};
use candle_nn::ops::rms_norm;
use kamera_ops::RopeSpec;

use crate::activation::gated;
use crate::attention::attend;
use crate::config::Config;
use crate::context::heads_first;
use crate::error::{CandleCtx, OpsCtx, Result};
use crate::quant::Linear;
use crate::weights::LayerWeights;

const OP: &str = "block";

/// `x @ w^T (+ b)` for `x: [n, in]`, `w: [out, in]`.
pub(crate) fn linear(x: &Tensor, w: &Linear, b: Option<&Tensor>) -> Result<Tensor> {
    match b {
        Some(b) => w.forward_bias(x, b),
        None => w.forward(x),
    }
}

/// [`linear`] for a dense f32 weight (MLA's).
pub(crate) fn dense_linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    bias(x.matmul(&w.t().ctx(OP)?).ctx("linear")?, b)
}

fn bias(y: Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    match b {
        Some(b) => y.broadcast_add(b).ctx("linear bias"),
        None => Ok(y),
    }
}

pub(crate) fn norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    rms_norm(&x.contiguous().ctx(OP)?, w, eps as f32).ctx("rms_norm")
}

/// `x` (`[n, heads·hd]`) rotated by the angle tables `cs` in place of a copy.
fn rope(spec: &RopeSpec, x: &Tensor, heads: usize, cs: &(Vec<f32>, Vec<f32>)) -> Result<Tensor> {
    let dims = x.dims2().ctx(OP)?;
    let mut v = x.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?;
    spec.apply_cos_sin(&mut v, heads, dims.0, &cs.0, &cs.1)
        .ops("block rope")?;
    Tensor::from_vec(v, dims, x.device()).ctx(OP)
}

/// Output of one layer: the new hidden states and the new tokens' post-RoPE K and V (`[n, kv_dim]`).
pub(crate) struct LayerOut {
    pub x: Tensor,
    pub k: Tensor,
    pub v: Tensor,
}

/// Q, K (post QK-norm and RoPE at `positions`, or at the 3-D M-RoPE ids `mrope` when given) and
/// V of the new tokens, `[n, heads·hd]` and `[n, kv_dim]`.
pub(crate) fn project_qkv(
    cfg: &Config,
    w: &LayerWeights,
    layer: usize,
    spec: &RopeSpec,
    x: &Tensor,
    positions: &[i64],
    mrope: Option<&[[i64; 3]]>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let n = positions.len();
    let (hd, heads, kvh) = (cfg.head_dim, cfg.heads, cfg.kv_heads);
    let h = norm(x, &w.attn_norm, cfg.rms_eps)?;
    let mut q = linear(&h, &w.wq, w.bq.as_ref())?;
    let mut k = linear(&h, &w.wk, w.bk.as_ref())?;
    let v = linear(&h, &w.wv, w.bv.as_ref())?;
    if let (Some(qn), Some(kn)) = (&w.q_norm, &w.k_norm) {
        q = norm(&q.reshape((n * heads, hd)).ctx(OP)?, qn, cfg.rms_eps)?
            .reshape((n, heads * hd))
            .ctx(OP)?;
        k = norm(&k.reshape((n * kvh, hd)).ctx(OP)?, kn, cfg.rms_eps)?
            .reshape((n, kvh * hd))
            .ctx(OP)?;
    }
    // One angle table for Q and K.
    let cs = match mrope {
        Some(p3) => spec.cos_sin_mrope(layer, p3),
        None => spec.cos_sin(layer, positions),
    }
    .ops("block rope")?;
    let q = rope(spec, &q, heads, &cs)?;
    let k = rope(spec, &k, kvh, &cs)?;
    Ok((q, k, v))
}

/// The rest of the layer: attention of `q` (at `positions`) over `k_all`/`v_all` (head-first
/// `[kv_heads, t, hd]`, at `k_pos`; `window` limiting q − k), output projection, residuals, MLP.
/// Returns the new hidden states.
// Many arguments: the layer's second half takes the first half's outputs and their positions.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_and_mlp(
    cfg: &Config,
    w: &LayerWeights,
    x: &Tensor,
    q: &Tensor,
    (kh, vh): (&Tensor, &Tensor),
    positions: &[i64],
    k_pos: &[i64],
    window: Option<usize>,
) -> Result<Tensor> {
    let n = positions.len();
    let (hd, heads, kvh) = (cfg.head_dim, cfg.heads, cfg.kv_heads);
    // q: [n, heads, hd] -> [heads, n, hd] = [kvh, g, n, hd] (heads of a group are adjacent).
    let qh = heads_first(q, heads)?.reshape((kvh, heads / kvh, n, hd)).ctx(OP)?;
    let bf16 = w.wq.precision() == crate::PrefillPrecision::Bf16;
    let att = attend(&qh, kh, vh, positions, k_pos, cfg.attn_scale, window, bf16)?;
    // [heads, n, hd] -> [n, heads·hd]
    let att = heads_first(&att.reshape((heads, n * hd)).ctx(OP)?, n)?
        .reshape((n, heads * hd))
        .ctx(OP)?;
    let mut a = linear(&att, &w.wo, None)?;
    if let Some(pn) = &w.post_attn_norm {
        a = norm(&a, pn, cfg.rms_eps)?;
    }
    let x = (x + a).ctx(OP)?;
    let h = norm(&x, &w.ffn_norm, cfg.rms_eps)?;
    let mut m = mlp(cfg, w, &h)?;
    if let Some(pn) = &w.post_ffn_norm {
        m = norm(&m, pn, cfg.rms_eps)?;
    }
    (x + m).ctx(OP)
}

/// Rows the gated MLP takes at a time: the micro-batch of a long prefill
/// ([`crate::PREFILL_SLICE`]), here for the inputs that are not sliced (an extend, a prefill
/// after a context). Its two `[rows, ffn]` intermediates are a long input's largest buffers
/// (Qwen2.5 at 2048 rows: 80 MB, against 48 MB for the whole KV); each row's arithmetic is the
/// same (the rows of a product are independent).
const MLP_ROWS: usize = crate::PREFILL_SLICE;

/// `down(act(gate(h)) · up(h))` over the rows of `h: [n, hidden]`, [`MLP_ROWS`] at a time.
fn mlp(cfg: &Config, w: &LayerWeights, h: &Tensor) -> Result<Tensor> {
    let n = h.dim(0).ctx(OP)?;
    let mut blocks = Vec::with_capacity(n.div_ceil(MLP_ROWS));
    for r0 in (0..n).step_by(MLP_ROWS) {
        let rows = MLP_ROWS.min(n - r0);
        let hb = if rows == n {
            h.clone()
        } else {
            h.narrow(0, r0, rows).ctx(OP)?
        };
        let mut gate = w.w_gate.forward_vec(&hb)?;
        let up = w.w_up.forward_vec(&hb)?;
        gated(cfg.activation, &mut gate, &up);
        let gate = Tensor::from_vec(gate, (rows, cfg.ffn), h.device()).ctx(OP)?;
        blocks.push(linear(&gate, &w.w_down, None)?);
    }
    if blocks.len() == 1 {
        return Ok(blocks.remove(0));
    }
    Tensor::cat(&blocks, 0).ctx(OP)
}

/// One layer over `x: [n, hidden]` at `positions`, attending to `past` (head-first
/// `[kv_heads, t, hd]` each) followed by the new tokens; keys sit at `k_pos` (past then new),
/// `window` limits q - k; `mrope` (M-RoPE models) rotates to 3-D ids instead of `positions`.
// Many arguments: one layer's inputs: config, weights, RoPE, hidden states, positions, past KV, key positions, window, M-RoPE ids.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_forward(
    cfg: &Config,
    w: &LayerWeights,
    layer: usize,
    spec: &RopeSpec,
    x: &Tensor,
    positions: &[i64],
    past: Option<(Tensor, Tensor)>,
    k_pos: &[i64],
    window: Option<usize>,
    mrope: Option<&[[i64; 3]]>,
) -> Result<LayerOut> {
    let (q, k, v) = project_qkv(cfg, w, layer, spec, x, positions, mrope)?;
    let (kn, vn) = (heads_first(&k, cfg.kv_heads)?, heads_first(&v, cfg.kv_heads)?);
    let (k_all, v_all) = match past {
        Some((pk, pv)) => (
            Tensor::cat(&[&pk, &kn], 1).ctx("cat past k")?,
            Tensor::cat(&[&pv, &vn], 1).ctx("cat past v")?,
        ),
        None => (kn, vn),
    };
    let x = attend_and_mlp(cfg, w, x, &q, (&k_all, &v_all), positions, k_pos, window)?;
    Ok(LayerOut { x, k, v })
}

/// Final norm and LM head over `x: [n, hidden]` -> `[n, vocab]`.
pub(crate) fn head(x: &Tensor, out_norm: &Tensor, lm_head: &Linear, eps: f64) -> Result<Tensor> {
    let h = norm(x, out_norm, eps)?;
    linear(&h, lm_head, None)
}

#[allow(dead_code)]
pub(crate) fn last_dim(x: &Tensor) -> Result<usize> {
    x.dim(D::Minus1).ctx(OP)
}
