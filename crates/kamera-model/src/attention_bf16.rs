//! Prefill attention on bf16 tiles (AVX512_BF16, with a bf16 prefill precision): per KV head
//! and block of queries, scores Q·Kᵀ and outputs P·V through the tile kernel of
//! `quant::bf16`, scale, mask and softmax in f32 between them.

use rayon::prelude::*;

use crate::attention::softmax_row;
use crate::quant::{AlignedPairs, bf16};

/// Most queries per block (a task): smaller than the f32 path's, so a sliding window computes
/// fewer masked scores and causal blocks balance over the cores.
const BLOCK: usize = 128;

/// A block's score rows in bytes when every block reads every key ([`attend_shared`]).
const SCORES_BYTES: usize = 640 << 10;

/// Queries per block for `n` queries and `kvh` heads: at most [`BLOCK`], and small enough that
/// a short prefill (a question over a long context) still gives every thread a few tasks.
fn block_size(n: usize, kvh: usize) -> usize {
    let wanted = rayon::current_num_threads().div_ceil(kvh.max(1)).max(1);
    n.div_ceil(wanted).next_multiple_of(16).clamp(16, BLOCK)
}

/// Per-thread buffers of a block, reused across blocks and calls (their sizes repeat).
#[derive(Default)]
struct Scratch {
    keys: AlignedPairs,
    values: AlignedPairs,
    work: Work,
}

/// A block's queries as pairs, its scores, one softmax row and the probabilities as pairs.
#[derive(Default)]
struct Work {
    queries: AlignedPairs,
    scores: Vec<f32>,
    row: Vec<f32>,
    probs: AlignedPairs,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
    /// K and V of every head packed once by [`attend_shared`] (taken out while in use).
    static PACKED: std::cell::RefCell<Vec<AlignedPairs>> = std::cell::RefCell::default();
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
    let mask = Mask {
        q_pos,
        k_pos,
        scale,
        window,
    };
    if n <= BLOCK {
        return attend_shared(q, (kvh, g, n, hd), k, v, mask, None);
    }
    let bs = block_size(n, kvh);
    // Every block sees the same keys (no mask cuts them: the vision tower's full attention,
    // where every query sees every key): each head's K and V packed once, not per block.
    if visible(&q_pos[..bs], k_pos, window) == visible(q_pos, k_pos, window) {
        // Blocks small enough that a block's scores over every key stay in L2 (32 queries of
        // 4,784 keys: 612 KiB).
        let (lo, hi) = visible(q_pos, k_pos, window);
        let shared_bs = (SCORES_BYTES / (4 * g * (hi - lo).max(1))).clamp(16, bs) / 16 * 16;
        return attend_shared(q, (kvh, g, n, hd), k, v, mask, Some(shared_bs));
    }
    by_block(q, (kvh, g, n, hd), bs, |qb, sc, o| {
        let (lo, hi) = visible(&q_pos[qb.b0..qb.b0 + qb.nb], k_pos, window);
        if lo < hi {
            let h = qb.h;
            bf16::pack_rows_into(&k.data[h * k.head_stride + lo * hd..], hd, hi - lo, hd, &mut sc.keys);
            bf16::pack_value_pairs_into(&v.data[h * v.head_stride + lo * hd..], hd, hi - lo, hd, &mut sc.values);
            qb.attend(&sc.keys, &sc.values, (lo, hi), mask, &mut sc.work, o);
        }
    })
}

/// Queries that all read nearly the same keys (few queries: a question after a long context, at
/// most [`BLOCK`]; or any number where no mask cuts the keys, in blocks of `bs`): each head's K
/// and V are packed once (heads and channels in parallel) and its blocks share them; few
/// queries go in blocks of 16 or more, enough tasks for every core.
fn attend_shared(
    q: &[f32],
    (kvh, g, n, hd): (usize, usize, usize, usize),
    k: Rows<'_>,
    v: Rows<'_>,
    mask: Mask<'_>,
    bs: Option<usize>,
) -> Vec<f32> {
    let (lo, hi) = visible(mask.q_pos, mask.k_pos, mask.window);
    if lo >= hi {
        return vec![0f32; kvh * g * n * hd];
    }
    let kn = hi - lo;
    let mut packed = PACKED.with(|p| {
        p.try_borrow_mut()
            .map(|mut b| std::mem::take(&mut *b))
            .unwrap_or_default()
    });
    packed.resize_with(2 * kvh, AlignedPairs::default);
    packed.par_iter_mut().enumerate().for_each(|(j, buf)| {
        let h = j / 2;
        if j % 2 == 0 {
            bf16::pack_rows_into(&k.data[h * k.head_stride + lo * hd..], hd, kn, hd, buf);
        } else {
            bf16::pack_value_pairs_into(&v.data[h * v.head_stride + lo * hd..], hd, kn, hd, buf);
        }
    });
    let per_head = rayon::current_num_threads().saturating_mul(2).div_ceil(kvh).max(1);
    let bs = bs.unwrap_or_else(|| n.div_ceil(per_head).next_multiple_of(16).max(16));
    let out = by_block(q, (kvh, g, n, hd), bs, |qb, sc, o| {
        let (keys, values) = (&packed[2 * qb.h], &packed[2 * qb.h + 1]);
        qb.attend(keys, values, (lo, hi), mask, &mut sc.work, o);
    });
    PACKED.with(|p| {
        if let Ok(mut b) = p.try_borrow_mut() {
            *b = packed;
        }
    });
    out
}

