//! Causal (optionally sliding-window) attention over explicit K/V, blocked over queries so each
//! block multiplies only the keys it can see, with a fused scale + mask + softmax candle op.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::error::{CandleCtx, Result};
use crate::lanes::{dot, exp_nonpositive};

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
                // Keys are in increasing position: the visible ones are one contiguous run.
                let q = self.q_pos[r % nq];
                let hi = self.k_pos.partition_point(|&k| k <= q);
                let lo = self
                    .window
                    .map_or(0, |w| self.k_pos.partition_point(|&k| k <= q - w as i64));
                if lo < hi {
                    softmax_row(&s[lo..hi], &mut o[lo..hi], self.scale);
                }
            });
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

/// `o = softmax(scale · s)` over one row, vectorised (AVX-512, else AVX2 + FMA where the CPU
/// has them).
pub(crate) fn softmax_row(s: &[f32], o: &mut [f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { softmax_row_avx512(s, o, scale) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { softmax_row_avx2(s, o, scale) };
    }
    softmax_row_generic(s, o, scale)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn softmax_row_avx512(s: &[f32], o: &mut [f32], scale: f32) {
    use std::arch::x86_64::*;
    let n = s.len().min(o.len());
    let (sp, op) = (s.as_ptr(), o.as_mut_ptr());
    let tail = (n % 16) as u32;
    let (full, km) = (n - tail as usize, ((1u32 << tail) - 1) as __mmask16);
    // SAFETY: every load and store is below n (full vectors) or masked to the tail.
    unsafe {
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..full).step_by(16) {
            m = _mm512_max_ps(m, _mm512_loadu_ps(sp.add(i)));
        }
        m = _mm512_mask_max_ps(m, km, m, _mm512_maskz_loadu_ps(km, sp.add(full)));
        let (vs, vm) = (_mm512_set1_ps(scale), _mm512_set1_ps(-_mm512_reduce_max_ps(m) * scale));
        let mut acc = _mm512_setzero_ps();
        for i in (0..full).step_by(16) {
            let e = crate::lanes::exp_nonpositive_x16(_mm512_fmadd_ps(_mm512_loadu_ps(sp.add(i)), vs, vm));
            _mm512_storeu_ps(op.add(i), e);
            acc = _mm512_add_ps(acc, e);
        }
        let x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(km, sp.add(full)), vs, vm);
        let e = _mm512_maskz_mov_ps(km, crate::lanes::exp_nonpositive_x16(x));
        _mm512_mask_storeu_ps(op.add(full), km, e);
        let inv = _mm512_set1_ps(1.0 / _mm512_reduce_add_ps(_mm512_add_ps(acc, e)));
        for i in (0..full).step_by(16) {
            _mm512_storeu_ps(op.add(i), _mm512_mul_ps(_mm512_loadu_ps(op.add(i)), inv));
        }
        _mm512_mask_storeu_ps(op.add(full), km, _mm512_mul_ps(e, inv));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_row_avx2(s: &[f32], o: &mut [f32], scale: f32) {
    softmax_row_generic(s, o, scale)
}

/// Eight-lane max and sum (so the compiler can keep them in one vector register).
#[inline(always)]
fn softmax_row_generic(s: &[f32], o: &mut [f32], scale: f32) {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in m.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&m)
        .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a })
        * scale;
    let mut acc = [0f32; 8];
    let (mut os, mut ss) = (o.chunks_exact_mut(8), s.chunks_exact(8));
    for (y, x) in (&mut os).zip(&mut ss) {
        for t in 0..8 {
            y[t] = exp_nonpositive(x[t].mul_add(scale, -max));
            acc[t] += y[t];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (y, &x) in os.into_remainder().iter_mut().zip(ss.remainder()) {
        *y = exp_nonpositive(x.mul_add(scale, -max));
        sum += *y;
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|y| *y *= inv);
}

/// `q: [kvh, g, n, hd]` (contiguous) against `k, v: [kvh, t, hd]` (rows contiguous) ->
/// `[kvh, g, n, hd]`. Query `i` sits at `q_pos[i]`, key `j` at `k_pos[j]` (increasing).
// Many arguments: Q, K, V, their positions and the mask's window and precision: one call per layer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    q_pos: &[i64],
    k_pos: &[i64],
    scale: f64,
    window: Option<usize>,
    bf16: bool,
) -> Result<Tensor> {
    let (kvh, g, n, hd) = q.dims4().ctx(OP)?;
    if n == 1
        && let Some(out) = attend_one(q, k, v, q_pos[0], k_pos, scale as f32, window)?
    {
        return Ok(out);
    }
    #[cfg(target_arch = "x86_64")]
    if bf16
        && n > 1
        && hd % 16 == 0
        && let Some(out) = attend_bf16(q, k, v, q_pos, k_pos, scale as f32, window)?
    {
        return Ok(out);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bf16;
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

/// [`crate::attention_bf16::attend`] on K/V read in place; `None` where they are not laid out as
/// the context lays them out.
#[cfg(target_arch = "x86_64")]
fn attend_bf16(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    q_pos: &[i64],
    k_pos: &[i64],
    scale: f32,
    window: Option<usize>,
) -> Result<Option<Tensor>> {
    use crate::attention_bf16::Rows;
    let dims = q.dims4().ctx(OP)?;
    let (Some((kg, k0, ks)), Some((vg, v0, vs))) = (rows_in_place(k, dims.3), rows_in_place(v, dims.3)) else {
        return Ok(None);
    };
    let (candle_core::Storage::Cpu(CpuStorage::F32(kd)), candle_core::Storage::Cpu(CpuStorage::F32(vd))) = (&*kg, &*vg)
    else {
        return Ok(None);
    };
    let qv = q.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?;
    let keys = Rows {
        data: &kd[k0..],
        head_stride: ks,
    };
    let values = Rows {
        data: &vd[v0..],
        head_stride: vs,
    };
    let out = crate::attention_bf16::attend(&qv, dims, keys, values, q_pos, k_pos, scale, window);
    Tensor::from_vec(out, dims, q.device()).ctx(OP).map(Some)
}

/// A context tensor's f32 values and its `[heads, rows, hd]` strides, read in place (rows
/// contiguous); `None` for any other layout.
fn rows_in_place(
    t: &Tensor,
    hd: usize,
) -> Option<(impl std::ops::Deref<Target = candle_core::Storage> + '_, usize, usize)> {
    let (guard, layout) = t.storage_and_layout();
    let stride = layout.stride();
    if !matches!(&*guard, candle_core::Storage::Cpu(CpuStorage::F32(_)))
        || stride.len() != 3
        || stride[2] != 1
        || stride[1] != hd
    {
        return None;
    }
    Some((guard, layout.start_offset(), stride[0]))
}

/// One query (decode): `q: [kvh, g, 1, hd]` against the visible keys of `k, v` read in place
/// from the context's buffers (see [`attend_one_rows`]). `None` where the keys are not laid out
/// as the context lays them out.
fn attend_one(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    q_pos: i64,
    k_pos: &[i64],
    scale: f32,
    window: Option<usize>,
) -> Result<Option<Tensor>> {
    let (kvh, g, _, hd) = q.dims4().ctx(OP)?;
    let (Some((kg, k0, ks)), Some((vg, v0, vs))) = (rows_in_place(k, hd), rows_in_place(v, hd)) else {
        return Ok(None);
    };
    let qv = q.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)?;
    let (candle_core::Storage::Cpu(CpuStorage::F32(kd)), candle_core::Storage::Cpu(CpuStorage::F32(vd))) = (&*kg, &*vg)
    else {
        return Ok(None);
    };
    let hi = k_pos.partition_point(|&p| p <= q_pos);
    let lo = window.map_or(0, |w| k_pos.partition_point(|&p| p <= q_pos - w as i64));
    let mut out = vec![0f32; kvh * g * hd];
    let rows = OneQuery {
        keys: (&kd[k0..], ks),
        values: (&vd[v0..], vs),
        hd,
        group: g,
        visible: lo..hi,
        scale,
    };
    rows.attend(&qv, &mut out);
    Tensor::from_vec(out, (kvh, g, 1, hd), q.device()).ctx(OP).map(Some)
}

/// One query's attention over K/V rows read in place: head `h`'s row `j` of `keys.0` starts at
/// `h · keys.1 + j · hd` (the same for values); query head `i` reads kv head `i / group`.
pub(crate) struct OneQuery<'a> {
    pub keys: (&'a [f32], usize),
    pub values: (&'a [f32], usize),
    pub hd: usize,
    pub group: usize,
    /// The visible rows.
    pub visible: std::ops::Range<usize>,
    pub scale: f32,
}

impl OneQuery<'_> {
    /// `out[i] = Σ_j softmax(scale · q_i·k_j) v_j` for every query head `i` of `q`
    /// (`heads · hd`); the same arithmetic as the blocked path without its tensor plumbing.
    pub(crate) fn attend(&self, q: &[f32], out: &mut [f32]) {
        let (hd, g) = (self.hd, self.group);
        let (lo, hi) = (self.visible.start, self.visible.end);
        out.fill(0.0);
        if lo >= hi {
            return;
        }
        let head = |(i, o): (usize, &mut [f32])| {
            let h = i / g;
            let keys = &self.keys.0[h * self.keys.1..];
            let vals = &self.values.0[h * self.values.1..];
            let mut scratch = HeadScratch::default();
            attend_head(
                &q[i * hd..(i + 1) * hd],
                (keys, vals),
                lo..hi,
                None,
                self.scale,
                &mut scratch,
                o,
            );
        };
        if (hi - lo) * (out.len() / hd) >= 2048 {
            out.par_chunks_mut(hd).enumerate().for_each(head);
        } else {
            out.chunks_mut(hd).enumerate().for_each(head);
        }
    }
}

/// One query head's score and probability rows, reused across heads and steps.
#[derive(Default)]
pub(crate) struct HeadScratch {
    scores: Vec<f32>,
    probs: Vec<f32>,
}

/// `out = Σ_j softmax_j(scale · q·k_j) · v_j` for one query head `q` (`hd` values) over the rows
/// `rows` of `kv = (keys, values)` (row `j` at `j · hd`), then `new`'s key and value after them
/// (a decode step's own row, not yet in the buffers): the decode attention of the team
/// (`decode.rs`) and of [`OneQuery`]. AVX-512 FMAs where the CPU has them and `hd` is whole
/// vectors of 16, else 8 independent lanes ([`dot`]).
pub(crate) fn attend_head(
    q: &[f32],
    kv: (&[f32], &[f32]),
    rows: std::ops::Range<usize>,
    new: Option<(&[f32], &[f32])>,
    scale: f32,
    scratch: &mut HeadScratch,
    out: &mut [f32],
) {
    let hd = q.len();
    let (keys, vals) = (
        &kv.0[rows.start * hd..rows.end * hd],
        &kv.1[rows.start * hd..rows.end * hd],
    );
    let HeadScratch { scores, probs } = scratch;
    #[cfg(target_arch = "x86_64")]
    let avx512 = hd % 16 == 0 && out.len() == hd && std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    let (new_k, new_v) = (new.map(|n| n.0), new.map(|n| n.1));
    if avx512 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512F; every row read is a whole `hd` slice checked above.
        unsafe {
            head_avx512::scores(q, keys, new_k, scores)
        };
    } else {
        scores.clear();
        scores.extend(keys.chunks_exact(hd).chain(new_k).map(|k| dot(q, k)));
    }
    probs.resize(scores.len(), 0.0);
    softmax_row(scores, probs, scale);
    if avx512 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above; `out` has `hd` values.
        unsafe {
            head_avx512::weighted(probs, vals, new_v, out)
        };
    } else {
        out.fill(0.0);
        for (&p, v) in probs.iter().zip(vals.chunks_exact(hd).chain(new_v)) {
            for (o, &x) in out.iter_mut().zip(v) {
                *o += p * x;
            }
        }
    }
}

