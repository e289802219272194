//! The CPU reference of the device transformer: the same forward as kernels/model.cu + cuBLAS
//! in plain f32 loops, with the device's bf16 roundings (weights, GEMM inputs, stored K/V), so
//! parity is tight; kamera-model checks it against its candle runner on real weights.

use crate::{HostWeights, ModelSpec};
use half::bf16;

fn r16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

/// `x[n, inp] · w[out, inp]ᵀ`.
fn matmul(x: &[f32], w: &[f32], n: usize, inp: usize, out: usize) -> Vec<f32> {
    let mut y = vec![0f32; n * out];
    for i in 0..n {
        for o in 0..out {
            let (a, b) = (&x[i * inp..(i + 1) * inp], &w[o * inp..(o + 1) * inp]);
            y[i * out + o] = a.iter().zip(b).map(|(p, q)| p * q).sum();
        }
    }
    y
}

fn rms(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let d = w.len();
    x.chunks(d)
        .flat_map(|r| {
            let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f32>() / d as f32 + eps).sqrt();
            r.iter().zip(w).map(move |(v, g)| v * inv * g).collect::<Vec<_>>()
        })
        .collect()
}

/// One layer's K and V rows, `[n, kv_dim]` each, f32.
pub type LayerRows = (Vec<f32>, Vec<f32>);

/// The reference forward of `tokens` at positions 0..n: last-token logits and every layer's
/// post-RoPE K and V (`[n, kv_dim]`, bf16-rounded as the device stores them). Slow (plain
/// loops): for parity tests on small shapes and a few tokens of a real model.
pub fn reference_prefill(spec: &ModelSpec, w: &HostWeights, tokens: &[u32]) -> (Vec<f32>, Vec<LayerRows>) {
    let (h, f, qd, kvd, hd) = (spec.hidden, spec.ffn, spec.q_dim(), spec.kv_dim(), spec.head_dim);
    let n = tokens.len();
    let emb = r16(&w.embed);
    let mut x: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| {
            emb[t as usize * h..(t as usize + 1) * h]
                .iter()
                .map(|v| v * spec.embed_scale)
        })
        .collect();
    let pos: Vec<i64> = (0..n as i64).collect();
    let mut kvs = Vec::new();
    for (l, lw) in w.layers.iter().enumerate() {
        let a = r16(&rms(&x, &lw.attn_norm, spec.rms_eps));
        let mut q = matmul(&a, &r16(&lw.wq), n, h, qd);
        let mut k = matmul(&a, &r16(&lw.wk), n, h, kvd);
        let mut v = matmul(&a, &r16(&lw.wv), n, h, kvd);
        if let Some([bq, bk, bv]) = &lw.bias {
            for (m, b) in [(&mut q, bq), (&mut k, bk), (&mut v, bv)] {
                for (i, x) in m.iter_mut().enumerate() {
                    *x += b[i % b.len()];
                }
            }
        }
        if let Some([qn, kn]) = &lw.qk_norm {
            q = rms(&q, qn, spec.rms_eps);
            k = rms(&k, kn, spec.rms_eps);
        }
        spec.rope
            .apply(l, &mut q, spec.heads, &pos)
            .expect("RoPE of a checked spec");
        spec.rope
            .apply(l, &mut k, spec.kv_heads, &pos)
            .expect("RoPE of a checked spec");
        let (k, v) = (r16(&k), r16(&v));
        let group = spec.heads / spec.kv_heads;
        let mut att = vec![0f32; n * qd];
        for hh in 0..spec.heads {
            let g = hh / group;
            for i in 0..n {
                let lo = spec.windows[l].map_or(0, |win| (i + 1).saturating_sub(win));
                let qi = &q[i * qd + hh * hd..i * qd + (hh + 1) * hd];
                let s: Vec<f32> = (lo..=i)
                    .map(|j| {
                        let kj = &k[j * kvd + g * hd..j * kvd + (g + 1) * hd];
                        qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * spec.attn_scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for d in 0..hd {
                    att[i * qd + hh * hd + d] =
                        (lo..=i).zip(&e).map(|(j, p)| p * v[j * kvd + g * hd + d]).sum::<f32>() / z;
                }
            }
        }
        let mut o = matmul(&r16(&att), &r16(&lw.wo), n, qd, h);
        if let Some(pn) = &lw.post_attn_norm {
            o = rms(&o, pn, spec.rms_eps);
        }
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let m = r16(&rms(&x, &lw.ffn_norm, spec.rms_eps));
        let g = matmul(&m, &r16(&lw.w_gate), n, h, f);
        let u = matmul(&m, &r16(&lw.w_up), n, h, f);
        let act: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| {
                let a = if spec.gelu {
                    0.5 * g * (1.0 + (0.797_884_6 * (g + 0.044715 * g * g * g)).tanh())
                } else {
                    g / (1.0 + (-g).exp())
                };
                a * u
            })
            .collect();
        let mut d = matmul(&r16(&act), &r16(&lw.w_down), n, f, h);
        if let Some(pn) = &lw.post_ffn_norm {
            d = rms(&d, pn, spec.rms_eps);
        }
        x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        kvs.push((k, v));
    }
    let last = r16(&rms(&x[(n - 1) * h..], &w.out_norm, spec.rms_eps));
    let lm = r16(w.lm_head.as_ref().unwrap_or(&w.embed));
    (matmul(&last, &lm, 1, h, spec.vocab), kvs)
}
