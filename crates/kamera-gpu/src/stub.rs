//! The CUDA backend when built without the `cuda` feature: every call is a clear error.

use crate::BenchFigures;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::{HostWeights, ModelSpec};
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

/// No value of this type exists: the stand-ins below cannot be constructed without CUDA.
#[derive(Debug)]
enum Never {}

/// Stand-in for the device transformer; [`DeviceModel::new`] always fails.
#[derive(Debug)]
pub struct DeviceModel {
    never: Never,
}

/// Stand-in for a device KV context.
#[derive(Debug)]
pub struct DeviceKv {
    never: Never,
}

/// Stand-in for a resident canonical chunk.
#[derive(Debug)]
pub struct ResidentChunk {
    never: Never,
}

impl CudaBackend {
    pub fn upload_chunk(&self, _chunk: &ChunkKv) -> Result<ResidentChunk> {
        Err(Error::NotCompiled {
            op: "CudaBackend::upload_chunk",
        })
    }
}

impl DeviceModel {
    pub fn new(_ordinal: usize, _spec: ModelSpec, _weights: &HostWeights) -> Result<DeviceModel> {
        Err(Error::NotCompiled { op: "DeviceModel::new" })
    }
    pub fn spec(&self) -> &ModelSpec {
        match self.never {}
    }
    pub fn backend(&self) -> &CudaBackend {
        match self.never {}
    }
    pub fn synchronize(&self) -> Result<()> {
        match self.never {}
    }
    pub fn context(&self, _offset: i64) -> Result<DeviceKv> {
        match self.never {}
    }
    pub fn reserve(&self, _kv: &mut DeviceKv, _n: usize) -> Result<()> {
        match self.never {}
    }
    pub fn prefill(&self, _kv: &mut DeviceKv, _tokens: &[u32], _all_logits: bool) -> Result<Vec<f32>> {
        match self.never {}
    }
    pub fn download(&self, _kv: &DeviceKv, _from: usize) -> Result<ChunkKv> {
        match self.never {}
    }
    pub fn place(&self, _kv: &mut DeviceKv, _chunk: &ResidentChunk, _patch: Option<&Patch>) -> Result<()> {
        match self.never {}
    }
}

impl DeviceKv {
    pub fn len(&self) -> usize {
        match self.never {}
    }
    pub fn is_empty(&self) -> bool {
        match self.never {}
    }
    pub fn offset(&self) -> i64 {
        match self.never {}
    }
    pub fn end(&self) -> i64 {
        match self.never {}
    }
    pub fn truncate(&mut self, _len: usize) {
        match self.never {}
    }
    pub fn reset(&mut self, _offset: i64) {
        match self.never {}
    }
    pub fn bytes(&self) -> usize {
        match self.never {}
    }
}

impl ResidentChunk {
    pub fn n_tokens(&self) -> usize {
        match self.never {}
    }
    pub fn offset(&self) -> i64 {
        match self.never {}
    }
    pub fn bytes(&self) -> usize {
        match self.never {}
    }
}

impl DeviceModel {
    pub fn bench_reuse(&self, _cfg: &crate::ModelBenchConfig) -> Result<crate::ModelFigures> {
        match self.never {}
    }
}
