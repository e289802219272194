//! The CUDA backend: NVRTC compiles kernels/reuse.cu once per backend for the device's
//! architecture; host code uploads a chunk's K/V, patch factors and the R(δ) table, launches the
//! fused kernel per layer and channel, and reads the rows back. CPU reference: kamera-ops.

use crate::KERNEL_SOURCE;
use crate::backend::Backend;
use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use half::{bf16, f16};
use kamera_ops::{Buf, ChunkKv, DType, LowRank, Mat, PairLayout, Patch, RopeSpec};
use std::sync::Arc;

fn driver(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Driver {
        op,
        detail: e.to_string(),
    }
}

/// A CUDA device with the reuse kernels loaded.
#[derive(Debug)]
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    name: String,
}

/// Bandwidth of the fused kernel against a device-to-device copy, measured in one run.
#[derive(Debug, Clone)]
pub struct BenchFigures {
    /// Bytes read + written by the fused kernels per second, in GB/s.
    pub fused_gbs: f64,
    /// A memcpy of the same K/V bytes, read + written, in GB/s.
    pub copy_gbs: f64,
    /// Mean time of one full-chunk reuse (all layers, K and V).
    pub fused_ms: f64,
}

/// Device-side storage of one matrix: f32 as is, f16/bf16 as raw 16-bit words.
enum DevBuf {
    F32(CudaSlice<f32>),
    U16(CudaSlice<u16>),
}

fn dtype_tag(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
    }
}

