//! MLA attention over cached latents, in two exact forms (DeepSeek-V2 paper, arXiv:2405.04434,
//! section 2.1.2, "absorb W_UK into W_UQ and W_UV into W_O"):
//!
//! - expanded: k_nope and v of every cached token from the latent (`kv_b_proj`), then attention
//!   as transformers computes it: `T · lat · (nope + v)` per head to expand, whatever the number
//!   of new tokens;
//! - absorbed: q_nope taken into latent space per head (`q_nope · W_UK`), scores against the
//!   latent itself, the latent's weighted sum taken out through `W_UV`: `n · T · (2 lat + rope)`.
//!
//! A prefill takes whichever costs fewer multiply-adds: decode steps and questions after a long
//! context the absorbed form, a chunk long against its context the expanded one.

use candle_core::Tensor;

use super::config::MlaConfig;
use super::weights::MlaLayer;
use crate::block::dense_linear;
use crate::error::{CandleCtx, Result};

const OP: &str = "mla attention";

/// Which form [`attend`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    Expanded,
    Absorbed,
}

/// The cheaper form for `n` new queries over `t` keys (multiply-adds per head).
pub(crate) fn cheaper(cfg: &MlaConfig, n: usize, t: usize) -> Form {
    let (lat, nope, rope, v) = (cfg.kv_lora_rank, cfg.qk_nope, cfg.qk_rope, cfg.v_head);
    let expanded = t * lat * (nope + v) + n * t * (nope + rope + v);
    let absorbed = n * t * (2 * lat + rope) + n * lat * (nope + v);
    if absorbed < expanded {
        Form::Absorbed
    } else {
        Form::Expanded
    }
}

/// Causal attention of `q` (`[n, heads, qk_head]` at `q_pos`) over every token's latent and
/// k_rope (`[t, lat]`, `[t, rope]` at `k_pos`): `[n, heads · v_head]`, in the cheaper form.
pub(crate) fn attend(
    cfg: &MlaConfig,
    w: &MlaLayer,
    q: &Tensor,
    latent: &Tensor,
    k_rope: &Tensor,
    q_pos: &[i64],
    k_pos: &[i64],
) -> Result<Tensor> {
    attend_as(
        cheaper(cfg, q_pos.len(), k_pos.len()),
        cfg,
        w,
        q,
        latent,
        k_rope,
        q_pos,
        k_pos,
    )
}

