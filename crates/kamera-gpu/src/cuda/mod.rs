//! The CUDA backend: NVRTC compiles kernels/reuse.cu once per process and architecture; host code
//! uploads a chunk's K/V (all layers back to back), its patch factors and the R(δ) table, runs one
//! fused launch per channel, and reads the rows back. CPU reference: kamera-ops.

mod bench;

use crate::KERNEL_SOURCE;
use crate::backend::Backend;
use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};
use half::{bf16, f16};
use kamera_ops::{Buf, ChunkKv, DType, LowRank, Mat, PairLayout, Patch, Placement, RopeSpec};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub use bench::BenchFigures;

/// Token rows per thread block: the `ROWS` of kernels/reuse.cu.
const ROWS: usize = 8;
/// Shared memory a launch may use without an opt-in.
const SMEM_LIMIT: usize = 48 * 1024;

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
    /// Use the four-column kernels where the shape allows (the default).
    wide: bool,
}

/// Device-side storage of one channel: f32 as is, f16/bf16 as raw 16-bit words.
enum DevBuf {
    F32(CudaSlice<f32>),
    U16(CudaSlice<u16>),
}

/// One channel (K or V) of every layer on the device, layer-major: `[layers, rows, cols]`.
struct Channel {
    buf: DevBuf,
    dtype: DType,
    layers: usize,
    rows: usize,
    cols: usize,
}

/// One channel's patch factors for every layer, back to back, and per layer (P offset, Wᵀ
/// offset, rank) for the kernel.
struct Factors {
    p: CudaSlice<f32>,
    wt: CudaSlice<f32>,
    jobs: CudaSlice<i64>,
    max_rank: usize,
}

/// R(δ) for every layer (`[layers, rotary_dims / 2]`) and how heads pair their dims.
struct Rotation {
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    n_heads: usize,
    head_dim: usize,
    rotary_dims: usize,
    interleaved: bool,
}

fn dtype_tag(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
    }
}

/// PTX of kernels/reuse.cu per architecture, compiled once per process.
fn ptx_for(arch: &'static str) -> Result<Ptx> {
    static CACHE: OnceLock<Mutex<HashMap<&'static str, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(src) = cache.get(arch) {
        return Ok(Ptx::from_src(src.clone()));
    }
    let ptx = compile_ptx_with_opts(
        KERNEL_SOURCE,
        CompileOptions {
            arch: Some(arch),
            ..Default::default()
        },
    )
    .map_err(|e| Error::Compile {
        op: "CudaBackend::new",
        arch: arch.to_string(),
        detail: e.to_string(),
    })?;
    cache.insert(arch, ptx.to_src());
    Ok(ptx)
}

