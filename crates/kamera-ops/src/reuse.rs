//! Fused reuse: R(δ)·(canonical + P Wᵀ) written into a destination KV buffer in one pass over
//! the chunk, and context assembly from several placed chunks (KAMERA.md, "The operator").

use std::borrow::Cow;

use crate::chunk::ChunkKv;
use crate::error::{Error, Result, shape};
use crate::patch::Patch;
use crate::relocate::shift;
use crate::rope::{RopeSpec, Rotation};
use crate::tensor::{Buf, DType, Elem, Mat};

/// The chunk relocated to `to` with its patch (if any) applied: one pass, no intermediate.
pub fn reuse(canonical: &ChunkKv, patch: Option<&Patch>, rope: &RopeSpec, to: i64) -> Result<ChunkKv> {
    let mut dst = ChunkKv::zeros(*canonical.layout(), to, canonical.n_tokens(), canonical.dtype())?;
    reuse_into(canonical, patch, rope, &mut dst, 0)?;
    Ok(dst)
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
    let layout = *canonical.layout();
    layout.check_rope(op, rope)?;
    if *dst.layout() != layout {
        return Err(shape(
            op,
            "destination layout",
            format!("{layout:?}"),
            format!("{:?}", dst.layout()),
        ));
    }
    let n = canonical.n_tokens();
    if dst_row.checked_add(n).is_none_or(|end| end > dst.n_tokens()) {
        return Err(shape(
            op,
            "destination rows",
            format!("at least {dst_row} + {n}"),
            dst.n_tokens(),
        ));
    }
    if let Some(p) = patch {
        p.check_fits(op, canonical)?;
    }
    let to = dst
        .offset()
        .checked_add(dst_row as i64)
        .ok_or_else(|| shape(op, "destination position", "no overflow", dst.offset()))?;
    shift(op, canonical.offset(), to)
}

/// Writes the relocated, patched chunk into rows `dst_row..dst_row + n` of `dst`; the chunk
/// lands at position `dst.offset() + dst_row`. `dst` may be stored in another dtype.
pub fn reuse_into(
    canonical: &ChunkKv,
    patch: Option<&Patch>,
    rope: &RopeSpec,
    dst: &mut ChunkKv,
    dst_row: usize,
) -> Result<()> {
    const OP: &str = "reuse_into";
    let delta = check_reuse(OP, canonical, patch, rope, dst, dst_row)?;
    let layout = *canonical.layout();
    let (n_heads, _) = layout.rope_heads();
    for (l, (src, out)) in canonical.layers().iter().zip(dst.layers_mut()).enumerate() {
        let rot = if delta == 0 {
            None
        } else {
            Some(Rotation::new(rope, l, delta)?)
        };
        let lp = patch.map(|p| &p.layers()[l]);
        let k = Fuse {
            patch: lp.map(|lp| (f32_view(&lp.k.p), f32_view(&lp.k.wt), lp.k.rank())),
            rot: rot.as_ref().map(|r| (r, n_heads)),
        };
        k.run(&src.k, &mut out.k, dst_row).map_err(|index| Error::NonFinite {
            op: OP,
            what: format!("layer {l} k"),
            index,
        })?;
        let v = Fuse {
            patch: lp.map(|lp| (f32_view(&lp.v.p), f32_view(&lp.v.wt), lp.v.rank())),
            rot: None,
        };
        v.run(&src.v, &mut out.v, dst_row).map_err(|index| Error::NonFinite {
            op: OP,
            what: format!("layer {l} v"),
            index,
        })?;
    }
    Ok(())
}

/// A matrix's values as f32: borrowed when stored as f32, converted once otherwise.
fn f32_view(m: &Mat) -> Cow<'_, [f32]> {
    match m.data() {
        Buf::F32(v) => Cow::Borrowed(v),
        _ => Cow::Owned(m.to_f32_vec()),
    }
}

/// A channel's patch factors as f32: (P, Wᵀ, rank).
type Factors<'a> = (Cow<'a, [f32]>, Cow<'a, [f32]>, usize);

/// One channel's fused pass: optional low-rank add, optional rotation.
struct Fuse<'a> {
    patch: Option<Factors<'a>>,
    rot: Option<(&'a Rotation, usize)>,
}

impl Fuse<'_> {
    fn run(&self, src: &Mat, dst: &mut Mat, dst_row: usize) -> Result<(), usize> {
        let cols = src.cols();
        let rows = src.rows();
        let range = dst_row * cols..(dst_row + rows) * cols;
        macro_rules! go {
            ($s:expr, $d:expr) => {
                self.rows($s, &mut $d[range.clone()], cols)
            };
        }
        match (src.data(), dst.data_mut()) {
            (Buf::F32(s), Buf::F32(d)) => go!(s, d),
            (Buf::F32(s), Buf::F16(d)) => go!(s, d),
            (Buf::F32(s), Buf::Bf16(d)) => go!(s, d),
            (Buf::F16(s), Buf::F32(d)) => go!(s, d),
            (Buf::F16(s), Buf::F16(d)) => go!(s, d),
            (Buf::F16(s), Buf::Bf16(d)) => go!(s, d),
            (Buf::Bf16(s), Buf::F32(d)) => go!(s, d),
            (Buf::Bf16(s), Buf::F16(d)) => go!(s, d),
            (Buf::Bf16(s), Buf::Bf16(d)) => go!(s, d),
        }
    }

    /// Dispatches to an AVX2+FMA build of the same loop where the CPU has it.
    fn rows<S: Elem, D: Elem>(&self, src: &[S], dst: &mut [D], cols: usize) -> Result<(), usize> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features this function is compiled for.
            return unsafe { self.rows_avx2(src, dst, cols) };
        }
        self.rows_generic(src, dst, cols)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_avx2<S: Elem, D: Elem>(&self, src: &[S], dst: &mut [D], cols: usize) -> Result<(), usize> {
        self.rows_generic(src, dst, cols)
    }

    #[inline(always)]
    fn rows_generic<S: Elem, D: Elem>(&self, src: &[S], dst: &mut [D], cols: usize) -> Result<(), usize> {
        if cols == 0 {
            return Ok(());
        }
        let mut row = vec![0.0f32; cols];
        for (t, (s, d)) in src.chunks_exact(cols).zip(dst.chunks_exact_mut(cols)).enumerate() {
            for (r, e) in row.iter_mut().zip(s) {
                *r = e.to_f32();
            }
            if let Some((p, wt, m)) = &self.patch {
                for j in 0..*m {
                    let c = p[t * m + j];
                    for (r, w) in row.iter_mut().zip(&wt[j * cols..(j + 1) * cols]) {
                        *r += c * w;
                    }
                }
            }
            if let Some((rot, heads)) = self.rot {
                rot.rotate(&mut row, heads);
            }
            let mut finite = true;
            for (e, r) in d.iter_mut().zip(&row) {
                finite &= r.is_finite();
                *e = D::from_f32(*r);
            }
            if !finite {
                return Err(t * cols + row.iter().position(|r| !r.is_finite()).unwrap_or(0));
            }
        }
        Ok(())
    }
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
