//! The CUDA backend when built without the `cuda` feature: every call is a clear error.

use crate::BenchFigures;
use crate::backend::Backend;
use crate::error::{Error, Result};
use kamera_ops::{ChunkKv, DType, Patch, RopeSpec};

/// Stand-in for the CUDA backend; [`CudaBackend::new`] always fails with [`Error::NotCompiled`].
#[derive(Debug)]
pub struct CudaBackend {
    _private: (),
}

impl CudaBackend {
    pub fn new(_ordinal: usize) -> Result<CudaBackend> {
        Err(Error::NotCompiled { op: "CudaBackend::new" })
    }
    pub fn with_wide_units(self, _wide: bool) -> CudaBackend {
        self
    }
    pub fn device_name(&self) -> String {
        String::new()
    }
    pub fn kernel_report(&self) -> Result<Vec<String>> {
        Err(Error::NotCompiled {
            op: "CudaBackend::kernel_report",
        })
    }
    #[allow(clippy::too_many_arguments)]
    pub fn bench_reuse(
        &self,
        _tokens: usize,
        _layers: usize,
        _features: usize,
        _rank: usize,
        _dtype: DType,
        _factors: DType,
        _iters: usize,
    ) -> Result<BenchFigures> {
        Err(Error::NotCompiled {
            op: "CudaBackend::bench_reuse",
        })
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda (not compiled)"
    }
    fn reuse_into(&self, _: &ChunkKv, _: Option<&Patch>, _: &RopeSpec, _: &mut ChunkKv, _: usize) -> Result<()> {
        Err(Error::NotCompiled {
            op: "CudaBackend::reuse_into",
        })
    }
}
