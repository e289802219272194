//! The CUDA backend: NVRTC compiles kernels/reuse.cu once per process and architecture; host code
//! uploads a chunk's K/V (all layers back to back), its patch factors and the R(δ) table, runs one
//! fused launch per channel, and reads the rows back. CPU reference: kamera-ops.

mod bench;
mod launch;
pub(crate) mod model;
mod model_bench;
pub(crate) mod pool;

use crate::KERNEL_SOURCE;
use crate::backend::Backend;
use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};
use half::{bf16, f16};
use kamera_ops::{Buf, ChunkKv, DType, LowRank, Mat, PairLayout, Patch, Placement, RopeSpec};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use launch::Kernel;

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
    /// Compute capability 8.0 or newer: 16-bit MMA for 16-bit patch factors.
    tensor_cores: bool,
    /// Shared memory one block may opt in to.
    smem_optin: usize,
    /// `sm_XY` of the device.
    arch: &'static str,
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

/// How a chunk moves on its way into a context: relocated by δ under `rope` (KAMERA.md, "The operator"),
/// then its low-rank patch (if any) added.
#[derive(Clone, Copy)]
struct Shift<'a> {
    patch: Option<&'a Patch>,
    rope: &'a RopeSpec,
    delta: i64,
}

/// One channel's patch factors for every layer, back to back, and per layer (P offset, Wᵀ
/// offset, rank) for the kernel.
struct Factors {
    /// f32 for the FMA kernels, raw 16-bit words for the tensor-core ones.
    p: DevBuf,
    wt: DevBuf,
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

/// The raw words of a 16-bit matrix (empty for f32, which the tensor-core plan never sends).
fn bits16(m: &Mat) -> Vec<u16> {
    match m.data() {
        Buf::F16(v) => v.iter().map(|x| x.to_bits()).collect(),
        Buf::Bf16(v) => v.iter().map(|x| x.to_bits()).collect(),
        Buf::F32(_) => Vec::new(),
    }
}

/// The one 16-bit dtype every ranked layer's factors share, if any (the tensor-core kernels
/// multiply those exactly).
fn factor_dtype(lrs: Option<&[&LowRank]>) -> Option<DType> {
    let ranked: Vec<&LowRank> = lrs?.iter().copied().filter(|lr| lr.rank() > 0).collect();
    let d = ranked.first()?.p.dtype();
    (d != DType::F32 && ranked.iter().all(|lr| lr.p.dtype() == d && lr.wt.dtype() == d)).then_some(d)
}

fn dtype_tag(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
    }
}

/// PTX of one kernel source (`name`: its cache key) per architecture, compiled once per process.
pub(super) fn ptx_for_source(src: &'static str, name: &'static str, arch: &'static str) -> Result<Ptx> {
    static CACHE: OnceLock<Mutex<HashMap<(&'static str, &'static str), String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ptx) = cache.get(&(name, arch)) {
        return Ok(Ptx::from_src(ptx.clone()));
    }
    let ptx = compile_ptx_with_opts(
        src,
        CompileOptions {
            arch: Some(arch),
            ..Default::default()
        },
    )
    .map_err(|e| Error::Compile {
        op: "CudaBackend::new",
        file: name,
        arch: arch.to_string(),
        detail: e.to_string(),
    })?;
    cache.insert((name, arch), ptx.to_src());
    Ok(ptx)
}

