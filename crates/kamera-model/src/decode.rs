//! One-token decode on plain buffers: each layer's norms, products on the quantized codes, RoPE,
//! attention and the K/V append without a tensor per op, run by a [`team`](crate::team) of
//! threads that take every product's rows in chunks (a worker on a slower core takes fewer),
//! multiplying on the codes in f32 or, with [`crate::DecodePrecision::Int8`], on an int8
//! input. In f32, the same arithmetic as the tensor path of [`crate::Model::extend`] (checked
//! against prefill: KL < 1e-6).

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use kamera_ops::{LayerKv, Mat, RopeSpec};

use crate::activation::gated;
use crate::attention::{HeadScratch, attend_head};
use crate::config::Config;
use crate::context::Context;
use crate::error::{CandleCtx, Error, OpsCtx, Result};
use crate::quant::{Linear, Prepared, Q8Input, View, quantize_input};
use crate::team::{Shared, SpinBarrier, share};
use crate::weights::{LayerWeights, Weights};

const OP: &str = "decode";

/// A layer's vectors (norm weights, biases) as plain values, read once at load.
#[derive(Debug)]
struct LayerVectors {
    attn_norm: Vec<f32>,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    post_ffn_norm: Option<Vec<f32>>,
}

/// Every vector weight of a model as plain values (a few KB per layer).
#[derive(Debug)]
pub(crate) struct Vectors {
    layers: Vec<LayerVectors>,
    out_norm: Vec<f32>,
}

fn values(t: &candle_core::Tensor) -> Result<Vec<f32>> {
    t.flatten_all().ctx(OP)?.to_vec1::<f32>().ctx(OP)
}

fn maybe(t: &Option<candle_core::Tensor>) -> Result<Option<Vec<f32>>> {
    t.as_ref().map(values).transpose()
}

impl Vectors {
    pub(crate) fn of(w: &Weights) -> Result<Vectors> {
        let layer = |l: &LayerWeights| -> Result<LayerVectors> {
            Ok(LayerVectors {
                attn_norm: values(&l.attn_norm)?,
                bq: maybe(&l.bq)?,
                bk: maybe(&l.bk)?,
                bv: maybe(&l.bv)?,
                q_norm: maybe(&l.q_norm)?,
                k_norm: maybe(&l.k_norm)?,
                post_attn_norm: maybe(&l.post_attn_norm)?,
                ffn_norm: values(&l.ffn_norm)?,
                post_ffn_norm: maybe(&l.post_ffn_norm)?,
            })
        };
        Ok(Vectors {
            layers: w.layers.iter().map(layer).collect::<Result<_>>()?,
            out_norm: values(&w.out_norm)?,
        })
    }
}

/// `out = x / sqrt(mean(x²) + eps) · w` (candle's `rms_norm`), row by row of `w.len()` values.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(w.len()).zip(out.chunks_exact_mut(w.len())) {
        let ss = crate::lanes::dot(xr, xr);
        let r = 1.0 / (ss / w.len() as f32 + eps).sqrt();
        for ((o, &x), &w) in or.iter_mut().zip(xr).zip(w) {
            *o = x * r * w;
        }
    }
}

/// [`rms_norm`] in place.
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    for xr in x.chunks_exact_mut(w.len()) {
        let ss = crate::lanes::dot(xr, xr);
        let r = 1.0 / (ss / w.len() as f32 + eps).sqrt();
        for (x, &w) in xr.iter_mut().zip(w) {
            *x = *x * r * w;
        }
    }
}

fn add(y: &mut [f32], b: &Option<Vec<f32>>) {
    if let Some(b) = b {
        y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
    }
}

/// Weights below which a step runs on one thread (a thread start costs more than it saves).
const TEAM_WEIGHTS: usize = 1 << 20;

/// Each layer's new K and V row.
type NewRows = Vec<(Vec<f32>, Vec<f32>)>;

/// The model pieces one step reads.
pub(crate) struct Step<'a> {
    pub cfg: &'a Config,
    pub weights: &'a Weights,
    pub vectors: &'a Vectors,
    pub rope: &'a RopeSpec,
    pub precision: crate::DecodePrecision,
}

/// The buffers the team shares during a step (phases separated by the barrier).
struct Buffers {
    q: Shared,
    k: Shared,
    v: Shared,
    att: Shared,
    o: Shared,
    gate: Shared,
    up: Shared,
    logits: Shared,
}

