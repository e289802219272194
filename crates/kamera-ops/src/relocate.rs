//! Relocation R(δ): re-rotate a chunk's keys from its offset to any position (KAMERA.md,
//! "Relocation R(δ)"). Exact algebra, no forward pass; values pass through untouched.

use crate::chunk::ChunkKv;
use crate::error::{Error, Result, shape};
use crate::rope::{RopeSpec, Rotation};
use crate::tensor::{Elem, Mat};
use crate::with_buf;

/// The shift from `from` to `to`, as an error rather than an overflow.
pub(crate) fn shift(op: &'static str, from: i64, to: i64) -> Result<i64> {
    to.checked_sub(from).ok_or_else(|| {
        shape(
            op,
            "position shift",
            "a shift that fits in i64",
            format!("{from} -> {to}"),
        )
    })
}

/// The chunk with its keys rotated so that its first token sits at position `to`.
/// MLA: only the k_rope channel rotates; the latent is copied byte for byte.
pub fn relocate(chunk: &ChunkKv, rope: &RopeSpec, to: i64) -> Result<ChunkKv> {
    const OP: &str = "relocate";
    chunk.layout().check_rope(OP, rope)?;
    let delta = shift(OP, chunk.offset(), to)?;
    let (n_heads, _) = chunk.layout().rope_heads();
    let mut out = chunk.clone();
    out.set_offset(to);
    for (l, layer) in out.layers_mut().iter_mut().enumerate() {
        if delta == 0 {
            layer.k.check_finite(OP, &format!("layer {l} k"))?;
            continue;
        }
        let rot = Rotation::new(rope, l, delta)?;
        if let Some(index) = rotate_mat(&mut layer.k, &rot, n_heads) {
            return Err(Error::NonFinite {
                op: OP,
                what: format!("layer {l} k"),
                index,
            });
        }
    }
    Ok(out)
}

/// Rotates every row of `m` in place; returns the index of a non-finite value, if one was seen.
pub(crate) fn rotate_mat(m: &mut Mat, rot: &Rotation, n_heads: usize) -> Option<usize> {
    let cols = m.cols();
    with_buf!(m.data_mut(), v => rotate_rows(v, cols, rot, n_heads))
}

fn rotate_rows<T: Elem>(v: &mut [T], cols: usize, rot: &Rotation, n_heads: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports the feature this function is compiled for.
        return unsafe { rotate_rows_avx2(v, cols, rot, n_heads) };
    }
    rotate_rows_generic(v, cols, rot, n_heads)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rotate_rows_avx2<T: Elem>(v: &mut [T], cols: usize, rot: &Rotation, n_heads: usize) -> Option<usize> {
    rotate_rows_generic(v, cols, rot, n_heads)
}

#[inline(always)]
fn rotate_rows_generic<T: Elem>(v: &mut [T], cols: usize, rot: &Rotation, n_heads: usize) -> Option<usize> {
    if cols == 0 {
        return None;
    }
    let mut row = vec![0.0f32; cols];
    let mut bad = None;
    for (t, x) in v.chunks_exact_mut(cols).enumerate() {
        for (r, e) in row.iter_mut().zip(x.iter()) {
            *r = e.to_f32();
        }
        rot.rotate(&mut row, n_heads);
        let mut finite = true;
        for (e, r) in x.iter_mut().zip(row.iter()) {
            finite &= r.is_finite();
            *e = T::from_f32(*r);
        }
        if !finite && bad.is_none() {
            bad = Some(t * cols + row.iter().position(|r| !r.is_finite()).unwrap_or(0));
        }
    }
    bad
}