/// [`attend`] in a given form.
// Many arguments: the form, then attend's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_as(
    form: Form,
    cfg: &MlaConfig,
    w: &MlaLayer,
    q: &Tensor,
    latent: &Tensor,
    k_rope: &Tensor,
    q_pos: &[i64],
    k_pos: &[i64],
) -> Result<Tensor> {
    let (n, t) = (q_pos.len(), k_pos.len());
    let (heads, nope, rope, vh, lat) = (cfg.heads, cfg.qk_nope, cfg.qk_rope, cfg.v_head, cfg.kv_lora_rank);
    // [heads, n, qk_head]
    let q = q.transpose(0, 1).ctx(OP)?.contiguous().ctx(OP)?;
    let mask: Vec<f32> = q_pos
        .iter()
        .flat_map(|&qp| {
            k_pos
                .iter()
                .map(move |&kp| if kp <= qp { 0.0 } else { f32::NEG_INFINITY })
        })
        .collect();
    let mask = Tensor::from_vec(mask, (n, t), q.device()).ctx(OP)?;
    let softmax = |scores: Tensor| -> Result<Tensor> {
        let s = (scores * cfg.attn_scale).ctx(OP)?.broadcast_add(&mask).ctx(OP)?;
        candle_nn::ops::softmax_last_dim(&s).ctx("mla softmax")
    };
    let out = match form {
        Form::Expanded => {
            let kv = dense_linear(latent, &w.kv_b, None)?
                .reshape((t, heads, nope + vh))
                .ctx(OP)?
                .transpose(0, 1)
                .ctx(OP)?;
            let k_nope = kv.narrow(2, 0, nope).ctx(OP)?;
            let v = kv.narrow(2, nope, vh).ctx(OP)?.contiguous().ctx(OP)?;
            let k_pe = k_rope.unsqueeze(0).ctx(OP)?.broadcast_as((heads, t, rope)).ctx(OP)?;
            let k = Tensor::cat(&[&k_nope, &k_pe], 2).ctx(OP)?.contiguous().ctx(OP)?;
            let probs = softmax(q.matmul(&k.t().ctx(OP)?).ctx("mla scores")?)?;
            probs.matmul(&v).ctx("mla values")?
        }
        Form::Absorbed => {
            let q_nope = q.narrow(2, 0, nope).ctx(OP)?.contiguous().ctx(OP)?;
            let q_pe = q
                .narrow(2, nope, rope)
                .ctx(OP)?
                .contiguous()
                .ctx(OP)?
                .reshape((heads * n, rope))
                .ctx(OP)?;
            // [heads, n, nope] x [heads, nope, lat] -> [heads · n, lat]
            let q_lat = q_nope
                .matmul(&w.w_uk)
                .ctx("mla absorb q")?
                .reshape((heads * n, lat))
                .ctx(OP)?;
            let scores = (q_lat.matmul(&latent.t().ctx(OP)?).ctx("mla scores")?
                + q_pe.matmul(&k_rope.t().ctx(OP)?).ctx("mla rope scores")?)
            .ctx(OP)?;
            let probs = softmax(scores.reshape((heads, n, t)).ctx(OP)?)?;
            let o_lat = probs
                .reshape((heads * n, t))
                .ctx(OP)?
                .matmul(latent)
                .ctx("mla latent values")?;
            // [heads, n, lat] x [heads, lat, v]
            o_lat
                .reshape((heads, n, lat))
                .ctx(OP)?
                .matmul(&w.w_uv_t)
                .ctx("mla absorb v")?
        }
    };
    out.transpose(0, 1).ctx(OP)?.reshape((n, heads * vh)).ctx(OP)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::mla::MlaModel;

    /// Both forms on the tiny golden checkpoint's layers, random queries and latents: equal to
    /// float rounding, for a chunk alone and for a few queries after a longer context.
    #[test]
    fn absorbed_equals_expanded() -> Result<()> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/deepseekv2-tiny");
        let m = MlaModel::load(&dir)?;
        let cfg = m.config();
        let dev = candle_core::Device::Cpu;
        for (n, t) in [(7usize, 7usize), (3, 40)] {
            let q = Tensor::randn(0f32, 1.0, (n, cfg.heads, cfg.qk_head()), &dev).ctx(OP)?;
            let lat = Tensor::randn(0f32, 1.0, (t, cfg.kv_lora_rank), &dev).ctx(OP)?;
            let kr = Tensor::randn(0f32, 1.0, (t, cfg.qk_rope), &dev).ctx(OP)?;
            let k_pos: Vec<i64> = (0..t as i64).collect();
            let q_pos = &k_pos[t - n..];
            for w in &m.weights.layers {
                let run = |f| -> Result<Vec<f32>> {
                    let o = attend_as(f, cfg, w, &q, &lat, &kr, q_pos, &k_pos)?;
                    o.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)
                };
                let (a, b) = (run(Form::Absorbed)?, run(Form::Expanded)?);
                let scale = b.iter().fold(0f32, |s, x| s.max(x.abs()));
                let err = a.iter().zip(&b).fold(0f32, |s, (x, y)| s.max((x - y).abs())) / scale;
                assert!(err < 1e-5, "n {n} t {t}: rel err {err:e}");
            }
        }
        assert_eq!(cheaper(cfg, 1, 1000), Form::Absorbed);
        assert_eq!(cheaper(cfg, 1000, 1000), Form::Expanded);
        Ok(())
    }
}
