//! What the device bandwidth bench reports (`CudaBackend::bench_reuse`, benches/bandwidth.rs), and the
//! median every bench of the workspace reports its timings by.

/// The median of `xs` (the upper one of an even count: the value at rank `len / 2` once sorted,
/// which is also what nearest-rank percentile 0.5 gives); NaN when `xs` is empty.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

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

/// What `DeviceModel::bench_reuse` is asked to measure.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelBenchConfig {
    /// Tokens per cached chunk and how many chunks the revisit reuses.
    pub chunk_tokens: usize,
    pub chunks: usize,
    /// Question tokens prefilled after the reused chunks.
    pub question_tokens: usize,
    /// Rank of every chunk's patch (bf16 factors, K and V of every layer); 0: relocation only.
    pub rank: usize,
    /// Repetitions of each timing (median kept).
    pub reps: usize,
    /// Prompt lengths whose prefill throughput is measured on its own.
    pub prefill_sizes: Vec<usize>,
}

/// Time to first token of a revisit on the device: reused chunks against a full re-prefill,
/// measured in one run (wall clock, device synchronised, logits on the host).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelFigures {
    pub device: String,
    pub config: ModelBenchConfig,
    /// (prompt tokens, ms, tokens/s) of a prefill from an empty context.
    pub prefill: Vec<(usize, f64, f64)>,
    /// Full re-prefill of chunks + question: the baseline time to first token.
    pub full_ms: f64,
    /// Placing every resident chunk (relocate + patch into the context), all chunks.
    pub place_ms: f64,
    /// Placing plus prefilling the question: the reuse time to first token.
    pub reuse_ms: f64,
    /// full_ms / reuse_ms.
    pub speedup: f64,
    /// Device bytes of the resident canonical chunks.
    pub resident_bytes: usize,
}

impl ModelFigures {
    /// The figures as a markdown table.
    pub fn markdown(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "device: {}\n\n| prefill tokens | ms | tokens/s |\n|---:|---:|---:|\n",
            self.device
        );
        for (n, ms, tps) in &self.prefill {
            s += &format!("| {n} | {ms:.2} | {tps:.0} |\n");
        }
        s += &format!(
            "\nrevisit: {} chunks x {} tokens + {} question tokens, patch rank {} (bf16), resident {:.1} MiB\n\n\
             | full re-prefill ms | relocate + patch ms | reuse TTFT ms | speedup |\n|---:|---:|---:|---:|\n\
             | {:.2} | {:.3} | {:.2} | {:.1}x |\n",
            c.chunks,
            c.chunk_tokens,
            c.question_tokens,
            c.rank,
            self.resident_bytes as f64 / (1 << 20) as f64,
            self.full_ms,
            self.place_ms,
            self.reuse_ms,
            self.speedup
        );
        s
    }
}
