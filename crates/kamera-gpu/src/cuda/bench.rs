//! Device bandwidth of the fused relocate + patch launch against a device-to-device copy of the
//! same K/V bytes, measured in one run with CUDA events (run by benches/bandwidth.rs).

use super::launch::Kernel;
use super::{Channel, CudaBackend, DevBuf, driver};
use crate::BenchFigures;
use crate::error::Result;
use kamera_ops::{DType, KvLayout, LowRank, Mat, PairLayout, RopeSpec};

/// Deterministic synthetic values in [−1, 1) for bench data.
pub(super) fn val(i: usize) -> f32 {
    ((i.wrapping_mul(2_654_435_761) >> 7) % 2000) as f32 / 1000.0 - 1.0
}

/// A synthetic rank-`rank` patch of a `[rows, cols]` channel, factors stored in `dtype` (`salt`
/// varies the values between layers and channels).
pub(super) fn synthetic_low_rank(rows: usize, rank: usize, cols: usize, dtype: DType, salt: usize) -> Result<LowRank> {
    Ok(LowRank {
        p: Mat::from_f32(rows, rank, (0..rows * rank).map(|i| val(i + salt)).collect())?.to_dtype(dtype),
        wt: Mat::from_f32(rank, cols, (0..rank * cols).map(|i| 0.01 * val(i + 7 * salt)).collect())?.to_dtype(dtype),
        spectrum: Vec::new(),
    })
}

impl CudaBackend {
    /// `layers` copies of one synthetic `[rows, cols]` matrix in `dtype`, on the device.
    fn synthetic_channel(&self, dtype: DType, layers: usize, rows: usize, cols: usize) -> Result<Channel> {
        let one = Mat::from_f32(rows, cols, (0..rows * cols).map(val).collect())?.to_dtype(dtype);
        self.upload_mats(&vec![&one; layers], dtype, rows, cols)
    }

    /// Times `iters` fused reuses of a synthetic chunk (`tokens` × `features` per K and V in each
    /// of `layers` layers, rank-`rank` patch on both with factors stored in `factors`, or none at
    /// rank 0; `dtype` in and out; head dim 128, half-split pairs) against a device copy of the
    /// same K/V bytes, with the kernels `plan` picks.
    #[allow(clippy::too_many_arguments)]
    pub fn bench_reuse(
        &self,
        tokens: usize,
        layers: usize,
        features: usize,
        rank: usize,
        dtype: DType,
        factors: DType,
        iters: usize,
    ) -> Result<BenchFigures> {
        self.bench_reuse_as(false, tokens, layers, features, rank, dtype, factors, iters)
    }