/// What one step reads in place: the weights (7 per layer, then the LM head) and the
/// context's K/V buffers.
struct Frame<'a> {
    views: &'a [View<'a>],
    kv: &'a [(&'a [f32], &'a [f32])],
    cap: usize,
    /// The new token's row in the context.
    row: usize,
    rotary: i64,
    mrope: bool,
    /// Each product phase's next chunk (4 per layer, then the LM head).
    chunks: &'a [AtomicUsize],
}

/// Rows per chunk of a phase's `total` rows: about 8 chunks per worker, so a worker on a
/// slower or busier core takes fewer and the team waits at most about one chunk at the barrier.
fn chunk_rows(total: usize, n: usize) -> usize {
    total.div_ceil(8 * n).next_multiple_of(16)
}

/// The rows `lo..hi` of chunk `c` of `total` rows, or `None` when none are left.
fn chunk(c: usize, size: usize, total: usize) -> Option<Range<usize>> {
    let lo = c * size;
    (lo < total).then(|| lo..(lo + size).min(total))
}

/// A worker's product phases: the step's precision and team size, and its int8 input buffer,
/// kept from phase to phase (allocating it per phase showed as malloc-lock waits).
struct Phases {
    precision: crate::DecodePrecision,
    n: usize,
    x8: Q8Input,
}

