//! kamera-gpu: the operator's hot ops (fused relocate + patch, context gather) behind one
//! `Backend` trait, on the CPU (kamera-ops, always built) or on CUDA (cudarc + NVRTC, `cuda`
//! feature). Without the feature or a driver, `CudaBackend::new` is a clear error, never a panic.
//!
//! ```
//! use kamera_gpu::{Backend, CpuBackend, CudaBackend};
//! let backend: Box<dyn Backend> = match CudaBackend::new(0) {
//!     Ok(cuda) => Box::new(cuda),
//!     Err(e) => { eprintln!("using the CPU: {e}"); Box::new(CpuBackend) }
//! };
//! assert!(!backend.name().is_empty());
//! ```

mod backend;
#[cfg(feature = "cuda")]
mod cuda;
mod error;
mod figures;
mod model;
mod pool;
mod reference;
#[cfg(not(feature = "cuda"))]
mod stub;

pub use backend::{Backend, CpuBackend, tolerance};
#[cfg(feature = "cuda")]
pub use cuda::CudaBackend;
#[cfg(feature = "cuda")]
pub use cuda::model::{DeviceKv, DeviceModel};
#[cfg(feature = "cuda")]
pub use cuda::pool::ResidentChunk;
pub use error::{Error, Result};
pub use figures::{BenchFigures, ModelBenchConfig, ModelFigures, median};
pub use model::{HostLayer, HostWeights, ModelSpec};
pub use pool::{DevicePool, PoolStats, Slots};
pub use reference::{LayerRows, reference_prefill};
#[cfg(not(feature = "cuda"))]
pub use stub::{CudaBackend, DeviceKv, DeviceModel, ResidentChunk};

/// The CUDA sources, compiled by NVRTC at first use.
pub const KERNEL_SOURCE: &str = include_str!("../../../kernels/reuse.cu");

/// The device transformer's kernels (everything but the cuBLAS products).
pub const MODEL_KERNEL_SOURCE: &str = include_str!("../../../kernels/model.cu");