impl CudaBackend {
    /// Opens device `ordinal` and compiles the kernels. Errors (never panics) where the driver
    /// or NVRTC is missing.
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        const OP: &str = "CudaBackend::new";
        // SAFETY: only probes whether the shared libraries can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoLibrary {
                op: OP,
                lib: "the CUDA driver library (libcuda)",
            });
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::NoLibrary {
                op: OP,
                lib: "NVRTC (libnvrtc)",
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver(OP))?;
        let (major, minor) = ctx.compute_capability().map_err(driver(OP))?;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let ptx = compile_ptx_with_opts(
            KERNEL_SOURCE,
            CompileOptions {
                arch: Some(arch),
                ..Default::default()
            },
        )
        .map_err(|e| Error::Compile {
            op: OP,
            arch: arch.to_string(),
            detail: e.to_string(),
        })?;
        let module = ctx.load_module(ptx).map_err(driver(OP))?;
        let name = ctx.name().map_err(driver(OP))?;
        let stream = ctx.default_stream();
        Ok(CudaBackend {
            ctx,
            stream,
            module,
            name,
        })
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn device_name(&self) -> String {
        self.name.clone()
    }

    fn function(&self, src: DType, dst: DType) -> Result<CudaFunction> {
        let name = format!("reuse_{}_{}", dtype_tag(src), dtype_tag(dst));
        self.module
            .load_function(&name)
            .map_err(driver("CudaBackend::function"))
    }

    fn upload(&self, m: &Mat) -> Result<DevBuf> {
        let op = "CudaBackend::upload";
        Ok(match m.data() {
            Buf::F32(v) => DevBuf::F32(self.stream.clone_htod(v).map_err(driver(op))?),
            Buf::F16(v) => DevBuf::U16(
                self.stream
                    .clone_htod(&v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    .map_err(driver(op))?,
            ),
            Buf::Bf16(v) => DevBuf::U16(
                self.stream
                    .clone_htod(&v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    .map_err(driver(op))?,
            ),
        })
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<DevBuf> {
        let op = "CudaBackend::alloc";
        Ok(match dtype {
            DType::F32 => DevBuf::F32(self.stream.alloc_zeros::<f32>(len).map_err(driver(op))?),
            _ => DevBuf::U16(self.stream.alloc_zeros::<u16>(len).map_err(driver(op))?),
        })
    }

    /// Launches one fused pass over `n` rows of `cols` features.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        f: &CudaFunction,
        src: &DevBuf,
        dst: &mut DevBuf,
        n: usize,
        cols: usize,
        patch: (&CudaSlice<f32>, &CudaSlice<f32>, usize),
        rot: (&CudaSlice<f32>, &CudaSlice<f32>, bool),
        heads: (usize, usize, usize, bool),
        bad: &mut CudaSlice<i32>,
    ) -> Result<()> {
        const OP: &str = "CudaBackend::launch";
        let smem = (cols + patch.2) * 4;
        if smem > 48 * 1024 {
            return Err(Error::Driver {
                op: OP,
                detail: format!("{cols} features + rank {} exceed 48 KiB of shared memory", patch.2),
            });
        }
        let int = |x: usize| x as i32;
        let (n_i, cols_i, rank_i) = (int(n), int(cols), int(patch.2));
        let (rotate_i, heads_i, hd_i, rd_i, inter_i) =
            (rot.2 as i32, int(heads.0), int(heads.1), int(heads.2), heads.3 as i32);
        let cfg = LaunchConfig {
            grid_dim: (n.clamp(1, 8192) as u32, 1, 1),
            block_dim: (cols.next_power_of_two().clamp(32, 256) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = self.stream.launch_builder(f);
        match src {
            DevBuf::F32(s) => b.arg(s),
            DevBuf::U16(s) => b.arg(s),
        };
        match dst {
            DevBuf::F32(d) => b.arg(d),
            DevBuf::U16(d) => b.arg(d),
        };
        b.arg(&n_i).arg(&cols_i).arg(patch.0).arg(patch.1).arg(&rank_i);
        b.arg(rot.0)
            .arg(rot.1)
            .arg(&rotate_i)
            .arg(&heads_i)
            .arg(&hd_i)
            .arg(&rd_i)
            .arg(&inter_i)
            .arg(bad);
        // SAFETY: argument types and order match the kernel signature in kernels/reuse.cu; every
        // buffer holds at least n * cols (src, dst), n * rank (P) and rank * cols (Wᵀ) elements.
        unsafe { b.launch(cfg) }.map_err(driver(OP))?;
        Ok(())
    }

    fn factors(&self, lr: Option<&LowRank>) -> Result<(CudaSlice<f32>, CudaSlice<f32>, usize)> {
        let op = "CudaBackend::factors";
        match lr {
            Some(lr) if lr.rank() > 0 => Ok((
                self.stream.clone_htod(&lr.p.to_f32_vec()).map_err(driver(op))?,
                self.stream.clone_htod(&lr.wt.to_f32_vec()).map_err(driver(op))?,
                lr.rank(),
            )),
            _ => Ok((
                self.stream.alloc_zeros::<f32>(1).map_err(driver(op))?,
                self.stream.alloc_zeros::<f32>(1).map_err(driver(op))?,
                0,
            )),
        }
    }

    fn download_into(&self, d: &DevBuf, dst: &mut Mat, dst_row: usize) -> Result<()> {
        let op = "CudaBackend::download";
        let cols = dst.cols();
        match (d, dst.data_mut()) {
            (DevBuf::F32(s), Buf::F32(out)) => {
                let v = self.stream.clone_dtoh(s).map_err(driver(op))?;
                out[dst_row * cols..dst_row * cols + v.len()].copy_from_slice(&v);
            }
            (DevBuf::U16(s), Buf::F16(out)) => {
                let v = self.stream.clone_dtoh(s).map_err(driver(op))?;
                for (o, b) in out[dst_row * cols..].iter_mut().zip(v) {
                    *o = f16::from_bits(b);
                }
            }
            (DevBuf::U16(s), Buf::Bf16(out)) => {
                let v = self.stream.clone_dtoh(s).map_err(driver(op))?;
                for (o, b) in out[dst_row * cols..].iter_mut().zip(v) {
                    *o = bf16::from_bits(b);
                }
            }
            _ => {
                return Err(Error::Driver {
                    op,
                    detail: "device and host dtypes disagree".into(),
                });
            }
        }
        Ok(())
    }

    /// Times `iters` fused reuses of a synthetic chunk (`tokens` x `features` per K and V, in
    /// `layers` layers, rank-`rank` patch, `dtype` in and out) against a device copy of the same
    /// bytes, with CUDA events.
    pub fn bench_reuse(
        &self,
        tokens: usize,
        layers: usize,
        features: usize,
        rank: usize,
        dtype: DType,
        iters: usize,
    ) -> Result<BenchFigures> {
        const OP: &str = "CudaBackend::bench_reuse";
        let head_dim = 128.min(features);
        let heads = features / head_dim;
        let f = self.function(dtype, dtype)?;
        let elems = tokens * features;
        let val = |i: usize| ((i.wrapping_mul(2_654_435_761) >> 7) % 2000) as f32 / 1000.0 - 1.0;
        let host = Mat::from_f32(tokens, features, (0..elems).map(val).collect())?.to_dtype(dtype);
        let mut srcs = Vec::new();
        let mut dsts = Vec::new();
        for _ in 0..2 * layers {
            srcs.push(self.upload(&host)?);
            dsts.push(self.alloc(dtype, elems)?);
        }
        let p = self
            .stream
            .clone_htod(&(0..tokens * rank).map(val).collect::<Vec<_>>())
            .map_err(driver(OP))?;
        let wt = self
            .stream
            .clone_htod(&(0..rank * features).map(|i| 0.01 * val(i)).collect::<Vec<_>>())
            .map_err(driver(OP))?;
        let rope = RopeSpec::new(head_dim, 1e6, PairLayout::HalfSplit);
        let (cos, sin) = rope.cos_sin(0, &[4096])?;
        let (cos, sin) = (
            self.stream.clone_htod(&cos).map_err(driver(OP))?,
            self.stream.clone_htod(&sin).map_err(driver(OP))?,
        );
        let mut bad = self.stream.alloc_zeros::<i32>(1).map_err(driver(OP))?;
        let run = |dsts: &mut Vec<DevBuf>, bad: &mut CudaSlice<i32>| -> Result<()> {
            for (i, (s, d)) in srcs.iter().zip(dsts.iter_mut()).enumerate() {
                let rotate = i % 2 == 0;
                self.launch(
                    &f,
                    s,
                    d,
                    tokens,
                    features,
                    (&p, &wt, rank),
                    (&cos, &sin, rotate),
                    (heads, head_dim, head_dim, false),
                    bad,
                )?;
            }
            Ok(())
        };
        run(&mut dsts, &mut bad)?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = (
            self.ctx.new_event(timing).map_err(driver(OP))?,
            self.ctx.new_event(timing).map_err(driver(OP))?,
        );
        start.record(&self.stream).map_err(driver(OP))?;
        for _ in 0..iters {
            run(&mut dsts, &mut bad)?;
        }
        end.record(&self.stream).map_err(driver(OP))?;
        end.synchronize().map_err(driver(OP))?;
        let fused_ms = start.elapsed_ms(&end).map_err(driver(OP))? as f64 / iters as f64;
        // Copy the same K/V bytes device to device.
        start.record(&self.stream).map_err(driver(OP))?;
        for _ in 0..iters {
            for (s, d) in srcs.iter().zip(dsts.iter_mut()) {
                match (s, d) {
                    (DevBuf::F32(s), DevBuf::F32(d)) => self.stream.memcpy_dtod(s, d),
                    (DevBuf::U16(s), DevBuf::U16(d)) => self.stream.memcpy_dtod(s, d),
                    _ => unreachable!("same dtype on both sides"),
                }
                .map_err(driver(OP))?;
            }
        }
        end.record(&self.stream).map_err(driver(OP))?;
        end.synchronize().map_err(driver(OP))?;
        let copy_ms = start.elapsed_ms(&end).map_err(driver(OP))? as f64 / iters as f64;
        let kv_bytes = (2 * layers * elems * dtype.size()) as f64;
        let patch_bytes = (2 * layers * (tokens + features) * rank * 4) as f64;
        Ok(BenchFigures {
            fused_gbs: (2.0 * kv_bytes + patch_bytes) / (fused_ms * 1e6),
            copy_gbs: 2.0 * kv_bytes / (copy_ms * 1e6),
            fused_ms,
        })
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn reuse_into(
        &self,
        canonical: &ChunkKv,
        patch: Option<&Patch>,
        rope: &RopeSpec,
        dst: &mut ChunkKv,
        dst_row: usize,
    ) -> Result<()> {
        const OP: &str = "CudaBackend::reuse_into";
        let delta = kamera_ops::check_reuse(OP, canonical, patch, rope, dst, dst_row)?;
        let layout = *canonical.layout();
        let n = canonical.n_tokens();
        let (n_heads, head_dim) = layout.rope_heads();
        let inter = rope.layout == PairLayout::Interleaved;
        let mut bad = self.stream.alloc_zeros::<i32>(1).map_err(driver(OP))?;
        let dst_dtype = dst.dtype();
        for l in 0..layout.n_layers {
            let (cos, sin) = rope.cos_sin(l, &[delta])?;
            let cos = self.stream.clone_htod(&cos).map_err(driver(OP))?;
            let sin = self.stream.clone_htod(&sin).map_err(driver(OP))?;
            let lp = patch.map(|p| &p.layers()[l]);
            let src = &canonical.layers()[l];
            for (ch, m, lr) in [(0, &src.k, lp.map(|x| &x.k)), (1, &src.v, lp.map(|x| &x.v))] {
                let f = self.function(m.dtype(), dst_dtype)?;
                let s = self.upload(m)?;
                let mut d = self.alloc(dst_dtype, n * m.cols())?;
                let (p, wt, rank) = self.factors(lr)?;
                self.launch(
                    &f,
                    &s,
                    &mut d,
                    n,
                    m.cols(),
                    (&p, &wt, rank),
                    (&cos, &sin, ch == 0 && delta != 0),
                    (n_heads, head_dim, rope.rotary_dims, inter),
                    &mut bad,
                )?;
                let out = &mut dst.layers_mut()[l];
                self.download_into(&d, if ch == 0 { &mut out.k } else { &mut out.v }, dst_row)?;
            }
        }
        if self.stream.clone_dtoh(&bad).map_err(driver(OP))?[0] != 0 {
            return Err(kamera_ops::Error::NonFinite {
                op: OP,
                what: "relocated or patched KV".into(),
                index: 0,
            }
            .into());
        }
        Ok(())
    }
}
