//! What the device bandwidth bench reports (`CudaBackend::bench_reuse`, kamera-gpu-bench).

/// What one bench configuration measured.
#[derive(Debug, Clone)]
pub struct BenchFigures {
    /// The kernel family the K launch used.
    pub kernel: String,
    /// Mean time of one whole-chunk reuse (every layer, K and V: two launches).
    pub fused_ms: f64,
    /// Bytes the fused launches read + write (KV in and out, P and Wᵀ) per second, in GB/s.
    pub fused_gbs: f64,
    /// The K launch alone (rotated) and the V launch alone, in ms.
    pub k_ms: f64,
    pub v_ms: f64,
    /// Mean time of copying the same K and V device to device (two memcpys).
    pub copy_ms: f64,
    /// Bytes the copy reads + writes per second, in GB/s.
    pub copy_gbs: f64,
}