    /// [`CudaBackend::bench_reuse`] with `one_stage`: where the plan picks the cp.async-pipelined
    /// tensor-core kernel (`reuse4tcp_*`), the one-stage one (`reuse4tc_*`) instead, so that one
    /// run compares them (CUDA builds only).
    #[allow(clippy::too_many_arguments)]
    pub fn bench_reuse_as(
        &self,
        one_stage: bool,
        tokens: usize,
        layers: usize,
        features: usize,
        rank: usize,
        dtype: DType,
        factors: DType,
        iters: usize,
    ) -> Result<BenchFigures> {
        const OP: &str = "CudaBackend::bench_reuse";
        let head_dim = 128.min(features);
        let layout = KvLayout::mha(layers, features / head_dim, head_dim);
        let rope = RopeSpec::new(head_dim, 1e6, PairLayout::HalfSplit);
        let rot = self.rotation(&rope, &layout, 4096)?;
        let (k, v) = (
            self.synthetic_channel(dtype, layers, tokens, features)?,
            self.synthetic_channel(dtype, layers, tokens, features)?,
        );
        let mut out = (
            self.zeros_channel(dtype, layers, tokens, features)?,
            self.zeros_channel(dtype, layers, tokens, features)?,
        );
        // One rank-`rank` patch shared by every layer, its factors stored in `factors`.
        let lr = synthetic_low_rank(tokens, rank, features, factors, 0)?;
        let lrs = vec![&lr; layers];
        let plan =
            |rotate: bool| match self.plan(dtype, features, (&rot, rotate), super::factor_dtype(Some(&lrs)), rank) {
                Kernel::WideTc {
                    factors,
                    pipelined: true,
                    ..
                } if one_stage => self.plan_tc(factors, features, (&rot, rotate), rank),
                k => k,
            };
        let (kk, kv) = (plan(true), plan(false));
        let (fk, fv) = (
            self.upload_factors(layers, Some(&lrs), kk)?,
            self.upload_factors(layers, Some(&lrs), kv)?,
        );
        let mut bad = self.stream.alloc_zeros::<i32>(1).map_err(driver(OP))?;
        let mut k_only = |out: &mut (Channel, Channel)| self.launch(kk, &k, &mut out.0, 0, &fk, (&rot, true), &mut bad);
        let k_ms = self.time(iters, &mut out, &mut k_only)?;
        let mut v_only =
            |out: &mut (Channel, Channel)| self.launch(kv, &v, &mut out.1, 0, &fv, (&rot, false), &mut bad);
        let v_ms = self.time(iters, &mut out, &mut v_only)?;
        let mut fused = |out: &mut (Channel, Channel)| -> Result<()> {
            self.launch(kk, &k, &mut out.0, 0, &fk, (&rot, true), &mut bad)?;
            self.launch(kv, &v, &mut out.1, 0, &fv, (&rot, false), &mut bad)
        };
        let copy = |out: &mut (Channel, Channel)| -> Result<()> {
            for (s, d) in [(&k.buf, &mut out.0.buf), (&v.buf, &mut out.1.buf)] {
                match (s, d) {
                    (DevBuf::F32(s), DevBuf::F32(d)) => self.stream.memcpy_dtod(s, d),
                    (DevBuf::U16(s), DevBuf::U16(d)) => self.stream.memcpy_dtod(s, d),
                    _ => unreachable!("the bench allocates one dtype on both sides"),
                }
                .map_err(driver(OP))?;
            }
            Ok(())
        };
        let fused_ms = self.time(iters, &mut out, &mut fused)?;
        let copy_ms = self.time(iters, &mut out, &mut { copy })?;
        let kv_bytes = (2 * layers * tokens * features * dtype.size()) as f64;
        let patch_bytes = (2 * layers * (tokens + features) * rank * 4) as f64;
        Ok(BenchFigures {
            kernel: kk.family().to_string(),
            fused_ms,
            fused_gbs: (2.0 * kv_bytes + patch_bytes) / (fused_ms * 1e6),
            k_ms,
            v_ms,
            copy_ms,
            copy_gbs: 2.0 * kv_bytes / (copy_ms * 1e6),
        })
    }

    /// Registers per thread and resident blocks per SM of the bf16 → bf16 and f32 → f32 kernels
    /// (block sizes and shared memory as launched for F = 512, head dim 128, rank 32), for
    /// reading the bench.
    pub fn kernel_report(&self) -> Result<Vec<String>> {
        const OP: &str = "CudaBackend::kernel_report";
        let mut lines = Vec::new();
        let tc_smem = super::launch::tc_smem(512, 32);
        let tcp_smem = super::launch::tcp_smem(256, 32);
        for (name, threads, smem) in [
            ("reuse_bf16_bf16", 256, 8 * 32 * 4),
            ("reuse4_bf16_bf16", 128, 16 * 32 * 4),
            ("reuse4_f32_f32", 128, 8 * 32 * 4),
            ("reuse4tc_bf16_bf16_bf16", 256, tc_smem),
            ("reuse4tc_f16_f16_f16", 256, tc_smem),
            ("reuse4tcp_bf16_bf16_bf16", 256, tcp_smem),
            ("reuse4tcp_f16_f16_f16", 256, tcp_smem),
        ] {
            let f = self.module.load_function(name).map_err(driver(OP))?;
            if smem > 48 * 1024 {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(driver(OP))?;
            }
            let regs = f.num_regs().map_err(driver(OP))?;
            let blocks = f
                .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
                .map_err(driver(OP))?;
            lines.push(format!(
                "{name}: {regs} registers/thread, {smem} B shared, {blocks} blocks of {threads} threads per SM (rank 32)"
            ));
        }
        Ok(lines)
    }

    /// Mean milliseconds of `iters` runs of `f` after one warm-up, timed with CUDA events.
    fn time<T>(&self, iters: usize, x: &mut T, f: &mut impl FnMut(&mut T) -> Result<()>) -> Result<f64> {
        const OP: &str = "CudaBackend::time";
        f(x)?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(timing).map_err(driver(OP))?;
        let end = self.ctx.new_event(timing).map_err(driver(OP))?;
        start.record(&self.stream).map_err(driver(OP))?;
        for _ in 0..iters {
            f(x)?;
        }
        end.record(&self.stream).map_err(driver(OP))?;
        end.synchronize().map_err(driver(OP))?;
        Ok(start.elapsed_ms(&end).map_err(driver(OP))? as f64 / iters.max(1) as f64)
    }
}