/// Who sees which keys, and the scores' scale: query `i` at `q_pos[i]` sees the keys at
/// `k_pos` in `(q − window, q]`.
#[derive(Clone, Copy)]
struct Mask<'a> {
    q_pos: &'a [i64],
    k_pos: &'a [i64],
    scale: f32,
    window: Option<usize>,
}

/// Runs `f` on every KV head's blocks of `bs` queries in parallel, each with this thread's
/// scratch and the block's output `[g, nb, hd]` (zeros on entry), and gathers the outputs into
/// `[kvh, g, n, hd]`.
fn by_block(
    q: &[f32],
    (kvh, g, n, hd): (usize, usize, usize, usize),
    bs: usize,
    f: impl Fn(&Queries<'_>, &mut Scratch, &mut [f32]) + Sync,
) -> Vec<f32> {
    let blocks = n.div_ceil(bs);
    let outs: Vec<(usize, usize, Vec<f32>)> = (0..kvh * blocks)
        .into_par_iter()
        .map(|t| {
            let (h, b) = (t / blocks, t % blocks);
            let (b0, nb) = (b * bs, bs.min(n - b * bs));
            let qb = Queries { q, g, n, hd, h, b0, nb };
            let mut o = vec![0f32; g * nb * hd];
            // Nothing in `f` may wait on other rayon tasks: the thread could run another block
            // and borrow the scratch twice.
            SCRATCH.with_borrow_mut(|sc| f(&qb, sc, &mut o));
            (h, b0, o)
        })
        .collect();
    gather(outs, (kvh, g, n, hd))
}

/// Keys visible to some query at `qp` (increasing): positions in (first − window, last], as a
/// range of key indices.
fn visible(qp: &[i64], k_pos: &[i64], window: Option<usize>) -> (usize, usize) {
    let lo = window.map_or(0, |w| k_pos.partition_point(|&p| p <= qp[0] - w as i64));
    (lo, k_pos.partition_point(|&p| p <= qp[qp.len() - 1]))
}

/// Blocks' outputs (`[g, nb, hd]` each, with their head and first query) into `[kvh, g, n, hd]`.
fn gather(outs: Vec<(usize, usize, Vec<f32>)>, (kvh, g, n, hd): (usize, usize, usize, usize)) -> Vec<f32> {
    let mut out = vec![0f32; kvh * g * n * hd];
    for (h, b0, o) in outs {
        let nb = o.len() / (g * hd);
        for gi in 0..g {
            let dst = ((h * g + gi) * n + b0) * hd;
            out[dst..dst + nb * hd].copy_from_slice(&o[gi * nb * hd..(gi + 1) * nb * hd]);
        }
    }
    out
}

/// One KV head's block of `nb` queries from `b0` of `q: [kvh, g, n, hd]`, its `g` query heads
/// stacked (`m = g · nb` rows).
#[derive(Clone, Copy)]
struct Queries<'a> {
    q: &'a [f32],
    g: usize,
    n: usize,
    hd: usize,
    h: usize,
    b0: usize,
    nb: usize,
}

impl Queries<'_> {
    /// Into `o: [g, nb, hd]`, against keys `lo..hi` packed as `keys` ([`bf16::pack_rows_into`])
    /// and `values` ([`bf16::pack_value_pairs_into`]): scores, then per query the softmax over
    /// the keys it sees (zero elsewhere), then P · V.
    fn attend(
        &self,
        keys: &[u32],
        values: &[u32],
        (lo, hi): (usize, usize),
        mask: Mask<'_>,
        w: &mut Work,
        o: &mut [f32],
    ) {
        let Queries { q, g, n, hd, h, b0, nb } = *self;
        let Mask {
            q_pos,
            k_pos,
            scale,
            window,
        } = mask;
        let (m, kn) = (g * nb, hi - lo);
        let qp = &q_pos[b0..b0 + nb];
        // Scores as long as the value pairs (`bf16::key_pairs`), zero past the last key.
        let ks = 2 * bf16::key_pairs(kn);
        let a = w.queries.grown(m * hd / 2);
        for gi in 0..g {
            let at = ((h * g + gi) * n + b0) * hd;
            let dst = gi * nb * hd / 2;
            bf16::round_pairs(&q[at..at + nb * hd], &mut a[dst..dst + nb * hd / 2]);
        }
        let s = bf16::grown(&mut w.scores, m * ks);
        // SAFETY: s holds m rows of ks >= kn columns; the CPU has the kernel (the caller's precision).
        unsafe { bf16::product(a, m, hd / 2, keys, kn, s.as_mut_ptr(), ks) };
        let pa = w.probs.grown(m * ks / 2);
        let row = bf16::grown(&mut w.row, ks);
        let kp = &k_pos[lo..hi];
        for (r, (par, sr)) in pa.chunks_exact_mut(ks / 2).zip(s.chunks_exact(ks)).enumerate() {
            let qpos = qp[r % nb];
            let vhi = kp.partition_point(|&p| p <= qpos);
            let vlo = window
                .map_or(0, |w| kp.partition_point(|&p| p <= qpos - w as i64))
                .min(vhi);
            row[..vlo].fill(0.0);
            row[vhi..].fill(0.0);
            if vlo < vhi {
                softmax_row(&sr[vlo..vhi], &mut row[vlo..vhi], scale);
            }
            bf16::round_pairs(row, par);
        }
        // SAFETY: o holds m rows of hd; pairs ks / 2 match the value pairs (zero rows past kn).
        unsafe { bf16::product(pa, m, ks / 2, values, hd, o.as_mut_ptr(), hd) };
    }
}
