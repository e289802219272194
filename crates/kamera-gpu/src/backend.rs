//! The `Backend` seam: callers pick a backend at run time and never write `#[cfg]`.

use crate::error::Result;
use kamera_ops::{ChunkKv, DType, Patch, Placement, RopeSpec};

/// The operator's hot ops. Every implementation must match [`CpuBackend`] within [`tolerance`].
pub trait Backend {
    /// A short name for logs and reports.
    fn name(&self) -> &'static str;

    /// R(δ)·(canonical + P Wᵀ) into rows `dst_row..` of `dst` (kamera_ops::reuse_into).
    fn reuse_into(
        &self,
        canonical: &ChunkKv,
        patch: Option<&Patch>,
        rope: &RopeSpec,
        dst: &mut ChunkKv,
        dst_row: usize,
    ) -> Result<()>;

    /// The chunk relocated to `to` and patched, in the canonical KV's dtype.
    fn reuse(&self, canonical: &ChunkKv, patch: Option<&Patch>, rope: &RopeSpec, to: i64) -> Result<ChunkKv> {
        let mut dst = ChunkKv::zeros(*canonical.layout(), to, canonical.n_tokens(), canonical.dtype())?;
        self.reuse_into(canonical, patch, rope, &mut dst, 0)?;
        Ok(dst)
    }

    /// Gathers placed chunks contiguously from `start` into one KV buffer of `dtype`.
    fn assemble(&self, parts: &[Placement<'_>], rope: &RopeSpec, start: i64, dtype: DType) -> Result<ChunkKv> {
        let Some(first) = parts.first() else {
            return Err(kamera_ops::Error::Shape {
                op: "Backend::assemble",
                what: "parts".into(),
                expected: "at least one chunk".into(),
                got: "0".into(),
            }
            .into());
        };
        let total = parts.iter().map(|p| p.chunk.n_tokens()).sum();
        let mut dst = ChunkKv::zeros(*first.chunk.layout(), start, total, dtype)?;
        let mut row = 0;
        for p in parts {
            self.reuse_into(p.chunk, p.patch, rope, &mut dst, row)?;
            row += p.chunk.n_tokens();
        }
        Ok(dst)
    }
}

/// The reference backend: kamera-ops on the CPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn reuse_into(
        &self,
        canonical: &ChunkKv,
        patch: Option<&Patch>,
        rope: &RopeSpec,
        dst: &mut ChunkKv,
        dst_row: usize,
    ) -> Result<()> {
        Ok(kamera_ops::reuse_into(canonical, patch, rope, dst, dst_row)?)
    }
}

/// The one tolerance table for backend parity: max |gpu − cpu| ≤ abs + rel·|cpu|, by the
/// destination dtype (one rounding step of that type, plus FMA contraction on the GPU).
pub fn tolerance(dtype: DType) -> (f32, f32) {
    match dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (1e-3, 1e-3),
        DType::Bf16 => (1e-2, 8e-3),
    }
}