impl CudaBackend {
    /// Opens device `ordinal` and loads the kernels (compiling them on first use). Errors, never
    /// panics, where the driver or NVRTC is missing.
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
        let module = ctx.load_module(ptx_for(arch)?).map_err(driver(OP))?;
        let name = ctx.name().map_err(driver(OP))?;
        let stream = ctx.default_stream();
        Ok(CudaBackend {
            ctx,
            stream,
            module,
            name,
            wide: true,
        })
    }

    /// With `false`, every launch uses the two-column kernels, which take any shape (for parity
    /// tests and benchmarks; the four-column ones are picked by default where the shape allows).
    pub fn with_wide_units(mut self, wide: bool) -> CudaBackend {
        self.wide = wide;
        self
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn device_name(&self) -> String {
        self.name.clone()
    }

    fn function(&self, wide: bool, src: DType, dst: DType) -> Result<CudaFunction> {
        let kernel = if wide { "reuse4" } else { "reuse" };
        let name = format!("{kernel}_{}_{}", dtype_tag(src), dtype_tag(dst));
        self.module
            .load_function(&name)
            .map_err(driver("CudaBackend::function"))
    }

    /// Uploads the K (or V) channel of every layer.
    fn upload_channel(&self, kv: &ChunkKv, v_channel: bool) -> Result<Channel> {
        let op = "CudaBackend::upload";
        let mats: Vec<&Mat> = kv
            .layers()
            .iter()
            .map(|x| if v_channel { &x.v } else { &x.k })
            .collect();
        let cols = mats.first().map_or(0, |m| m.cols());
        let (dtype, buf) = (
            kv.dtype(),
            match kv.dtype() {
                DType::F32 => {
                    let mut all = Vec::with_capacity(mats.len() * kv.n_tokens() * cols);
                    for m in &mats {
                        if let Buf::F32(v) = m.data() {
                            all.extend_from_slice(v);
                        }
                    }
                    DevBuf::F32(self.stream.clone_htod(&all).map_err(driver(op))?)
                }
                _ => {
                    let mut all = Vec::with_capacity(mats.len() * kv.n_tokens() * cols);
                    for m in &mats {
                        match m.data() {
                            Buf::F16(v) => all.extend(v.iter().map(|x| x.to_bits())),
                            Buf::Bf16(v) => all.extend(v.iter().map(|x| x.to_bits())),
                            Buf::F32(_) => {}
                        }
                    }
                    DevBuf::U16(self.stream.clone_htod(&all).map_err(driver(op))?)
                }
            },
        );
        Ok(Channel {
            buf,
            dtype,
            layers: mats.len(),
            rows: kv.n_tokens(),
            cols,
        })
    }

    fn zeros_channel(&self, dtype: DType, layers: usize, rows: usize, cols: usize) -> Result<Channel> {
        let op = "CudaBackend::alloc";
        let len = (layers * rows * cols).max(1);
        let buf = match dtype {
            DType::F32 => DevBuf::F32(self.stream.alloc_zeros::<f32>(len).map_err(driver(op))?),
            _ => DevBuf::U16(self.stream.alloc_zeros::<u16>(len).map_err(driver(op))?),
        };
        Ok(Channel {
            buf,
            dtype,
            layers,
            rows,
            cols,
        })
    }

    /// Reads a channel back into rows `dst_row..` of every layer of `dst`.
    fn download_channel(&self, ch: &Channel, v_channel: bool, dst: &mut ChunkKv, dst_row: usize) -> Result<()> {
        let op = "CudaBackend::download";
        let per_layer = ch.rows * ch.cols;
        enum Host {
            F32(Vec<f32>),
            U16(Vec<u16>),
        }
        let host = match &ch.buf {
            DevBuf::F32(s) => Host::F32(self.stream.clone_dtoh(s).map_err(driver(op))?),
            DevBuf::U16(s) => Host::U16(self.stream.clone_dtoh(s).map_err(driver(op))?),
        };
        for (l, layer) in dst.layers_mut().iter_mut().enumerate().take(ch.layers) {
            let m = if v_channel { &mut layer.v } else { &mut layer.k };
            let at = dst_row * m.cols();
            let range = l * per_layer..(l + 1) * per_layer;
            match (&host, m.data_mut()) {
                (Host::F32(v), Buf::F32(out)) => out[at..at + per_layer].copy_from_slice(&v[range]),
                (Host::U16(v), Buf::F16(out)) => {
                    for (o, &b) in out[at..at + per_layer].iter_mut().zip(&v[range]) {
                        *o = f16::from_bits(b);
                    }
                }
                (Host::U16(v), Buf::Bf16(out)) => {
                    for (o, &b) in out[at..at + per_layer].iter_mut().zip(&v[range]) {
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
        }
        Ok(())
    }

    /// Uploads one channel's patch factors (`None`: no patch) for `layers` layers.
    fn upload_factors(&self, layers: usize, lrs: Option<Vec<&LowRank>>) -> Result<Factors> {
        let op = "CudaBackend::factors";
        let (mut p, mut wt, mut jobs, mut max_rank) = (Vec::new(), Vec::new(), Vec::with_capacity(3 * layers), 0);
        for l in 0..layers {
            let lr = lrs.as_ref().map(|v| v[l]).filter(|lr| lr.rank() > 0);
            jobs.extend([p.len() as i64, wt.len() as i64, lr.map_or(0, |lr| lr.rank()) as i64]);
            if let Some(lr) = lr {
                p.extend(lr.p.to_f32_vec());
                wt.extend(lr.wt.to_f32_vec());
                max_rank = max_rank.max(lr.rank());
            }
        }
        p.push(0.0);
        wt.push(0.0);
        Ok(Factors {
            p: self.stream.clone_htod(&p).map_err(driver(op))?,
            wt: self.stream.clone_htod(&wt).map_err(driver(op))?,
            jobs: self.stream.clone_htod(&jobs).map_err(driver(op))?,
            max_rank,
        })
    }

    /// R(δ) of every layer on the device.
    fn rotation(&self, rope: &RopeSpec, layout: &kamera_ops::KvLayout, delta: i64) -> Result<Rotation> {
        let op = "CudaBackend::rotation";
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for l in 0..layout.n_layers {
            let (c, s) = rope.cos_sin(l, &[delta])?;
            cos.extend(c);
            sin.extend(s);
        }
        cos.push(1.0);
        sin.push(0.0);
        let (n_heads, head_dim) = layout.rope_heads();
        Ok(Rotation {
            cos: self.stream.clone_htod(&cos).map_err(driver(op))?,
            sin: self.stream.clone_htod(&sin).map_err(driver(op))?,
            n_heads,
            head_dim,
            rotary_dims: rope.rotary_dims,
            interleaved: rope.layout == PairLayout::Interleaved,
        })
    }

    /// One fused launch over every layer of a channel: `dst[l, dst_row + t] = R(src[l, t] + P Wᵀ)`
    /// (no R when `rot` is None).
    fn launch(
        &self,
        src: &Channel,
        dst: &mut Channel,
        dst_row: usize,
        fac: &Factors,
        rot: (&Rotation, bool),
        bad: &mut CudaSlice<i32>,
    ) -> Result<()> {
        const OP: &str = "CudaBackend::launch";
        let layers = src.layers;
        if src.rows == 0 || layers == 0 {
            return Ok(());
        }
        let smem = ROWS * fac.max_rank.next_multiple_of(4) * 4;
        if smem > SMEM_LIMIT {
            return Err(Error::Driver {
                op: OP,
                detail: format!(
                    "patch rank {} needs {smem} B of shared memory (at most {SMEM_LIMIT})",
                    fac.max_rank
                ),
            });
        }
        let (rotation, rotate) = rot;
        // Four-column units need every head, the rotary span and the row in multiples of 4.
        let wide = self.wide
            && src.cols % 4 == 0
            && (!rotate
                || (rotation.head_dim % 4 == 0
                    && rotation.rotary_dims % 4 == 0
                    && rotation.n_heads * rotation.head_dim <= src.cols));
        let f = self.function(wide, src.dtype, dst.dtype)?;
        let units = if wide { src.cols / 4 } else { src.cols.div_ceil(2) };
        let cfg = LaunchConfig {
            grid_dim: (src.rows.div_ceil(ROWS) as u32, layers as u32, 1),
            block_dim: (units.next_multiple_of(32).min(256) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let int = |x: usize| x as i32;
        let (n, cols, d_row, d_rows) = (int(src.rows), int(src.cols), int(dst_row), int(dst.rows));
        let (rotate, heads, hd, rd, inter) = (
            rotate as i32,
            int(rotation.n_heads),
            int(rotation.head_dim),
            int(rotation.rotary_dims),
            rotation.interleaved as i32,
        );
        let mut b = self.stream.launch_builder(&f);
        match &src.buf {
            DevBuf::F32(s) => b.arg(s),
            DevBuf::U16(s) => b.arg(s),
        };
        match &mut dst.buf {
            DevBuf::F32(d) => b.arg(d),
            DevBuf::U16(d) => b.arg(d),
        };
        b.arg(&n).arg(&cols).arg(&d_row).arg(&d_rows);
        b.arg(&fac.p).arg(&fac.wt).arg(&fac.jobs);
        b.arg(&rotation.cos).arg(&rotation.sin).arg(&rotate);
        b.arg(&heads).arg(&hd).arg(&rd).arg(&inter).arg(bad);
        // SAFETY: argument types and order match the kernel signature in kernels/reuse.cu; src holds
        // layers·n·cols elements, dst layers·dst_rows·cols with dst_row + n ≤ dst_rows (checked by
        // check_reuse), the factors hold what `jobs` points at, the tables layers·rotary_dims/2.
        unsafe { b.launch(cfg) }.map_err(driver(OP))?;
        Ok(())
    }

    /// Uploads `canonical` (and its patch) and writes it relocated to δ into rows `dst_row..` of
    /// the device context `dst` (K and V), one launch per channel.
    fn reuse_on_device(
        &self,
        canonical: &ChunkKv,
        patch: Option<&Patch>,
        rope: &RopeSpec,
        delta: i64,
        dst: &mut (Channel, Channel),
        dst_row: usize,
        bad: &mut CudaSlice<i32>,
    ) -> Result<()> {
        let layers = canonical.layout().n_layers;
        let rot = self.rotation(rope, canonical.layout(), delta)?;
        let k = self.upload_channel(canonical, false)?;
        let fk = self.upload_factors(layers, patch.map(|p| p.layers().iter().map(|x| &x.k).collect()))?;
        self.launch(&k, &mut dst.0, dst_row, &fk, (&rot, delta != 0), bad)?;
        let v = self.upload_channel(canonical, true)?;
        let fv = self.upload_factors(layers, patch.map(|p| p.layers().iter().map(|x| &x.v).collect()))?;
        self.launch(&v, &mut dst.1, dst_row, &fv, (&rot, false), bad)
    }

    fn finish(&self, op: &'static str, bad: &CudaSlice<i32>) -> Result<()> {
        if self.stream.clone_dtoh(bad).map_err(driver(op))?[0] != 0 {
            return Err(kamera_ops::Error::NonFinite {
                op,
                what: "relocated or patched KV".into(),
                index: 0,
            }
            .into());
        }
        Ok(())
    }

    fn device_context(&self, dst: &ChunkKv, rows: usize) -> Result<(Channel, Channel)> {
        let layers = dst.layout().n_layers;
        let (kc, vc) = dst.layers().first().map_or((0, 0), |l| (l.k.cols(), l.v.cols()));
        Ok((
            self.zeros_channel(dst.dtype(), layers, rows, kc)?,
            self.zeros_channel(dst.dtype(), layers, rows, vc)?,
        ))
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
        let mut bad = self.stream.alloc_zeros::<i32>(1).map_err(driver(OP))?;
        let mut out = self.device_context(dst, canonical.n_tokens())?;
        self.reuse_on_device(canonical, patch, rope, delta, &mut out, 0, &mut bad)?;
        self.finish(OP, &bad)?;
        self.download_channel(&out.0, false, dst, dst_row)?;
        self.download_channel(&out.1, true, dst, dst_row)
    }

    /// Gathers the chunks into one device context (each relocated and patched into its rows) and
    /// reads it back once.
    fn assemble(&self, parts: &[Placement<'_>], rope: &RopeSpec, start: i64, dtype: DType) -> Result<ChunkKv> {
        const OP: &str = "CudaBackend::assemble";
        let Some(first) = parts.first() else {
            return Err(kamera_ops::Error::Shape {
                op: OP,
                what: "parts".into(),
                expected: "at least one chunk".into(),
                got: "0".into(),
            }
            .into());
        };
        let total = parts.iter().map(|p| p.chunk.n_tokens()).sum();
        let mut host = ChunkKv::zeros(*first.chunk.layout(), start, total, dtype)?;
        let mut out = self.device_context(&host, total)?;
        let mut bad = self.stream.alloc_zeros::<i32>(1).map_err(driver(OP))?;
        let mut row = 0;
        for p in parts {
            let delta = kamera_ops::check_reuse(OP, p.chunk, p.patch, rope, &host, row)?;
            self.reuse_on_device(p.chunk, p.patch, rope, delta, &mut out, row, &mut bad)?;
            row += p.chunk.n_tokens();
        }
        self.finish(OP, &bad)?;
        self.download_channel(&out.0, false, &mut host, 0)?;
        self.download_channel(&out.1, true, &mut host, 0)?;
        Ok(host)
    }
}

#[cfg(test)]
mod tests {
    /// NVRTC alone (no GPU) compiles every kernel for Hopper; skipped where NVRTC is missing.
    #[test]
    fn kernels_compile_for_hopper_without_a_gpu() {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("SKIPPED: NVRTC (libnvrtc) is not installed");
            return;
        }
        let ptx = super::ptx_for("sm_90").unwrap().to_src();
        for name in ["reuse_f32_f32", "reuse_f16_bf16", "reuse_bf16_bf16", "reuse_bf16_f32"] {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing from the PTX");
        }
    }
}