/// [`attend_head`]'s two passes on AVX-512: `hd` a multiple of 16.
#[cfg(target_arch = "x86_64")]
mod head_avx512 {
    use std::arch::x86_64::*;

    /// `scores = [q·k for each row of keys, then q·new]`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores(q: &[f32], keys: &[f32], new: Option<&[f32]>, scores: &mut Vec<f32>) {
        let hd = q.len();
        scores.clear();
        for k in keys.chunks_exact(hd).chain(new) {
            let mut acc = _mm512_setzero_ps();
            for (a, b) in q.chunks_exact(16).zip(k.chunks_exact(16)) {
                // SAFETY: both chunks hold 16 values.
                acc = unsafe { _mm512_fmadd_ps(_mm512_loadu_ps(a.as_ptr()), _mm512_loadu_ps(b.as_ptr()), acc) };
            }
            scores.push(_mm512_reduce_add_ps(acc));
        }
    }

    /// `out = Σ_j probs[j] · row j of [vals, then new]`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weighted(probs: &[f32], vals: &[f32], new: Option<&[f32]>, out: &mut [f32]) {
        let hd = out.len();
        for o in out.chunks_exact_mut(16) {
            o.fill(0.0);
        }
        for (&p, v) in probs.iter().zip(vals.chunks_exact(hd).chain(new)) {
            let pv = _mm512_set1_ps(p);
            for (o, x) in out.chunks_exact_mut(16).zip(v.chunks_exact(16)) {
                // SAFETY: both chunks hold 16 values.
                unsafe {
                    let y = _mm512_fmadd_ps(pv, _mm512_loadu_ps(x.as_ptr()), _mm512_loadu_ps(o.as_ptr()));
                    _mm512_storeu_ps(o.as_mut_ptr(), y);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// One head's decode attention (`attend_head`, the team's and `OneQuery`'s) equals the plain
    /// reference over rows 3..t of the buffers and a new row after them: with 64 values a head
    /// (AVX-512 where the CPU has it) and with 24 (the portable lanes).
    #[test]
    fn one_heads_attention_with_its_new_row_matches_reference() {
        for hd in [64, 24] {
            let t = 40;
            let val = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
            let (q, k, v): (Vec<f32>, Vec<f32>, Vec<f32>) = (
                (0..hd).map(|i| val(i + 1)).collect(),
                (0..(t + 1) * hd).map(|i| val(i + 17)).collect(),
                (0..(t + 1) * hd).map(|i| val(i + 29)).collect(),
            );
            // The reference sees keys 3..=t (the buffers' rows 3..t and the new row at t).
            let pos: Vec<i64> = (0..(t + 1) as i64).collect();
            let (k_vis, v_vis) = (&k[3 * hd..], &v[3 * hd..]);
            let want = reference(
                &q,
                k_vis,
                v_vis,
                (1, 1, 1, t - 2, hd),
                &[t as i64],
                &pos[3..],
                0.125,
                None,
            );
            let mut got = vec![9f32; hd];
            let new = (&k[t * hd..], &v[t * hd..]);
            attend_head(
                &q,
                (&k, &v),
                3..t,
                Some(new),
                0.125,
                &mut HeadScratch::default(),
                &mut got,
            );
            for (d, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!((a - b).abs() < 1e-5, "hd {hd} value {d}: {a} vs {b}");
            }
        }
    }

    /// Plain reference: softmax over visible keys, for one (kv head, group head, query).
    // Many arguments: the slow reference takes what `attend` takes, flat.
    #[allow(clippy::too_many_arguments)]
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
    fn fast_exp_matches_libm() {
        let mut worst = 0f32;
        for i in 0..200_000 {
            let x = -(i as f32) * 0.0005;
            let (a, b) = (exp_nonpositive(x), x.exp());
            if b > 1e-30 {
                worst = worst.max((a - b).abs() / b);
            }
        }
        assert!(worst < 1e-6, "relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-100.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn vector_softmax_matches_the_portable_one() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 40.0 - 20.0
        };
        for n in [1, 5, 15, 16, 17, 31, 64, 100, 4128] {
            let mut s: Vec<f32> = (0..n).map(|_| next()).collect();
            if n > 4 {
                // masked keys, as the causal and window masks leave them
                s[n - 1] = f32::NEG_INFINITY;
                s[1] = f32::NEG_INFINITY;
            }
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            softmax_row(&s, &mut a, 0.125);
            softmax_row_generic(&s, &mut b, 0.125);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-6 * y.max(1e-3), "n={n}: {x} vs {y}");
            }
            assert!((a.iter().sum::<f32>() - 1.0).abs() < 1e-5, "n={n}");
        }
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
            let got = attend(&qt, &kt, &vt, q_pos, &k_pos, 0.35, window, false)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let want = reference(&q, &k, &v, (kvh, g, n, t, hd), q_pos, &k_pos, 0.35, window);
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-4, "window {window:?}: max error {err}");
            // One query (decode's path) on a strided view of a larger buffer, as the context holds it.
            let cap = t + 40;
            let mut kbuf = vec![9f32; kvh * cap * hd];
            let mut vbuf = vec![9f32; kvh * cap * hd];
            for h in 0..kvh {
                kbuf[h * cap * hd..][..t * hd].copy_from_slice(&k[h * t * hd..][..t * hd]);
                vbuf[h * cap * hd..][..t * hd].copy_from_slice(&v[h * t * hd..][..t * hd]);
            }
            let kv = Tensor::from_vec(kbuf, (kvh, cap, hd), &dev)
                .unwrap()
                .narrow(1, 0, t)
                .unwrap();
            let vv = Tensor::from_vec(vbuf, (kvh, cap, hd), &dev)
                .unwrap()
                .narrow(1, 0, t)
                .unwrap();
            let last = n - 1;
            let q1: Vec<f32> = (0..kvh * g)
                .flat_map(|hg| q[(hg * n + last) * hd..][..hd].to_vec())
                .collect();
            let q1t = Tensor::from_slice(&q1, (kvh, g, 1, hd), &dev).unwrap();
            let got = attend(&q1t, &kv, &vv, &q_pos[last..], &k_pos, 0.35, window, false)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let want1: Vec<f32> = (0..kvh * g)
                .flat_map(|hg| want[(hg * n + last) * hd..][..hd].to_vec())
                .collect();
            let err = got.iter().zip(&want1).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-4, "one query, window {window:?}: max error {err}");
        }
    }

    /// The bf16 tiles against the f32 reference: GQA heads, a last block of 44 queries, an odd
    /// number of visible keys, K/V as strided views of larger buffers, with and without window.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn bf16_attention_matches_reference() {
        if !crate::PrefillPrecision::Bf16.available() {
            kamera_ops::testkit::skip(
                "kamera-model attention::tests::bf16_attention_matches_reference",
                "this CPU has no AVX512_BF16",
            );
            return;
        }
        let dev = Device::Cpu;
        // Blocks of queries, and a few queries after a long past (the short path, packed once).
        for (n, past) in [(300, 37), (37, 300), (5, 401)] {
            let (kvh, g, hd) = (2, 3, 32);
            let (t, cap) = (past + n, past + n + 9);
            let fill = |len: usize, seed: f32| (0..len).map(|i| (i as f32 * 0.731 + seed).sin()).collect::<Vec<f32>>();
            let (q, k, v) = (
                fill(kvh * g * n * hd, 0.1),
                fill(kvh * t * hd, 0.2),
                fill(kvh * t * hd, 0.3),
            );
            let strided = |x: &[f32]| {
                let mut buf = vec![9f32; kvh * cap * hd];
                for h in 0..kvh {
                    buf[h * cap * hd..][..t * hd].copy_from_slice(&x[h * t * hd..][..t * hd]);
                }
                Tensor::from_vec(buf, (kvh, cap, hd), &dev)
                    .unwrap()
                    .narrow(1, 0, t)
                    .unwrap()
            };
            let (kt, vt) = (strided(&k), strided(&v));
            let k_pos: Vec<i64> = (50..50 + t as i64).collect();
            let causal = &k_pos[past..];
            // Every query at the last key's position: nothing masked, so every block sees the
            // same keys (the vision tower's full attention), the shared-keys path.
            let all = vec![k_pos[t - 1]; n];
            let qt = Tensor::from_slice(&q, (kvh, g, n, hd), &dev).unwrap();
            for (window, q_pos) in [
                (None, causal),
                (Some(64), causal),
                (Some(101), causal),
                (None, &all[..]),
            ] {
                let got = attend(&qt, &kt, &vt, q_pos, &k_pos, 0.35, window, true)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                let want = reference(&q, &k, &v, (kvh, g, n, t, hd), q_pos, &k_pos, 0.35, window);
                let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                eprintln!("bf16 attention, {n} queries, window {window:?}: max error {err}");
                assert!(
                    got.iter().all(|x| x.is_finite()) && err < 5e-3,
                    "{n} queries, window {window:?}: max error {err}"
                );
            }
        }
    }
}