/// PTX of kernels/reuse.cu per architecture.
fn ptx_for(arch: &'static str) -> Result<Ptx> {
    ptx_for_source(KERNEL_SOURCE, "reuse", arch)
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
        let smem_optin = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(driver(OP))? as usize;
        let stream = ctx.default_stream();
        Ok(CudaBackend {
            ctx,
            stream,
            module,
            name,
            wide: true,
            tensor_cores: major >= 8,
            smem_optin,
            arch,
        })
    }

    /// With `false`, every launch uses the two-column FMA kernels, which take any shape (for
    /// parity tests and benchmarks; by default the four-column ones, with tensor cores for 16-bit
    /// patch factors, are picked where the shape and device allow).
    pub fn with_wide_units(mut self, wide: bool) -> CudaBackend {
        self.wide = wide;
        self
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn device_name(&self) -> String {
        self.name.clone()
    }

    fn function(&self, kernel: Kernel, src: DType, dst: DType) -> Result<CudaFunction> {
        let name = match kernel {
            Kernel::Pairs => format!("reuse_{}_{}", dtype_tag(src), dtype_tag(dst)),
            Kernel::Wide => format!("reuse4_{}_{}", dtype_tag(src), dtype_tag(dst)),
            Kernel::WideTc { factors, pipelined, .. } => {
                let family = if pipelined { "reuse4tcp" } else { "reuse4tc" };
                format!("{family}_{}_{}_{}", dtype_tag(src), dtype_tag(dst), dtype_tag(factors))
            }
        };
        self.module
            .load_function(&name)
            .map_err(driver("CudaBackend::function"))
    }

    /// Uploads the K (or V) channel of every layer.
    fn upload_channel(&self, kv: &ChunkKv, v_channel: bool) -> Result<Channel> {
        let mats: Vec<&Mat> = kv
            .layers()
            .iter()
            .map(|x| if v_channel { &x.v } else { &x.k })
            .collect();
        let cols = mats.first().map_or(0, |m| m.cols());
        self.upload_mats(&mats, kv.dtype(), kv.n_tokens(), cols)
    }

    /// Uploads `[rows, cols]` matrices of `dtype`, one per layer, back to back (f32 as is, 16-bit
    /// types as raw words; one padding element when empty: no zero-byte allocations).
    fn upload_mats(&self, mats: &[&Mat], dtype: DType, rows: usize, cols: usize) -> Result<Channel> {
        let op = "CudaBackend::upload";
        let buf = if dtype == DType::F32 {
            let mut all = Vec::with_capacity(mats.len() * rows * cols);
            for m in mats {
                match m.data() {
                    Buf::F32(v) => all.extend_from_slice(v),
                    _ => all.extend(m.to_f32_vec()),
                }
            }
            all.resize(all.len().max(1), 0.0);
            DevBuf::F32(self.stream.clone_htod(&all).map_err(driver(op))?)
        } else {
            let mut all: Vec<u16> = mats.iter().flat_map(|m| bits16(m)).collect();
            all.resize(all.len().max(1), 0);
            DevBuf::U16(self.stream.clone_htod(&all).map_err(driver(op))?)
        };
        Ok(Channel {
            buf,
            dtype,
            layers: mats.len(),
            rows,
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

    /// Uploads one channel's patch factors (`None`: no patch) for `layers` layers: raw 16-bit
    /// words for the tensor-core kernel, f32 for the others.
    fn upload_factors(&self, layers: usize, lrs: Option<&[&LowRank]>, kernel: Kernel) -> Result<Factors> {
        let op = "CudaBackend::factors";
        let ranked = |l: usize| lrs.map(|v| v[l]).filter(|lr| lr.rank() > 0);
        let (mut jobs, mut max_rank, mut at) = (Vec::with_capacity(3 * layers), 0, (0, 0));
        for l in 0..layers {
            let rank = ranked(l).map_or(0, |lr| lr.rank());
            jobs.extend([at.0 as i64, at.1 as i64, rank as i64]);
            if let Some(lr) = ranked(l) {
                at = (at.0 + lr.p.rows() * rank, at.1 + rank * lr.wt.cols());
            }
            max_rank = max_rank.max(rank);
        }
        let upload = |pick: &dyn Fn(&LowRank) -> &Mat| -> Result<DevBuf> {
            Ok(if matches!(kernel, Kernel::WideTc { .. }) {
                let mut all: Vec<u16> = (0..layers).filter_map(ranked).flat_map(|lr| bits16(pick(lr))).collect();
                all.push(0);
                DevBuf::U16(self.stream.clone_htod(&all).map_err(driver(op))?)
            } else {
                let mut all: Vec<f32> = (0..layers)
                    .filter_map(ranked)
                    .flat_map(|lr| pick(lr).to_f32_vec())
                    .collect();
                all.push(0.0);
                DevBuf::F32(self.stream.clone_htod(&all).map_err(driver(op))?)
            })
        };
        Ok(Factors {
            p: upload(&|lr| &lr.p)?,
            wt: upload(&|lr| &lr.wt)?,
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

    /// Uploads `canonical` (and its patch) and writes it moved by `shift` into rows `dst_row..`
    /// of the device context `dst` (K and V), one launch per channel.
    fn reuse_on_device(
        &self,
        canonical: &ChunkKv,
        shift: Shift<'_>,
        dst: &mut (Channel, Channel),
        dst_row: usize,
        bad: &mut CudaSlice<i32>,
    ) -> Result<()> {
        let src = (
            self.upload_channel(canonical, false)?,
            self.upload_channel(canonical, true)?,
        );
        self.reuse_resident(&src, canonical.layout(), shift, (&mut dst.0, &mut dst.1, dst_row), bad)
    }

    /// Writes K/V already on the device (`src`), moved by `shift`, into rows `row..` of the
    /// target `(k, v, row)`, one launch per channel.
    fn reuse_resident(
        &self,
        src: &(Channel, Channel),
        layout: &kamera_ops::KvLayout,
        shift: Shift<'_>,
        dst: (&mut Channel, &mut Channel, usize),
        bad: &mut CudaSlice<i32>,
    ) -> Result<()> {
        let Shift { patch, rope, delta } = shift;
        let dst_row = dst.2;
        let layers = layout.n_layers;
        let rot = self.rotation(rope, layout, delta)?;
        for (v_channel, src, out) in [(false, &src.0, dst.0), (true, &src.1, dst.1)] {
            let lrs: Option<Vec<&LowRank>> =
                patch.map(|p| p.layers().iter().map(|x| if v_channel { &x.v } else { &x.k }).collect());
            let rotate = !v_channel && delta != 0;
            let max_rank = lrs
                .as_ref()
                .map_or(0, |v| v.iter().map(|lr| lr.rank()).max().unwrap_or(0));
            let kernel = self.plan(
                src.dtype,
                src.cols,
                (&rot, rotate),
                factor_dtype(lrs.as_deref()),
                max_rank,
            );
            let fac = self.upload_factors(layers, lrs.as_deref(), kernel)?;
            self.launch(kernel, src, out, dst_row, &fac, (&rot, rotate), bad)?;
        }
        Ok(())
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
        self.reuse_on_device(canonical, Shift { patch, rope, delta }, &mut out, 0, &mut bad)?;
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
            let shift = Shift {
                patch: p.patch,
                rope,
                delta,
            };
            self.reuse_on_device(p.chunk, shift, &mut out, row, &mut bad)?;
            row += p.chunk.n_tokens();
        }
        self.finish(OP, &bad)?;
        self.download_channel(&out.0, false, &mut host, 0)?;
        self.download_channel(&out.1, true, &mut host, 0)?;
        Ok(host)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// These tests need NVRTC (no GPU): scripts/test.sh installs it and puts it on
    /// LD_LIBRARY_PATH. Without it they fail, saying so, rather than pass untested.
    #[track_caller]
    pub(crate) fn require_nvrtc() {
        // SAFETY: only probes whether the shared library can be loaded.
        let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
        assert!(
            present,
            "NVRTC (libnvrtc) cannot be loaded: run scripts/install-nvrtc.sh and put the directory it \
             prints on LD_LIBRARY_PATH (scripts/test.sh does both)"
        );
    }

    /// NVRTC alone (no GPU) compiles every kernel for Hopper.
    #[test]
    fn kernels_compile_for_hopper_without_a_gpu() {
        require_nvrtc();
        let ptx = super::ptx_for("sm_90").unwrap().to_src();
        let mut names = vec![
            "reuse_f32_f32".to_string(),
            "reuse_f16_bf16".to_string(),
            "reuse4_bf16_f32".to_string(),
            "reuse4tc_bf16_bf16_bf16".to_string(),
            "reuse4tc_f16_f32_f16".to_string(),
        ];
        // Every pipelined tensor-core kernel: 16-bit rows, any output, either factor type.
        for src in ["f16", "bf16"] {
            for dst in ["f32", "f16", "bf16"] {
                for factors in ["f16", "bf16"] {
                    names.push(format!("reuse4tcp_{src}_{dst}_{factors}"));
                }
            }
        }
        for name in &names {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing from the PTX");
        }
        for instruction in [
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            "cp.async.cg.shared.global",
            "cp.async.wait_group 2",
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        ] {
            assert!(ptx.contains(instruction), "{instruction} missing from the PTX");
        }
        // Registers only: a local-memory array would mean a spilled per-thread tile.
        assert!(!ptx.contains(".local"), "a kernel keeps an array in local memory");
    }

    /// What ptxas (run by NVRTC for a real architecture) reports of every kernel for sm_90:
    /// (name, stack frame bytes, spill store bytes, registers).
    fn ptxas_report() -> Vec<(String, usize, usize, usize)> {
        use cudarc::nvrtc::result;
        require_nvrtc();
        let src = std::ffi::CString::new(crate::KERNEL_SOURCE).unwrap();
        let prog = result::create_program(&src, None).unwrap();
        // SAFETY: `prog` was just created and is destroyed once, after its log is read.
        let log = unsafe {
            let compiled = result::compile_program(prog, &["--gpu-architecture=sm_90", "-Xptxas=-v"]);
            let log = result::get_program_log(prog).unwrap();
            result::destroy_program(prog).unwrap();
            compiled.unwrap();
            std::ffi::CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned()
        };
        let number = |line: &str, before: &str| -> usize {
            let at = line.find(before).unwrap_or_else(|| panic!("no '{before}' in '{line}'"));
            line[..at].split_whitespace().last().unwrap().parse().unwrap()
        };
        let lines: Vec<&str> = log.lines().collect();
        let mut report = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let Some(rest) = line.strip_prefix("ptxas info    : Function properties for ") else {
                continue;
            };
            let props = lines[i + 1];
            let regs = lines[i + 2..]
                .iter()
                .find(|l| l.contains("registers"))
                .map_or(0, |l| number(l, " registers"));
            let name = rest.trim().to_string();
            report.push((
                name,
                number(props, " bytes stack frame"),
                number(props, " bytes spill stores"),
                regs,
            ));
        }
        report
    }

    /// The pipelined kernels hold nothing in local memory after register allocation either (no
    /// stack frame, no spills) at their 80-register bound (3 blocks of 256 threads per SM).
    #[test]
    fn pipelined_kernels_do_not_spill_on_hopper() {
        let report = ptxas_report();
        let tcp: Vec<_> = report.iter().filter(|r| r.0.starts_with("reuse4tcp_")).collect();
        assert_eq!(tcp.len(), 12, "{report:?}");
        for (name, stack, spills, regs) in tcp {
            assert_eq!((*stack, *spills), (0, 0), "{name}: stack frame / spill stores");
            assert!(*regs <= 80, "{name}: {regs} registers");
        }
    }
}
