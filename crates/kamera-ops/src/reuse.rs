//! Fused reuse: R(δ)·(canonical + P Wᵀ) written into a destination KV buffer in one pass over
//! the chunk, and context assembly from several placed chunks (KAMERA.md, "The operator").

use std::mem::MaybeUninit;

use half::bf16;
use rayon::prelude::*;

use crate::chunk::{ChunkKv, LayerKv};
use crate::error::{Error, Result, shape};
use crate::layout::KvLayout;
use crate::lowrank::Factors;
use crate::patch::Patch;
use crate::relocate::shift;
use crate::rope::{RopeSpec, Rotation};
use crate::stream;
use crate::tensor::{Buf, DType, Elem, Mat};

/// The chunk relocated to `to` with its patch (if any) applied: one pass, no intermediate. Each
/// output matrix is built by appending its rows as they come out of the pass, so a new buffer
/// is written once (no zeroing first) and memory the allocator hands back is used as is.
pub fn reuse(canonical: &ChunkKv, patch: Option<&Patch>, rope: &RopeSpec, to: i64) -> Result<ChunkKv> {
    const OP: &str = "reuse";
    let (layout, n, dtype) = (*canonical.layout(), canonical.n_tokens(), canonical.dtype());
    let delta = check_place(OP, canonical, patch, rope, &layout, to)?;
    let layers = (0..layout.n_layers)
        .into_par_iter()
        .map(|l| {
            let channel = |v_channel: bool, cols: usize| -> Result<Mat> {
                // f32 and bf16: computed in place in the new buffer's capacity, then counted.
                let pass = |out: Out<'_>| fused(canonical, patch, rope, l, v_channel, delta, out);
                match dtype {
                    DType::F32 => return Mat::new(n, cols, Buf::F32(computed(n * cols, |d| pass(Out::Rows(d)))?)),
                    DType::Bf16 => return Mat::new(n, cols, Buf::Bf16(computed(n * cols, |d| pass(Out::Bf16(d)))?)),
                    DType::F16 => {}
                }
                let mut buf = Buf::with_capacity(dtype, n * cols);
                reuse_rows(canonical, patch, rope, l, v_channel, delta, &mut |_, row| {
                    buf.extend_f32(row)
                })?;
                Mat::new(n, cols, buf)
            };
            Ok(LayerKv {
                k: channel(false, layout.k_features())?,
                v: channel(true, layout.v_features())?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    ChunkKv::new(layout, to, layers)
}

/// A new buffer of `len` values computed in place in its capacity by `fill`, which writes every
/// one of them when it returns Ok (no zeroing first).
fn computed<T>(len: usize, fill: impl FnOnce(&mut [MaybeUninit<T>]) -> Result<()>) -> Result<Vec<T>> {
    let mut v = Vec::with_capacity(len);
    fill(&mut v.spare_capacity_mut()[..len])?;
    // SAFETY: `fill` wrote all `len` values (it returned Ok), within the capacity.
    unsafe { v.set_len(len) };
    Ok(v)
}

/// Checks a reuse request (layouts, RoPE spec, destination rows, patch shape, positions) and
/// returns the shift δ the chunk turns by. Every backend validates through this one function.
pub fn check_reuse(
    op: &'static str,
    canonical: &ChunkKv,
    patch: Option<&Patch>,
    rope: &RopeSpec,
    dst: &ChunkKv,
    dst_row: usize,
) -> Result<i64> {
    let n = canonical.n_tokens();
    if dst_row.checked_add(n).is_none_or(|end| end > dst.n_tokens()) {
        return Err(shape(
            op,
            "destination rows",
            format!("at least {dst_row} + {n}"),
            dst.n_tokens(),
        ));
    }
    let to = dst
        .offset()
        .checked_add(dst_row as i64)
        .ok_or_else(|| shape(op, "destination position", "no overflow", dst.offset()))?;
    check_place(op, canonical, patch, rope, dst.layout(), to)
}

/// Checks that `canonical` (with `patch`) can be placed at position `to` of a buffer laid out as
/// `layout` (the RoPE spec, the layouts, the patch's shape, the shift) and returns the shift δ:
/// [`check_reuse`] without a destination chunk, for callers writing into their own buffers.
pub fn check_place(
    op: &'static str,
    canonical: &ChunkKv,
    patch: Option<&Patch>,
    rope: &RopeSpec,
    layout: &KvLayout,
    to: i64,
) -> Result<i64> {
    let own = *canonical.layout();
    own.check_rope(op, rope)?;
    if *layout != own {
        return Err(shape(
            op,
            "destination layout",
            format!("{own:?}"),
            format!("{layout:?}"),
        ));
    }
    if let Some(p) = patch {
        p.check_fits(op, canonical)?;
    }
    shift(op, canonical.offset(), to)
}

/// Writes the relocated, patched chunk into rows `dst_row..dst_row + n` of `dst`; the chunk
/// lands at position `dst.offset() + dst_row`. `dst` may be stored in another dtype. Layers run
/// in parallel; each channel forms its patch a block of rows at a time as a GEMM and rotates and
/// stores those rows while they are in cache.
pub fn reuse_into(
    canonical: &ChunkKv,
    patch: Option<&Patch>,
    rope: &RopeSpec,
    dst: &mut ChunkKv,
    dst_row: usize,
) -> Result<()> {
    const OP: &str = "reuse_into";
    let delta = check_reuse(OP, canonical, patch, rope, dst, dst_row)?;
    dst.layers_mut().par_iter_mut().enumerate().try_for_each(|(l, out)| {
        let n = canonical.n_tokens();
        for (v_channel, m) in [(false, &mut out.k), (true, &mut out.v)] {
            with_rows_mut(m, dst_row, n, |o| fused(canonical, patch, rope, l, v_channel, delta, o))?;
        }
        Ok(())
    })
}

/// Calls `f` with where rows `dst_row..` of `m` go: computed in place when `m` is f32, else
/// handed to a store converting each block to `m`'s dtype.
fn with_rows_mut(m: &mut Mat, dst_row: usize, rows: usize, f: impl FnOnce(Out<'_>) -> Result<()>) -> Result<()> {
    let cols = m.cols();
    fn store<D: Elem>(d: &mut [D], at: usize, row: &[f32]) {
        for (e, r) in d[at..at + row.len()].iter_mut().zip(row) {
            *e = D::from_f32(*r);
        }
    }
    match m.data_mut() {
        Buf::F32(d) => f(Out::Rows(as_uninit(&mut d[dst_row * cols..(dst_row + rows) * cols]))),
        Buf::F16(d) => f(Out::Sink(&mut |t, row| store(d, (dst_row + t) * cols, row))),
        Buf::Bf16(d) => f(Out::Bf16(as_uninit(&mut d[dst_row * cols..(dst_row + rows) * cols]))),
    }
}

/// One channel (K, or V with `v_channel`) of layer `layer` of `canonical`, shifted by `delta` and
/// patched, handed to `sink(t, rows)` in order, as f32 blocks of whole rows from row `t`: how a caller writes reused
/// rows straight into its own buffers (a model's context) without an intermediate chunk. Inputs
/// are validated by the caller ([`check_reuse`], [`check_place`]); a non-finite row is an error naming its index.
pub fn reuse_rows(
    canonical: &ChunkKv,
    patch: Option<&Patch>,
    rope: &RopeSpec,
    layer: usize,
    v_channel: bool,
    delta: i64,
    sink: &mut dyn FnMut(usize, &[f32]),
) -> Result<()> {
    fused(canonical, patch, rope, layer, v_channel, delta, Out::Sink(sink))
}

/// [`reuse_rows`] written straight into head-first buffers (a model context's): head `h`'s row
/// `t` of the chunk lands at `dst[(h · cap + row0 + t) · width..]`, `width` the channel's
/// features / `groups`. Each block is computed in its final place (no scratch rows, no copy).
#[allow(clippy::too_many_arguments)]
pub fn reuse_heads(
    canonical: &ChunkKv,
    patch: Option<&Patch>,
    rope: &RopeSpec,
    layer: usize,
    v_channel: bool,
    delta: i64,
    dst: &mut [f32],
    heads: Heads,
) -> Result<()> {
    const OP: &str = "reuse_heads";
    let layout = canonical.layout();
    let cols = if v_channel {
        layout.v_features()
    } else {
        layout.k_features()
    };
    let (n_rot, _) = layout.rope_heads();
    let Heads { groups, cap, row0 } = heads;
    let n = canonical.n_tokens();
    if groups == 0 || cols % groups != 0 || n_rot % groups != 0 {
        return Err(shape(
            OP,
            "head groups",
            format!("a divisor of {cols} features and {n_rot} rotary heads"),
            groups,
        ));
    }
    if row0.checked_add(n).is_none_or(|end| end > cap) || dst.len() < groups * cap * (cols / groups) {
        return Err(shape(
            OP,
            "destination",
            format!(
                "{groups} heads x {cap} rows of {} with rows {row0}..{row0}+{n}",
                cols / groups
            ),
            dst.len(),
        ));
    }
    fused(
        canonical,
        patch,
        rope,
        layer,
        v_channel,
        delta,
        Out::Heads(as_uninit(dst), heads),
    )
}

/// Where [`reuse_heads`] writes: `groups` head-first buffers of `cap` rows each, from `row0`.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub groups: usize,
    pub cap: usize,
    pub row0: usize,
}

/// [`reuse_rows`] into `out`.
fn fused(
    canonical: &ChunkKv,
    patch: Option<&Patch>,
    rope: &RopeSpec,
    layer: usize,
    v_channel: bool,
    delta: i64,
    out: Out<'_>,
) -> Result<()> {
    const OP: &str = "reuse_rows";
    let Some(src) = canonical.layers().get(layer) else {
        return Err(shape(OP, "layer", format!("below {}", canonical.layers().len()), layer));
    };
    let (n_heads, _) = canonical.layout().rope_heads();
    let rot = if delta == 0 || v_channel {
        None
    } else {
        Some(Rotation::new(rope, layer, delta)?)
    };
    let lp = patch.map(|p| &p.layers()[layer]);
    let lr = lp.map(|lp| if v_channel { &lp.v } else { &lp.k });
    let fuse = Fuse {
        patch: lr.filter(|lr| lr.rank() > 0).map(|lr| Factors::new(&lr.p, &lr.wt)),
        rot: rot.as_ref().map(|r| (r, n_heads)),
    };
    let m = if v_channel { &src.v } else { &src.k };
    fuse.run(m, out).map_err(|index| Error::NonFinite {
        op: OP,
        what: format!("layer {layer} {}", if v_channel { "v" } else { "k" }),
        index,
    })
}

/// Rows per block: a block of rows is converted to f32, gets its patch rows added by one GEMM
/// (P_block · Wᵀ) and is rotated and stored while it stays in L1/L2.
const BLOCK: usize = 64;

/// One channel's fused pass: optional low-rank add, optional rotation.
struct Fuse<'a> {
    patch: Option<Factors<'a>>,
    rot: Option<(&'a Rotation, usize)>,
}

/// Where a fused pass puts its rows: handed to a sink block by block, or computed in place in
/// contiguous f32 destination rows (no copy through a scratch block), written or not yet (a
/// new buffer's capacity): each block's first pass writes every value before any is read.
pub(crate) enum Out<'a> {
    Sink(&'a mut dyn FnMut(usize, &[f32])),
    Rows(&'a mut [MaybeUninit<f32>]),
    /// Contiguous bf16 destination rows, rounded from each block inside the pass.
    Bf16(&'a mut [MaybeUninit<bf16>]),
    /// Head-first buffers ([`reuse_heads`], checked there).
    Heads(&'a mut [MaybeUninit<f32>], Heads),
}

/// The single sweep's view of an f32 destination (contiguous rows or head-first buffers); none
/// for the others, which take the blockwise pass.
fn sweep_dst<'b>(out: &'b mut Out<'_>, cols: usize) -> Option<stream::Dst<'b>> {
    match out {
        Out::Rows(d) => Some(stream::Dst {
            data: d,
            stride: cols,
            group_base: vec![0],
            width: cols,
        }),
        Out::Heads(d, h) => {
            let w = cols / h.groups;
            Some(stream::Dst {
                data: d,
                stride: w,
                group_base: (0..h.groups).map(|g| (g * h.cap + h.row0) * w).collect(),
                width: w,
            })
        }
        Out::Sink(_) | Out::Bf16(_) => None,
    }
}

/// Written f32 values seen as possibly uninitialised ones (the pass only ever writes whole values).
fn as_uninit<T: Copy>(d: &mut [T]) -> &mut [MaybeUninit<T>] {
    // SAFETY: MaybeUninit<T> has T's layout, and every value stored through the result is an
    // initialised T, so `d` stays valid.
    unsafe { &mut *(d as *mut [T] as *mut [MaybeUninit<T>]) }
}

impl Fuse<'_> {
    fn run(&self, src: &Mat, mut out: Out<'_>) -> Result<(), usize> {
        let cols = src.cols();
        // With a patch, one sweep (each tile read and written once) where the shapes allow; a
        // plain relocation streams faster blockwise (a copy, then the rotation in cache).
        if self.patch.is_some()
            && let Some(mut dst) = sweep_dst(&mut out, cols)
        {
            let swept = match src.data() {
                Buf::F32(s) => stream::sweep(s, cols, self.patch.as_ref(), self.rot, &mut dst),
                Buf::Bf16(s) => stream::sweep(s, cols, self.patch.as_ref(), self.rot, &mut dst),
                Buf::F16(_) => None,
            };
            if let Some(result) = swept {
                return result;
            }
        }
        match src.data() {
            Buf::F32(s) => self.rows(s, cols, out),
            Buf::F16(s) => self.rows(s, cols, out),
            Buf::Bf16(s) => self.rows(s, cols, out),
        }
    }

    /// Dispatches to an AVX-512 or AVX2+FMA build of the same loop where the CPU has it.
    fn rows<S: Elem>(&self, src: &[S], cols: usize, out: Out<'_>) -> Result<(), usize> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports the features this function is compiled for.
            return unsafe { self.rows_avx512(src, cols, out) };
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features this function is compiled for.
            return unsafe { self.rows_avx2(src, cols, out) };
        }
        self.rows_generic(src, cols, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn rows_avx512<S: Elem>(&self, src: &[S], cols: usize, out: Out<'_>) -> Result<(), usize> {
        self.rows_generic(src, cols, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2<S: Elem>(&self, src: &[S], cols: usize, out: Out<'_>) -> Result<(), usize> {
        self.rows_generic(src, cols, out)
    }

    #[inline(always)]
    fn rows_generic<S: Elem>(&self, src: &[S], cols: usize, mut out: Out<'_>) -> Result<(), usize> {
        if cols == 0 {
            return Ok(());
        }
        let n = src.len() / cols;
        if let Out::Heads(d, heads) = out {
            return self.heads(src, cols, d, heads);
        }
        let mut scratch = match out {
            Out::Sink(_) | Out::Bf16(_) => vec![0.0f32; BLOCK.min(n) * cols],
            _ => Vec::new(),
        };
        for b0 in (0..n).step_by(BLOCK) {
            let (bn, at) = (BLOCK.min(n - b0), b0 * cols);
            let from = &src[at..at + bn * cols];
            match &mut out {
                Out::Sink(sink) => {
                    let blk = convert(from, as_uninit(&mut scratch[..bn * cols]));
                    self.block(cols, b0, blk)?;
                    sink(b0, blk);
                }
                Out::Rows(d) => self.block(cols, b0, convert(from, &mut d[at..at + bn * cols]))?,
                Out::Bf16(d) => {
                    let blk = convert(from, as_uninit(&mut scratch[..bn * cols]));
                    self.block(cols, b0, blk)?;
                    for (e, r) in d[at..at + bn * cols].iter_mut().zip(blk.iter()) {
                        e.write(<bf16 as Elem>::from_f32(*r));
                    }
                }
                Out::Heads(..) => unreachable!("handled above"),
            }
        }
        Ok(())
    }

    /// [`Fuse::rows_generic`] into head-first buffers: each block of rows, head by head,
    /// converted into its place, patched with that head's columns of Wᵀ, rotated and checked.
    #[inline(always)]
    fn heads<S: Elem>(&self, src: &[S], cols: usize, d: &mut [MaybeUninit<f32>], h: Heads) -> Result<(), usize> {
        let (n, w) = (src.len() / cols, cols / h.groups);
        // Each head's columns of Wᵀ, split once per call.
        let heads: Vec<Factors<'_>> = match &self.patch {
            Some(f) => (0..h.groups).map(|g| f.columns(g * w, w)).collect(),
            None => Vec::new(),
        };
        let rot_per_head = self.rot.map(|(r, heads)| (r, heads / h.groups));
        for b0 in (0..n).step_by(BLOCK) {
            let bn = BLOCK.min(n - b0);
            for g in 0..h.groups {
                let at = (g * h.cap + h.row0 + b0) * w;
                let out = &mut d[at..at + bn * w];
                for (i, row) in out.chunks_exact_mut(w).enumerate() {
                    let from = (b0 + i) * cols + g * w;
                    convert(&src[from..from + w], row);
                }
                // SAFETY: the loop above wrote every value of `out`.
                let blk = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
                if !finite_after(heads.get(g), rot_per_head, blk, w, b0) {
                    let i = blk.iter().position(|r| !r.is_finite()).unwrap_or(0);
                    return Err((b0 + i / w) * cols + g * w + i % w);
                }
            }
        }
        Ok(())
    }

    /// Rows `b0..` of the source, already converted into `blk` (whole rows), patched, rotated
    /// and checked in place; inlined into each target-feature build of the loop.
    #[inline(always)]
    fn block(&self, cols: usize, b0: usize, blk: &mut [f32]) -> Result<(), usize> {
        if finite_after(self.patch.as_ref(), self.rot, blk, cols, b0) {
            return Ok(());
        }
        Err(b0 * cols + blk.iter().position(|r| !r.is_finite()).unwrap_or(0))
    }
}

/// Patches and rotates `blk` (whole rows of `cols`, from row `b0`) and returns
/// whether every value is finite afterwards, checked by the last step on the values it stores
/// (the patch's product or the rotation), or by one pass when there is neither. A bitwise fold
/// (no ordered float sum) vectorises.
#[inline(always)]
fn finite_after(
    patch: Option<&Factors<'_>>,
    rot: Option<(&Rotation, usize)>,
    blk: &mut [f32],
    cols: usize,
    b0: usize,
) -> bool {
    let patched = patch.map(|f| f.add(blk, b0));
    match (rot, patched) {
        (Some((rot, heads)), _) => rot.rotate_rows_finite(blk, cols, heads),
        (None, Some(finite)) => finite,
        (None, None) => blk.iter().fold(true, |a, r| a & r.is_finite()),
    }
}

/// `dst = src` widened to f32 (equal lengths, asserted), returned as the written values;
/// inlined into the loop's target-feature builds.
#[inline(always)]
fn convert<'a, S: Elem>(src: &[S], dst: &'a mut [MaybeUninit<f32>]) -> &'a mut [f32] {
    assert_eq!(src.len(), dst.len(), "fused pass: block lengths");
    for (r, e) in dst.iter_mut().zip(src) {
        r.write(e.to_f32());
    }
    // SAFETY: the loop above wrote every value of dst (equal lengths).
    unsafe { &mut *(dst as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// A chunk to place in a context, with its optional patch.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    pub chunk: &'a ChunkKv,
    pub patch: Option<&'a Patch>,
}

/// Lays `parts` out contiguously from position `start` (each relocated to its slot and patched)
/// into one KV buffer of `dtype`.
pub fn assemble(parts: &[Placement<'_>], rope: &RopeSpec, start: i64, dtype: DType) -> Result<ChunkKv> {
    const OP: &str = "assemble";
    let first = parts
        .first()
        .ok_or_else(|| shape(OP, "parts", "at least one chunk", 0))?;
    let total = parts.iter().map(|p| p.chunk.n_tokens()).sum();
    let mut dst = ChunkKv::zeros(*first.chunk.layout(), start, total, dtype)?;
    let mut row = 0;
    for p in parts {
        reuse_into(p.chunk, p.patch, rope, &mut dst, row)?;
        row += p.chunk.n_tokens();
    }
    Ok(dst)
}
