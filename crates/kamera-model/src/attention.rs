//! Causal (optionally sliding-window) attention over explicit K/V, blocked over queries so each
//! block multiplies only the keys it can see, with a fused scale + mask + softmax candle op.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::error::{CandleCtx, Result};

const OP: &str = "attention";
/// Queries per block.
const BLOCK: usize = 256;

/// Scale, mask by position and softmax the last dim of `[.., rows, keys]` scores, where row `r`
/// belongs to query `q_pos[r % q_pos.len()]` and column `j` to key `k_pos[j]`.
struct MaskedSoftmax<'a> {
    scale: f32,
    q_pos: &'a [i64],
    k_pos: &'a [i64],
    window: Option<usize>,
}

impl MaskedSoftmax<'_> {
    fn visible(&self, q: i64, k: i64) -> bool {
        k <= q && self.window.is_none_or(|w| q - k < w as i64)
    }
}

impl CustomOp1 for MaskedSoftmax<'_> {
    fn name(&self) -> &'static str {
        "masked-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("masked-softmax: expected f32 scores");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("masked-softmax: scores must be contiguous");
        };
        let src = &data[start..end];
        let cols = self.k_pos.len();
        let nq = self.q_pos.len();
        if cols == 0 || nq == 0 || src.len() % (cols * nq) != 0 || layout.dims().last() != Some(&cols) {
            candle_core::bail!(
                "masked-softmax: scores {:?} do not match {nq} queries x {cols} keys",
                layout.dims()
            );
        }
        let mut out = vec![0f32; src.len()];
        out.par_chunks_mut(cols)
            .zip(src.par_chunks(cols))
            .enumerate()
            .for_each(|(r, (o, s))| {
                let q = self.q_pos[r % nq];
                let mut max = f32::NEG_INFINITY;
                for (j, &x) in s.iter().enumerate() {
                    if self.visible(q, self.k_pos[j]) {
                        max = max.max(x * self.scale);
                    }
                }
                if max == f32::NEG_INFINITY {
                    return;
                }
                let mut sum = 0f32;
                for (j, (&x, y)) in s.iter().zip(o.iter_mut()).enumerate() {
                    if self.visible(q, self.k_pos[j]) {
                        *y = (x * self.scale - max).exp();
                        sum += *y;
                    }
                }
                let inv = 1.0 / sum;
                o.iter_mut().for_each(|y| *y *= inv);
            });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

/// `q: [kvh, g, n, hd]` (contiguous) against `k, v: [kvh, t, hd]` (rows contiguous) ->
/// `[kvh, g, n, hd]`. Query `i` sits at `q_pos[i]`, key `j` at `k_pos[j]` (increasing).
pub(crate) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    q_pos: &[i64],
    k_pos: &[i64],
    scale: f64,
    window: Option<usize>,
) -> Result<Tensor> {
    let (kvh, g, n, hd) = q.dims4().ctx(OP)?;
    let mut outs = Vec::with_capacity(n.div_ceil(BLOCK));
    for b0 in (0..n).step_by(BLOCK) {
        let nb = BLOCK.min(n - b0);
        let qp = &q_pos[b0..b0 + nb];
        let (first, last) = (qp[0], qp[nb - 1]);
        // Keys visible to some query of the block: positions in (first - window, last].
        let lo = match window {
            Some(w) => k_pos.partition_point(|&p| p <= first - w as i64),
            None => 0,
        };
        let hi = k_pos.partition_point(|&p| p <= last);
        let kp = &k_pos[lo..hi];
        let qb = if nb == n {
            q.clone()
        } else {
            q.narrow(2, b0, nb).ctx(OP)?.contiguous().ctx(OP)?
        };
        let qb = qb.reshape((kvh, g * nb, hd)).ctx(OP)?;
        if kp.is_empty() {
            outs.push(Tensor::zeros((kvh, g, nb, hd), q.dtype(), q.device()).ctx(OP)?);
            continue;
        }
        let kb = k.narrow(1, lo, hi - lo).ctx(OP)?;
        // Views of the context buffers (any batch stride): candle's matmul reads them in place.
        let vb = v.narrow(1, lo, hi - lo).ctx(OP)?;
        let scores = qb.matmul(&kb.t().ctx(OP)?).ctx("attn scores")?;
        let probs = scores
            .apply_op1_no_bwd(&MaskedSoftmax {
                scale: scale as f32,
                q_pos: qp,
                k_pos: kp,
                window,
            })
            .ctx("masked softmax")?;
        outs.push(
            probs
                .matmul(&vb)
                .ctx("attn values")?
                .reshape((kvh, g, nb, hd))
                .ctx(OP)?,
        );
    }
    if outs.len() == 1 {
        return outs
            .pop()
            .ok_or_else(|| candle_core::Error::Msg("no block".into()))
            .ctx(OP);
    }
    Tensor::cat(&outs, 2).ctx(OP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Plain reference: softmax over visible keys, for one (kv head, group head, query).
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dims: (usize, usize, usize, usize, usize),
        q_pos: &[i64],
        k_pos: &[i64],
        scale: f32,
        window: Option<usize>,
    ) -> Vec<f32> {
        let (kvh, g, n, t, hd) = dims;
        let mut out = vec![0f32; kvh * g * n * hd];
        for h in 0..kvh {
            for gi in 0..g {
                for i in 0..n {
                    let qrow = &q[((h * g + gi) * n + i) * hd..][..hd];
                    let vis: Vec<usize> = (0..t)
                        .filter(|&j| k_pos[j] <= q_pos[i] && window.is_none_or(|w| q_pos[i] - k_pos[j] < w as i64))
                        .collect();
                    let s: Vec<f32> = vis
                        .iter()
                        .map(|&j| {
                            qrow.iter()
                                .zip(&k[(h * t + j) * hd..][..hd])
                                .map(|(a, b)| a * b)
                                .sum::<f32>()
                                * scale
                        })
                        .collect();
                    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    let o = &mut out[((h * g + gi) * n + i) * hd..][..hd];
                    for (&j, w) in vis.iter().zip(&e) {
                        for d in 0..hd {
                            o[d] += w / z * v[(h * t + j) * hd + d];
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn blocked_attention_matches_reference_with_and_without_window() {
        let dev = Device::Cpu;
        let (kvh, g, n, past, hd) = (2, 3, 600, 100, 8);
        let t = past + n;
        let fill = |len: usize, seed: f32| (0..len).map(|i| (i as f32 * 0.731 + seed).sin()).collect::<Vec<f32>>();
        let (q, k, v) = (
            fill(kvh * g * n * hd, 0.1),
            fill(kvh * t * hd, 0.2),
            fill(kvh * t * hd, 0.3),
        );
        let k_pos: Vec<i64> = (50..50 + t as i64).collect();
        let q_pos = &k_pos[past..];
        let qt = Tensor::from_slice(&q, (kvh, g, n, hd), &dev).unwrap();
        let kt = Tensor::from_slice(&k, (kvh, t, hd), &dev).unwrap();
        let vt = Tensor::from_slice(&v, (kvh, t, hd), &dev).unwrap();
        for window in [None, Some(64), Some(512)] {
            let got = attend(&qt, &kt, &vt, q_pos, &k_pos, 0.35, window)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let want = reference(&q, &k, &v, (kvh, g, n, t, hd), q_pos, &k_pos, 0.35, window);
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-4, "window {window:?}: max error {err}");
        }
    }
}
