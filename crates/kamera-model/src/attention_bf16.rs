//! Prefill attention on bf16 tiles (AVX512_BF16, with a bf16 prefill precision): per KV head
//! and block of queries, scores Q·Kᵀ and outputs P·V through the tile kernel of
//! `quant::bf16`, scale, mask and softmax in f32 between them.

use rayon::prelude::*;

use crate::attention::softmax_row;
use crate::quant::bf16;

/// Most queries per block (a task): smaller than the f32 path's, so a sliding window computes
/// fewer masked scores and causal blocks balance over the cores.
const BLOCK: usize = 128;

/// Queries per block for `n` queries and `kvh` heads: at most [`BLOCK`], and small enough that
/// a short prefill (a question over a long context) still gives every thread a few tasks.
fn block_size(n: usize, kvh: usize) -> usize {
    let wanted = rayon::current_num_threads().div_ceil(kvh.max(1)).max(1);
    n.div_ceil(wanted).next_multiple_of(16).clamp(16, BLOCK)
}

/// K or V rows read in place: head `h`'s row `j` starts at `h · head_stride + j · hd`.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub data: &'a [f32],
    pub head_stride: usize,
}

/// `q: [kvh, g, n, hd]` (contiguous) against `k, v` rows at `k_pos` (increasing) -> `[kvh, g, n,
/// hd]`; query `i` at `q_pos[i]` sees keys in `(q − window, q]`. `hd` a multiple of 16.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    q: &[f32],
    (kvh, g, n, hd): (usize, usize, usize, usize),
    k: Rows<'_>,
    v: Rows<'_>,
    q_pos: &[i64],
    k_pos: &[i64],
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    assert!(hd % 16 == 0 && q.len() == kvh * g * n * hd && q_pos.len() == n);
    let mut out = vec![0f32; kvh * g * n * hd];
    let bs = block_size(n, kvh);
    let blocks = n.div_ceil(bs);
    let outs: Vec<(usize, usize, Vec<f32>)> = (0..kvh * blocks)
        .into_par_iter()
        .map(|t| {
            let (h, b) = (t / blocks, t % blocks);
            let b0 = b * bs;
            let nb = bs.min(n - b0);
            (
                h,
                b0,
                block(q, (g, n, hd), h, b0, nb, k, v, q_pos, k_pos, scale, window),
            )
        })
        .collect();
    for (h, b0, o) in outs {
        let nb = o.len() / (g * hd);
        for gi in 0..g {
            let dst = ((h * g + gi) * n + b0) * hd;
            out[dst..dst + nb * hd].copy_from_slice(&o[gi * nb * hd..(gi + 1) * nb * hd]);
        }
    }
    out
}

/// One KV head's block of `nb` queries from `b0`, its `g` query heads stacked: `[g, nb, hd]`.
#[allow(clippy::too_many_arguments)]
fn block(
    q: &[f32],
    (g, n, hd): (usize, usize, usize),
    h: usize,
    b0: usize,
    nb: usize,
    k: Rows<'_>,
    v: Rows<'_>,
    q_pos: &[i64],
    k_pos: &[i64],
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    let m = g * nb;
    let mut o = vec![0f32; m * hd];
    let qp = &q_pos[b0..b0 + nb];
    // Keys visible to some query of the block: positions in (first − window, last].
    let lo = window.map_or(0, |w| k_pos.partition_point(|&p| p <= qp[0] - w as i64));
    let hi = k_pos.partition_point(|&p| p <= qp[nb - 1]);
    if lo >= hi {
        return o;
    }
    let kn = hi - lo;
    let mut a = Vec::with_capacity(m * hd / 2);
    for gi in 0..g {
        let at = ((h * g + gi) * n + b0) * hd;
        a.extend(bf16::to_pairs(&q[at..at + nb * hd]));
    }
    let keys = &k.data[h * k.head_stride + lo * hd..];
    let packed = bf16::pack_rows(keys, hd, kn, hd);
    // Scores with an even row length (the value pairs), the last column 0 past an odd count.
    let ks = kn + kn % 2;
    let mut s = vec![0f32; m * ks];
    // SAFETY: s holds m rows of ks >= kn columns; the CPU has the kernel (the caller's precision).
    unsafe { bf16::product(&a, m, hd / 2, &packed, kn, s.as_mut_ptr(), ks) };
    let mut p = vec![0f32; m * ks];
    for (r, (pr, sr)) in p.chunks_exact_mut(ks).zip(s.chunks_exact(ks)).enumerate() {
        let qpos = qp[r % nb];
        let vhi = k_pos[lo..hi].partition_point(|&kp| kp <= qpos);
        let vlo = window.map_or(0, |w| k_pos[lo..hi].partition_point(|&kp| kp <= qpos - w as i64));
        if vlo < vhi {
            softmax_row(&sr[vlo..vhi], &mut pr[vlo..vhi], scale);
        }
    }
    let pa = bf16::to_pairs(&p);
    let values = &v.data[h * v.head_stride + lo * hd..];
    let vpacked = bf16::pack_value_pairs(values, hd, kn, hd);
    // SAFETY: o holds m rows of hd; pairs ks / 2 match the value pairs (a zero row past an odd kn).
    unsafe { bf16::product(&pa, m, ks / 2, &vpacked, hd, o.as_mut_ptr(), hd) };
    o
}
