//! The equal-bytes baseline: instead of a patch on top of the shared canonical KV, store each
//! page's conditioned KV itself (or its dense deficit) for this context in the same added bytes,
//! by a per-group uniform quantiser.
//!
//! The quantiser ([`GroupQuant`]): the values of one matrix (a layer's K or V, tokens × features,
//! row-major) in groups of `group` consecutive values; per group an f16 offset (the group mean)
//! and an f16 step `s`; per value a `bits`-bit midrise code k ∈ [−2^(b−1), 2^(b−1) − 1] read as
//! offset + (k + ½)·s. `s` is the best of 16 candidates (c/16 · max|x − offset| / 2^(b−1),
//! c = 1..=16) by squared error, so 1-bit codes become offset ± ≈ mean|x − offset| (the
//! binarisation of Rastegari et al., "XNOR-Net", ECCV 2016, eq. 4, with a mean offset). A byte
//! budget picks the widest codes whose groups still fit (b + 32/group bits per value, groups at
//! most [`MAX_GROUP`] values): at ~10% of bf16 (1.6 bits per value) that is 1-bit codes in groups
//! of ~60.

use std::time::Instant;

use half::f16;
use kamera_model::Context;
use kamera_ops::{ChunkKv, LayerKv, Mat};

use crate::error::{Error, ModelCtx, OpsCtx, Result};
use crate::evaluator::{Evaluator, Prepared, ms};
use crate::kv::slice;
use crate::task_result::{TaskMethod, method_cost};

/// The largest group the budget may pick (one offset and step per this many values).
pub const MAX_GROUP: usize = 4096;

/// Code widths the budget chooses from, widest first.
const WIDTHS: [u32; 5] = [8, 4, 3, 2, 1];

/// A per-group uniform quantiser: `bits`-bit codes, one f16 offset and step per `group` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupQuant {
    pub bits: u32,
    pub group: usize,
}

impl GroupQuant {
    /// The widest codes (and then the smallest groups) whose bytes for `values` values fit
    /// `bytes`.
    pub fn for_budget(values: usize, bytes: usize) -> Result<GroupQuant> {
        let bad = |detail: String| Error::Invalid {
            op: "GroupQuant::for_budget",
            detail,
        };
        if values == 0 {
            return Err(bad("no values to quantise".into()));
        }
        for bits in WIDTHS {
            let codes = (values * bits as usize).div_ceil(8);
            let Some(left) = bytes.checked_sub(codes) else { continue };
            // 4 bytes (f16 offset + f16 step) per group.
            let groups = left / 4;
            if groups == 0 {
                continue;
            }
            let group = values.div_ceil(groups).max(1);
            if group <= MAX_GROUP {
                return Ok(GroupQuant { bits, group });
            }
        }
        Err(bad(format!(
            "{bytes} bytes cannot hold {values} values at 1 bit each with groups of at most {MAX_GROUP}"
        )))
    }

    /// Stored bytes of `values` values: packed codes, then 4 bytes per group.
    pub fn bytes(&self, values: usize) -> usize {
        (values * self.bits as usize).div_ceil(8) + 4 * values.div_ceil(self.group)
    }

    /// `x` quantised and read back (what a reader of the stored codes gets).
    pub fn round_trip(&self, x: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(x.len());
        for g in x.chunks(self.group) {
            out.extend(self.group_round_trip(g));
        }
        out
    }

    fn group_round_trip(&self, g: &[f32]) -> Vec<f32> {
        let offset = f16::from_f32(g.iter().sum::<f32>() / g.len() as f32).to_f32();
        let half = (1i32 << (self.bits - 1)) as f32;
        let reach = g.iter().fold(0.0f32, |m, &v| m.max((v - offset).abs()));
        let read = |step: f32| -> Vec<f32> {
            g.iter()
                .map(|&v| {
                    let k = ((v - offset) / step).floor().clamp(-half, half - 1.0);
                    offset + (k + 0.5) * step
                })
                .collect()
        };
        if !(reach > 0.0 && reach.is_finite()) {
            return vec![offset; g.len()];
        }
        let sse = |y: &[f32]| g.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>();
        let mut best: Option<(f64, Vec<f32>)> = None;
        for c in 1..=16 {
            let step = f16::from_f32(c as f32 / 16.0 * reach / half).to_f32();
            if step <= 0.0 || !step.is_finite() {
                continue;
            }
            let y = read(step);
            let e = sse(&y);
            if best.as_ref().is_none_or(|(b, _)| e < *b) {
                best = Some((e, y));
            }
        }
        best.map_or_else(|| vec![offset; g.len()], |(_, y)| y)
    }
}