impl Phases {
    /// `x` rounded for the int8 products of `views` when the step asks for them.
    fn input<'v>(&mut self, x: &[f32], views: impl IntoIterator<Item = View<'v>>) -> Option<&Q8Input> {
        quantize_input(&mut self.x8, x, self.precision, views)
    }

    /// `[ys_j] = W_j x` over the rows of the matrices together, in chunks taken from `next`
    /// until none is left (every worker of the phase calls it with the same counter).
    fn products(&mut self, jobs: &[(View<'_>, &Shared)], x: &[f32], next: &AtomicUsize) {
        let n = self.n;
        let x8 = self.input(x, jobs.iter().map(|(v, _)| *v));
        products(jobs, x, x8, next, n);
    }
}

/// [`Phases::products`] on the input `x8` made for it.
fn products(jobs: &[(View<'_>, &Shared)], x: &[f32], x8: Option<&Q8Input>, next: &AtomicUsize, n: usize) {
    let total: usize = jobs.iter().map(|(v, _)| v.rows()).sum();
    let size = chunk_rows(total, n);
    let mut preps: Vec<Option<Prepared>> = jobs.iter().map(|_| None).collect();
    while let Some(rows) = chunk(next.fetch_add(1, Ordering::Relaxed), size, total) {
        let mut base = 0;
        for ((view, out), prep) in jobs.iter().zip(&mut preps) {
            let (lo, hi) = (rows.start.max(base), rows.end.min(base + view.rows()));
            if lo < hi {
                let prep = prep.get_or_insert_with(|| view.prepare(x, x8));
                // SAFETY: this worker alone took the chunk holding these rows in this phase.
                view.rows_into(x, prep, lo - base, unsafe { out.part(lo - base..hi - base) });
            }
            base += view.rows();
        }
    }
}

impl Step<'_> {
    /// Appends the token whose input row is `x` (`hidden`) to `context` at its next row (rotary
    /// position `rotary`, or `[p; 3]` ids for M-RoPE models when `mrope`), written into the
    /// buffers [`Context::reserve`]d by the caller and not committed. Returns the logits and
    /// the token's K/V per layer.
    pub(crate) fn run(
        &self,
        x: Vec<f32>,
        context: &mut Context,
        rotary: i64,
        mrope: bool,
    ) -> Result<(Vec<f32>, Vec<LayerKv>)> {
        let cfg = self.cfg;
        let (hd, heads, kvh, hidden) = (cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.hidden);
        if x.len() != hidden {
            return Err(Error::Shape {
                op: OP,
                detail: format!("input row has {} values, hidden size is {hidden}", x.len()),
            });
        }
        let kv_dim = kvh * hd;
        let lm: &Linear = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
        let mut ws: Vec<&Linear> = Vec::with_capacity(7 * cfg.n_layers + 1);
        for l in &self.weights.layers {
            ws.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        }
        ws.push(lm);
        let weights: usize = ws.iter().map(|w| w.dims().map_or(0, |(r, c)| r * c)).sum();
        let n = if weights < TEAM_WEIGHTS {
            1
        } else {
            crate::team::Contention::workers(rayon::current_num_threads().clamp(1, heads))
        };
        let b = Buffers {
            q: Shared::zeros(heads * hd),
            k: Shared::zeros(kv_dim),
            v: Shared::zeros(kv_dim),
            att: Shared::zeros(heads * hd),
            o: Shared::zeros(hidden),
            gate: Shared::zeros(cfg.ffn),
            up: Shared::zeros(cfg.ffn),
            logits: Shared::zeros(cfg.vocab),
        };
        let row = context.len();
        let failure: Mutex<Option<Error>> = Mutex::new(None);
        let barrier = SpinBarrier::new(n);
        let started = std::time::Instant::now();
        let new_rows = Linear::with_views(&ws, |views| {
            // [rows, columns] of Q, K, V, O, gate, up, down per layer, then the LM head: a
            // worker writes rows by these sizes, so a weight of another shape is an error here.
            let layer = [
                (heads * hd, hidden),
                (kv_dim, hidden),
                (kv_dim, hidden),
                (hidden, heads * hd),
                (cfg.ffn, hidden),
                (cfg.ffn, hidden),
                (hidden, cfg.ffn),
            ];
            for (i, v) in views.iter().enumerate() {
                let want = if i + 1 == views.len() {
                    (cfg.vocab, hidden)
                } else {
                    layer[i % 7]
                };
                if (v.rows(), v.cols()) != want {
                    return Err(Error::Shape {
                        op: OP,
                        detail: format!(
                            "weight {i} is [{}, {}], expected [{}, {}]",
                            v.rows(),
                            v.cols(),
                            want.0,
                            want.1
                        ),
                    });
                }
            }
            let chunks: Vec<AtomicUsize> = (0..4 * cfg.n_layers + 1).map(|_| AtomicUsize::new(0)).collect();
            context.with_buffers(|kv, cap| {
                let frame = Frame {
                    chunks: &chunks,
                    views,
                    kv,
                    cap,
                    row,
                    rotary,
                    mrope,
                };
                crate::team::run(n, |w, n| self.worker(&frame, &b, &barrier, &failure, x.clone(), w, n))
            })
        })??;
        let waited: Vec<u64> = new_rows.iter().map(|r| r.2).collect();
        crate::team::Contention::record(started.elapsed(), &waited);
        if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        let mut outs = new_rows.into_iter();
        let (logits, rows, _) = outs.next().expect("worker 0's result");
        let mut kv = Vec::with_capacity(cfg.n_layers);
        for (l, (k, v)) in rows.into_iter().enumerate() {
            context.write_row(l, &k, &v)?;
            kv.push(LayerKv {
                k: Mat::from_f32(1, kv_dim, k).ops(OP)?,
                v: Mat::from_f32(1, kv_dim, v).ops(OP)?,
            });
        }
        Ok((logits, kv))
    }

    /// Worker `w` of `n`: the whole step on its share of every product and of the query heads.
    /// Never returns early (the others would wait at the barrier): a failure is recorded and the
    /// step runs on. Worker 0 returns the logits and each layer's new K/V row; every worker, the
    /// nanoseconds it waited at the barrier.
    #[allow(clippy::too_many_arguments)]
    // Long: a worker's whole decode between barriers; its phases share the per-thread buffers and the barrier schedule.
    fn worker(
        &self,
        f: &Frame<'_>,
        b: &Buffers,
        barrier: &SpinBarrier,
        failure: &Mutex<Option<Error>>,
        mut x: Vec<f32>,
        w: usize,
        n: usize,
    ) -> (Vec<f32>, NewRows, u64) {
        let cfg = self.cfg;
        let (hd, heads, kvh, eps) = (cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.rms_eps as f32);
        let fail = |e: Error| {
            let mut slot = failure.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(e);
        };
        let mut h = vec![0f32; cfg.hidden];
        let mut o = vec![0f32; cfg.hidden];
        let mut scratch = HeadScratch::default();
        // Kept from layer to layer, as the int8 input in `phases`.
        let mut phases = Phases {
            precision: self.precision,
            n,
            x8: Q8Input::default(),
        };
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        let mut rows = Vec::new();
        let mut waited = 0u64;
        // Each product phase's chunk counter, in the order every worker reaches them.
        let mut phase = 0;
        let mut next = || {
            phase += 1;
            &f.chunks[phase - 1]
        };
        let my_heads = share(heads, w, n);
        for (l, vecs) in self.vectors.layers.iter().enumerate() {
            let wv = &f.views[7 * l..7 * l + 7];
            rms_norm(&x, &vecs.attn_norm, eps, &mut h);
            phases.products(&[(wv[0], &b.q), (wv[1], &b.k), (wv[2], &b.v)], &h, next());
            waited += barrier.wait();
            // Every worker finishes Q, K and V itself (biases, QK-norm, RoPE: a few thousand
            // values), then attends with its own query heads.
            // SAFETY: q, k and v are written only in the phase before the barrier.
            unsafe {
                q.clear();
                q.extend_from_slice(b.q.all());
                k.clear();
                k.extend_from_slice(b.k.all());
                v.clear();
                v.extend_from_slice(b.v.all());
            }
            add(&mut q, &vecs.bq);
            add(&mut k, &vecs.bk);
            add(&mut v, &vecs.bv);
            if let (Some(qn), Some(kn)) = (&vecs.q_norm, &vecs.k_norm) {
                rms_norm_in_place(&mut q, qn, eps);
                rms_norm_in_place(&mut k, kn, eps);
            }
            let rotated = if f.mrope {
                let p = [[f.rotary; 3]];
                self.rope
                    .apply_mrope(l, &mut q, heads, &p)
                    .and_then(|_| self.rope.apply_mrope(l, &mut k, kvh, &p))
            } else {
                self.rope
                    .apply(l, &mut q, heads, &[f.rotary])
                    .and_then(|_| self.rope.apply(l, &mut k, kvh, &[f.rotary]))
            };
            if let Err(e) = rotated.ops(OP) {
                fail(e);
            }
            // Keys sit at consecutive positions from the context's offset; the new one is last.
            let lo = match cfg.sliding_window.filter(|_| cfg.local_layers[l]) {
                Some(win) => (f.row + 1).saturating_sub(win),
                None => 0,
            };
            let (kb, vb) = f.kv[l];
            // SAFETY: worker w alone writes its heads' rows of att in this phase.
            let att = unsafe { b.att.part(my_heads.start * hd..my_heads.end * hd) };
            let group = heads / kvh;
            for (i, out) in my_heads.clone().zip(att.chunks_exact_mut(hd)) {
                let g = i / group;
                let kv = (&kb[g * f.cap * hd..], &vb[g * f.cap * hd..]);
                let new = (&k[g * hd..(g + 1) * hd], &v[g * hd..(g + 1) * hd]);
                let qi = &q[i * hd..(i + 1) * hd];
                attend_head(qi, kv, lo..f.row, Some(new), cfg.attn_scale as f32, &mut scratch, out);
            }
            if w == 0 {
                rows.push((k.clone(), v.clone()));
            }
            waited += barrier.wait();
            // SAFETY: att was written only in the phase before the barrier.
            phases.products(&[(wv[3], &b.o)], unsafe { b.att.all() }, next());
            waited += barrier.wait();
            // SAFETY: o was written only in the phase before the barrier.
            o.copy_from_slice(unsafe { b.o.all() });
            if let Some(pn) = &vecs.post_attn_norm {
                rms_norm_in_place(&mut o, pn, eps);
            }
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            rms_norm(&x, &vecs.ffn_norm, eps, &mut h);
            // Gate and up in the same chunks, so each worker activates the rows it computed.
            let (size, counter) = (chunk_rows(cfg.ffn, n), next());
            let h8 = phases.input(&h, wv[4..6].iter().copied());
            let mut preps: Option<[Prepared; 2]> = None;
            while let Some(rows) = chunk(counter.fetch_add(1, Ordering::Relaxed), size, cfg.ffn) {
                let preps = preps.get_or_insert_with(|| [wv[4].prepare(&h, h8), wv[5].prepare(&h, h8)]);
                // SAFETY: this worker alone took the chunk holding these rows in this phase.
                let (gate, up) = unsafe { (b.gate.part(rows.clone()), b.up.part(rows.clone())) };
                wv[4].rows_into(&h, &preps[0], rows.start, gate);
                wv[5].rows_into(&h, &preps[1], rows.start, up);
                gated(cfg.activation, gate, up);
            }
            waited += barrier.wait();
            // SAFETY: gate was written only in the phase before the barrier.
            phases.products(&[(wv[6], &b.o)], unsafe { b.gate.all() }, next());
            waited += barrier.wait();
            // SAFETY: o was written only in the phase before the barrier.
            o.copy_from_slice(unsafe { b.o.all() });
            if let Some(pn) = &vecs.post_ffn_norm {
                rms_norm_in_place(&mut o, pn, eps);
            }
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
        }
        rms_norm(&x, &self.vectors.out_norm, eps, &mut h);
        phases.products(&[(f.views[f.views.len() - 1], &b.logits)], &h, next());
        waited += barrier.wait();
        // SAFETY: the logits were written only in the phase before the barrier.
        let logits = if w == 0 {
            unsafe { b.logits.all() }.to_vec()
        } else {
            Vec::new()
        };
        (logits, rows, waited)
    }
}