/// `kv` with every layer's K and V quantised as one budget of `fraction` of its bf16 payload,
/// and the stored bytes. The same [`GroupQuant`] serves every matrix.
pub fn quantise_kv(kv: &ChunkKv, fraction: f64) -> Result<(ChunkKv, usize)> {
    let values: usize = kv
        .layers()
        .iter()
        .map(|l| l.k.rows() * l.k.cols() + l.v.rows() * l.v.cols())
        .sum();
    let budget = (fraction * (values * 2) as f64).floor() as usize;
    let q = GroupQuant::for_budget(values, budget)?;
    let mut bytes = 0;
    let mut layers = Vec::with_capacity(kv.layers().len());
    for l in kv.layers() {
        let mut one = |m: &Mat| {
            let n = m.rows() * m.cols();
            bytes += q.bytes(n);
            Mat::from_f32(m.rows(), m.cols(), q.round_trip(&m.to_f32_vec())).ops("kvq")
        };
        layers.push(LayerKv {
            k: one(&l.k)?,
            v: one(&l.v)?,
        });
    }
    Ok((ChunkKv::new(*kv.layout(), kv.offset(), layers).ops("kvq")?, bytes))
}

/// `f` of `a` and `b` element-wise, in every layer's K and V (same shapes; `a`'s offset).
pub fn zip_kv(a: &ChunkKv, b: &ChunkKv, f: impl Fn(f32, f32) -> f32) -> Result<ChunkKv> {
    let one = |x: &Mat, y: &Mat| {
        let v = x
            .to_f32_vec()
            .iter()
            .zip(y.to_f32_vec())
            .map(|(&p, q)| f(p, q))
            .collect();
        Mat::from_f32(x.rows(), x.cols(), v).ops("kvq")
    };
    let layers = a
        .layers()
        .iter()
        .zip(b.layers())
        .map(|(x, y)| {
            Ok(LayerKv {
                k: one(&x.k, &y.k)?,
                v: one(&x.v, &y.v)?,
            })
        })
        .collect::<Result<_>>()?;
    ChunkKv::new(*a.layout(), a.offset(), layers).ops("kvq")
}

impl Evaluator<'_> {
    /// `kvq:B` / `kvq-deficit:B` on one task: the first page as its canonical KV (exact there:
    /// nothing precedes it but the system prefix), every later page as its conditioned KV (the
    /// `full` prefill's slice) quantised in B of its bf16 KV bytes, or as the relocated canonical
    /// KV plus its deficit (conditioned − relocated canonical, in place) quantised so. Bytes are
    /// the quantiser's payload (codes, offsets, steps), no record header.
    pub(crate) fn kv_quant(&self, p: &Prepared, fraction: f64, deficit: bool) -> Result<(Context, TaskMethod)> {
        let t = Instant::now();
        let mut ctx = p.sys_ctx.clone();
        let (mut bytes, mut max_share) = (0usize, 0.0f64);
        for (i, (cond, (&off, toks))) in p.cond.iter().zip(p.offs.iter().zip(&p.chunk_toks)).enumerate() {
            let placed = slice(&p.blind, off, toks.len())?;
            let page = if i == 0 {
                placed
            } else if deficit {
                let delta = zip_kv(cond, &placed, |c, b| c - b)?;
                let (q, n) = quantise_kv(&delta, fraction)?;
                bytes += n;
                max_share = max_share.max(n as f64 / p.chunk_bytes[i] as f64);
                zip_kv(&placed, &q, |b, d| b + d)?
            } else {
                let (q, n) = quantise_kv(cond, fraction)?;
                bytes += n;
                max_share = max_share.max(n as f64 / p.chunk_bytes[i] as f64);
                q
            };
            ctx.push(&page).model("kvq push")?;
        }
        let mut cost = method_cost(
            1.0 + bytes as f64 / p.canon_bytes as f64,
            p.blind_ms,
            p.full_ms + ms(t),
            0.0,
        );
        cost.chunk_bytes_max = max_share;
        Ok((ctx, cost))
    }
}
