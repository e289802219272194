//! The decoder forward on the device: cuBLAS for every matrix product (bf16 weights and inputs,
//! f32 accumulate and output), kernels/model.cu for the rest, the KV context resident on the
//! device in bf16 (`DeviceKv`). CPU reference: kamera-model's block.rs.

use super::{Channel, CudaBackend, DevBuf, driver};
use crate::MODEL_KERNEL_SOURCE;
use crate::error::{Error, Result};
use crate::model::{HostWeights, ModelSpec};
use cudarc::cublas::{CudaBlas, result as blas, sys as blas_sys};
use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use half::bf16;
use kamera_ops::{ChunkKv, DType, KvLayout, LayerKv, Mat};
use std::collections::HashMap;
use std::sync::Arc;

/// Rows a context holds at least once it holds anything.
const MIN_CAPACITY: usize = 256;

/// A KV context on the device: K and V of every layer, bf16, `[layers, capacity, kv_dim]` each,
/// rows `0..len` valid, row 0 at position `offset`. The reuse kernels write into it directly.
pub struct DeviceKv {
    pub(super) k: Channel,
    pub(super) v: Channel,
    pub(super) layout: KvLayout,
    pub(super) offset: i64,
    pub(super) len: usize,
}

impl std::fmt::Debug for DeviceKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceKv")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("capacity", &self.k.rows)
            .finish()
    }
}

impl DeviceKv {
    /// Valid rows.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Position of row 0.
    pub fn offset(&self) -> i64 {
        self.offset
    }
    /// Position of the next row.
    pub fn end(&self) -> i64 {
        self.offset + self.len as i64
    }
    /// Keeps rows `0..len` (no-op when already shorter).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    /// Empties the context and puts its next row at `offset`.
    pub fn reset(&mut self, offset: i64) {
        self.len = 0;
        self.offset = offset;
    }
    /// Bytes of device memory held.
    pub fn bytes(&self) -> usize {
        2 * self.k.layers * self.k.rows * self.k.cols * 2
    }
}

/// Device weights of one layer (bf16 as raw words; norms and biases f32).
struct DevLayer {
    attn_norm: CudaSlice<f32>,
    /// `[q_dim + 2·kv_dim, hidden]`: Q, K and V stacked.
    wqkv: CudaSlice<u16>,
    bias: Option<CudaSlice<f32>>,
    qk_norm: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    wo: CudaSlice<u16>,
    post_attn_norm: Option<CudaSlice<f32>>,
    ffn_norm: CudaSlice<f32>,
    /// `[2·ffn, hidden]`: gate then up.
    w_gate_up: CudaSlice<u16>,
    w_down: CudaSlice<u16>,
    post_ffn_norm: Option<CudaSlice<f32>>,
}

struct Kernels {
    embed: CudaFunction,
    norm_bf16: CudaFunction,
    norm_f32: CudaFunction,
    qkv_rope: CudaFunction,
    attend: CudaFunction,
    gate_mul: CudaFunction,
    add: CudaFunction,
    copy_rows: CudaFunction,
}

/// A decoder resident on one device, with the backend whose reuse kernels place cached chunks
/// into its contexts.
pub struct DeviceModel {
    backend: CudaBackend,
    blas: CudaBlas,
    _module: Arc<CudaModule>,
    k: Kernels,
    spec: ModelSpec,
    embed: CudaSlice<u16>,
    lm_head: Option<CudaSlice<u16>>,
    out_norm: CudaSlice<f32>,
    layers: Vec<DevLayer>,
}

impl std::fmt::Debug for DeviceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceModel")
            .field("device", &self.backend.device_name())
            .field("layers", &self.spec.layers)
            .field("hidden", &self.spec.hidden)
            .finish()
    }
}

fn bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
}

/// Base address of a device buffer (every launch and product runs on the one stream, in order).
fn addr<T>(s: &CudaSlice<T>, b: &CudaBackend) -> u64 {
    s.device_ptr(&b.stream).0
}

/// A launch over `n` items with a grid-stride loop.
fn flat(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 132 * 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn rows(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl DeviceModel {
    /// Uploads `weights` (as bf16) to device `ordinal` and loads the kernels. Errors, never
    /// panics, without a driver, NVRTC or cuBLAS, or for a shape the kernels do not take.
    pub fn new(ordinal: usize, spec: ModelSpec, weights: &HostWeights) -> Result<DeviceModel> {
        const OP: &str = "DeviceModel::new";
        if let Some(why) = spec.unsupported() {
            return Err(Error::Unsupported { op: OP, detail: why });
        }
        weights
            .check(&spec)
            .map_err(|detail| Error::Unsupported { op: OP, detail })?;
        let backend = CudaBackend::new(ordinal)?;
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::NoLibrary {
                op: OP,
                lib: "cuBLAS (libcublas)",
            });
        }
        let blas = CudaBlas::new(backend.stream.clone()).map_err(|e| Error::Driver {
            op: OP,
            detail: format!("cuBLAS: {e}"),
        })?;
        let module = backend
            .ctx
            .load_module(super::ptx_for_source(MODEL_KERNEL_SOURCE, "model", backend.arch)?)
            .map_err(driver(OP))?;
        let f = |name: &str| module.load_function(name).map_err(driver(OP));
        let k = Kernels {
            embed: f("embed_rows")?,
            norm_bf16: f("rms_norm_bf16")?,
            norm_f32: f("rms_norm_f32")?,
            qkv_rope: f("qkv_rope")?,
            attend: f("attend")?,
            gate_mul: f("gate_mul")?,
            add: f("add_f32")?,
            copy_rows: f("copy_rows")?,
        };
        let s = &backend.stream;
        let up16 = |v: &[f32]| s.clone_htod(&bits(v)).map_err(driver(OP));
        let up32 = |v: &[f32]| s.clone_htod(v).map_err(driver(OP));
        let cat = |parts: &[&Vec<f32>]| parts.iter().flat_map(|p| p.iter().copied()).collect::<Vec<f32>>();
        let mut layers = Vec::with_capacity(spec.layers);
        for w in &weights.layers {
            layers.push(DevLayer {
                attn_norm: up32(&w.attn_norm)?,
                wqkv: up16(&cat(&[&w.wq, &w.wk, &w.wv]))?,
                bias: match &w.bias {
                    Some([q, k, v]) => Some(up32(&cat(&[q, k, v]))?),
                    None => None,
                },
                qk_norm: match &w.qk_norm {
                    Some([q, k]) => Some((up32(q)?, up32(k)?)),
                    None => None,
                },
                wo: up16(&w.wo)?,
                post_attn_norm: w.post_attn_norm.as_deref().map(up32).transpose()?,
                ffn_norm: up32(&w.ffn_norm)?,
                w_gate_up: up16(&cat(&[&w.w_gate, &w.w_up]))?,
                w_down: up16(&w.w_down)?,
                post_ffn_norm: w.post_ffn_norm.as_deref().map(up32).transpose()?,
            });
        }
        let (embed, lm_head, out_norm) = (
            up16(&weights.embed)?,
            weights.lm_head.as_deref().map(up16).transpose()?,
            up32(&weights.out_norm)?,
        );
        Ok(DeviceModel {
            backend,
            blas,
            _module: module,
            k,
            spec,
            embed,
            lm_head,
            out_norm,
            layers,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }
    /// The backend sharing this model's device and stream (its reuse kernels place chunks).
    pub fn backend(&self) -> &CudaBackend {
        &self.backend
    }
    /// Waits for all queued device work (for timing).
    pub fn synchronize(&self) -> Result<()> {
        self.backend
            .stream
            .synchronize()
            .map_err(driver("DeviceModel::synchronize"))
    }

    /// An empty context whose next row sits at `offset`.
    pub fn context(&self, offset: i64) -> Result<DeviceKv> {
        let ch = |b: &CudaBackend| b.zeros_channel(DType::Bf16, self.spec.layers, 0, self.spec.kv_dim());
        Ok(DeviceKv {
            k: ch(&self.backend)?,
            v: ch(&self.backend)?,
            layout: self.spec.kv_layout(),
            offset,
            len: 0,
        })
    }

    /// Makes room for `n` more rows (doubling), copying the valid rows over.
    pub fn reserve(&self, kv: &mut DeviceKv, n: usize) -> Result<()> {
        const OP: &str = "DeviceModel::reserve";
        let need = kv.len + n;
        if need <= kv.k.rows {
            return Ok(());
        }
        let cap = need.max(2 * kv.k.rows).max(MIN_CAPACITY);
        let (layers, cols) = (self.spec.layers, self.spec.kv_dim());
        for old in [&mut kv.k, &mut kv.v] {
            let new = self.backend.zeros_channel(DType::Bf16, layers, cap, cols)?;
            if kv.len > 0 {
                let (DevBuf::U16(src), DevBuf::U16(dst)) = (&old.buf, &new.buf) else {
                    return Err(Error::Driver {
                        op: OP,
                        detail: "context buffers are not bf16".into(),
                    });
                };
                let (s, d) = (addr(src, &self.backend), addr(dst, &self.backend));
                let (l, r, c, from, to) = (layers as i32, kv.len as i64, cols as i64, old.rows as i64, cap as i64);
                let mut b = self.backend.stream.launch_builder(&self.k.copy_rows);
                b.arg(&s).arg(&d).arg(&l).arg(&r).arg(&c).arg(&from).arg(&to);
                // SAFETY: src holds layers·from rows of cols words, dst layers·to rows, rows ≤ from ≤ to.
                unsafe { b.launch(flat(layers * kv.len * cols)) }.map_err(driver(OP))?;
            }
            *old = new;
        }
        Ok(())
    }

    /// `y[n, out] (+)= x[n, in] · w[out, in]ᵀ`: bf16 inputs, f32 output, f32 accumulate; with
    /// `accumulate` the product is added to `y` (the residual stream). `shape` is `(n, in, out)`.
    fn linear(&self, x: u64, w: u64, y: u64, shape: (usize, usize, usize), accumulate: bool) -> Result<()> {
        let (n, inp, out) = shape;
        let (alpha, beta) = (1f32, if accumulate { 1f32 } else { 0f32 });
        let (m, nn, k) = (out as i32, n as i32, inp as i32);
        // Row-major y = x·wᵀ is column-major yᵀ = w·xᵀ: A = w read transposed (lda = in),
        // B = x as is (ldb = in), C = y (ldc = out).
        // SAFETY: w holds out·in bf16, x n·in bf16, y n·out f32, all on the blas handle's stream.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                nn,
                k,
                (&alpha) as *const f32 as *const _,
                w as *const _,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                k,
                x as *const _,
                blas_sys::cudaDataType_t::CUDA_R_16BF,
                k,
                (&beta) as *const f32 as *const _,
                y as *mut _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                m,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::Driver {
            op: "DeviceModel::linear",
            detail: format!("cuBLAS GemmEx ({n}x{inp} · {out}x{inp}ᵀ): {e}"),
        })
    }

    /// Prefills `tokens` at the context's next positions, writing their K/V into it; returns the
    /// logits of the last token, or of every token with `all_logits` (`n · vocab`, row-major).
    // Long: one pass over the layers; its device buffers, RoPE tables and launch closures are shared by every layer.
    pub fn prefill(&self, kv: &mut DeviceKv, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        const OP: &str = "DeviceModel::prefill";
        let sp = &self.spec;
        let n = tokens.len();
        if n == 0 {
            return Err(Error::Unsupported {
                op: OP,
                detail: "empty input (expected at least one token)".into(),
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= sp.vocab) {
            return Err(Error::Unsupported {
                op: OP,
                detail: format!("token id {id} is outside the vocabulary of {}", sp.vocab),
            });
        }
        if kv.layout != sp.kv_layout() {
            return Err(Error::Unsupported {
                op: OP,
                detail: "the context was made for another model".into(),
            });
        }
        if i32::try_from(kv.len + n).is_err() {
            return Err(Error::Unsupported {
                op: OP,
                detail: format!("{} rows exceed the kernels' 32-bit row index", kv.len + n),
            });
        }
        self.reserve(kv, n)?;
        let b = &self.backend;
        let s = &b.stream;
        let (h, f, qd, kvd) = (sp.hidden, sp.ffn, sp.q_dim(), sp.kv_dim());
        let width = qd + 2 * kvd;
        let alloc32 = |len: usize| s.alloc_zeros::<f32>(len.max(1)).map_err(driver(OP));
        let alloc16 = |len: usize| s.alloc_zeros::<u16>(len.max(1)).map_err(driver(OP));
        let ids = s.clone_htod(tokens).map_err(driver(OP))?;
        let x = alloc32(n * h)?;
        let y = alloc32(n * h.max(2 * f).max(width))?;
        let hb = alloc16(n * h.max(f).max(qd))?;
        let (xp, yp, hp) = (addr(&x, b), addr(&y, b), addr(&hb, b));
        {
            let (table, idp, hid, scale) = (addr(&self.embed, b), addr(&ids, b), h as i32, sp.embed_scale);
            let mut l = s.launch_builder(&self.k.embed);
            l.arg(&table).arg(&idp).arg(&xp).arg(&hid).arg(&scale);
            // SAFETY: ids < vocab (checked), the table holds vocab·h words, x n·h floats.
            unsafe { l.launch(rows(n, 256)) }.map_err(driver(OP))?;
        }
        // cos/sin of the new positions, one table per distinct RoPE base.
        let positions: Vec<i64> = (0..n as i64).map(|i| kv.end() + i).collect();
        let mut tables: HashMap<u64, (CudaSlice<f32>, CudaSlice<f32>)> = HashMap::new();
        for l in 0..sp.layers {
            let key = sp.rope.base(l)?.to_bits();
            if let std::collections::hash_map::Entry::Vacant(e) = tables.entry(key) {
                let (c, sn) = sp.rope.cos_sin(l, &positions)?;
                e.insert((
                    s.clone_htod(&c).map_err(driver(OP))?,
                    s.clone_htod(&sn).map_err(driver(OP))?,
                ));
            }
        }
        let (row0, keys) = (kv.len, kv.len + n);
        let cap = kv.k.rows;
        let (DevBuf::U16(kc), DevBuf::U16(vc)) = (&kv.k.buf, &kv.v.buf) else {
            return Err(Error::Driver {
                op: OP,
                detail: "context buffers are not bf16".into(),
            });
        };
        let (kc0, vc0) = (addr(kc, b), addr(vc, b));
        let (eps, null) = (sp.rms_eps, 0u64);
        let norm_bf16 = |src: u64, w: &CudaSlice<f32>, dst: u64, count: usize, d: usize| -> Result<()> {
            let (wp, di) = (addr(w, b), d as i32);
            let mut l = s.launch_builder(&self.k.norm_bf16);
            l.arg(&src).arg(&wp).arg(&dst).arg(&di).arg(&eps);
            // SAFETY: src holds count·d floats, dst count·d words, w d floats.
            unsafe { l.launch(rows(count, 256)) }.map(drop).map_err(driver(OP))
        };
        let norm_f32 = |buf: u64, w: &CudaSlice<f32>, count: usize, d: usize| -> Result<()> {
            let (wp, di) = (addr(w, b), d as i32);
            let mut l = s.launch_builder(&self.k.norm_f32);
            l.arg(&buf).arg(&wp).arg(&buf).arg(&di).arg(&eps);
            // SAFETY: buf holds count·d floats (normalised in place), w d floats.
            unsafe { l.launch(rows(count, 256)) }.map(drop).map_err(driver(OP))
        };
        let add = |dst: u64, src: u64, len: usize| -> Result<()> {
            let ln = len as i64;
            let mut l = s.launch_builder(&self.k.add);
            l.arg(&dst).arg(&src).arg(&ln);
            // SAFETY: both hold len floats.
            unsafe { l.launch(flat(len)) }.map(drop).map_err(driver(OP))
        };
        for (li, w) in self.layers.iter().enumerate() {
            // Attention.
            norm_bf16(xp, &w.attn_norm, hp, n, h)?;
            self.linear(hp, addr(&w.wqkv, b), yp, (n, h, width), false)?;
            let (cosp, sinp) = {
                let t = &tables[&sp.rope.base(li)?.to_bits()];
                (addr(&t.0, b), addr(&t.1, b))
            };
            let layer_off = (li * cap * kvd * 2) as u64;
            let (kl, vl) = (kc0 + layer_off, vc0 + layer_off);
            {
                let bias = w.bias.as_ref().map_or(null, |x| addr(x, b));
                let (qn, kn) = w
                    .qk_norm
                    .as_ref()
                    .map_or((null, null), |(q, k)| (addr(q, b), addr(k, b)));
                let ints = [
                    row0 as i32,
                    sp.heads as i32,
                    sp.kv_heads as i32,
                    sp.head_dim as i32,
                    sp.rope.rotary_dims as i32,
                    (sp.rope.layout == kamera_ops::PairLayout::Interleaved) as i32,
                ];
                let mut l = s.launch_builder(&self.k.qkv_rope);
                l.arg(&yp)
                    .arg(&bias)
                    .arg(&qn)
                    .arg(&kn)
                    .arg(&cosp)
                    .arg(&sinp)
                    .arg(&kl)
                    .arg(&vl);
                for i in &ints {
                    l.arg(i);
                }
                l.arg(&eps);
                // SAFETY: y holds n·width floats, the tables n·rotary/2, the context cap ≥ row0 + n
                // rows of kvd words per layer; optional weights are null or of their length.
                unsafe { l.launch(rows(n, 128)) }.map_err(driver(OP))?;
            }
            {
                let window = sp.windows[li].map_or(0, |w| w.min(i32::MAX as usize) as i32);
                let (stride, nn, heads, kvh, hd) = (
                    width as i32,
                    n as i32,
                    sp.heads as i32,
                    sp.kv_heads as i32,
                    sp.head_dim as i32,
                );
                let (qp0, kp0, nkeys, scale) = (kv.end(), kv.offset, keys as i32, sp.attn_scale);
                let mut l = s.launch_builder(&self.k.attend);
                l.arg(&yp).arg(&stride).arg(&kl).arg(&vl).arg(&hp);
                l.arg(&nn)
                    .arg(&heads)
                    .arg(&kvh)
                    .arg(&hd)
                    .arg(&qp0)
                    .arg(&kp0)
                    .arg(&nkeys)
                    .arg(&scale)
                    .arg(&window);
                let cfg = LaunchConfig {
                    grid_dim: (n.div_ceil(4) as u32, sp.heads as u32, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: queries are rows of y (n·width floats), keys rows 0..keys of the context,
                // out (hb) n·q_dim words; head_dim is a multiple of 32 up to 256 (spec checked).
                unsafe { l.launch(cfg) }.map_err(driver(OP))?;
            }
            match &w.post_attn_norm {
                None => self.linear(hp, addr(&w.wo, b), xp, (n, qd, h), true)?,
                Some(pn) => {
                    self.linear(hp, addr(&w.wo, b), yp, (n, qd, h), false)?;
                    norm_f32(yp, pn, n, h)?;
                    add(xp, yp, n * h)?;
                }
            }
            // MLP.
            norm_bf16(xp, &w.ffn_norm, hp, n, h)?;
            self.linear(hp, addr(&w.w_gate_up, b), yp, (n, h, 2 * f), false)?;
            {
                let (nn, fi, gelu) = (n as i64, f as i32, sp.gelu as i32);
                let mut l = s.launch_builder(&self.k.gate_mul);
                l.arg(&yp).arg(&hp).arg(&nn).arg(&fi).arg(&gelu);
                // SAFETY: y holds n·2f floats, hb n·f words.
                unsafe { l.launch(flat(n * f)) }.map_err(driver(OP))?;
            }
            match &w.post_ffn_norm {
                None => self.linear(hp, addr(&w.w_down, b), xp, (n, f, h), true)?,
                Some(pn) => {
                    self.linear(hp, addr(&w.w_down, b), yp, (n, f, h), false)?;
                    norm_f32(yp, pn, n, h)?;
                    add(xp, yp, n * h)?;
                }
            }
        }
        kv.len += n;
        // Head over the last row (or all).
        let first = if all_logits { 0 } else { n - 1 };
        let count = n - first;
        norm_bf16(xp + (first * h * 4) as u64, &self.out_norm, hp, count, h)?;
        let logits = alloc32(count * sp.vocab)?;
        let lm = addr(self.lm_head.as_ref().unwrap_or(&self.embed), b);
        self.linear(hp, lm, addr(&logits, b), (count, h, sp.vocab), false)?;
        s.clone_dtoh(&logits).map_err(driver(OP))
    }

    /// Rows `from..len` of the context, read back as a bf16 chunk (for parity and the store).
    pub fn download(&self, kv: &DeviceKv, from: usize) -> Result<ChunkKv> {
        const OP: &str = "DeviceModel::download";
        let from = from.min(kv.len);
        let n = kv.len - from;
        let cols = self.spec.kv_dim();
        let read = |ch: &Channel| -> Result<Vec<u16>> {
            match &ch.buf {
                DevBuf::U16(sl) => self.backend.stream.clone_dtoh(sl).map_err(driver(OP)),
                DevBuf::F32(_) => Err(Error::Driver {
                    op: OP,
                    detail: "context buffers are not bf16".into(),
                }),
            }
        };
        let (kh, vh) = (read(&kv.k)?, read(&kv.v)?);
        let cap = kv.k.rows;
        let mat = |all: &[u16], l: usize| -> Result<Mat> {
            let at = l * cap * cols + from * cols;
            let v: Vec<bf16> = all[at..at + n * cols].iter().map(|&w| bf16::from_bits(w)).collect();
            Ok(Mat::new(n, cols, kamera_ops::Buf::Bf16(v))?)
        };
        let layers = (0..self.spec.layers)
            .map(|l| {
                Ok(LayerKv {
                    k: mat(&kh, l)?,
                    v: mat(&vh, l)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ChunkKv::new(kv.layout, kv.offset + from as i64, layers)?)
    }
}

#[cfg(test)]
mod tests {
    /// NVRTC alone (no GPU) compiles the model kernels for Hopper (fails where NVRTC is missing).
    #[test]
    fn model_kernels_compile_for_hopper_without_a_gpu() {
        crate::cuda::tests::require_nvrtc();
        let ptx = super::super::ptx_for_source(crate::MODEL_KERNEL_SOURCE, "model", "sm_90")
            .unwrap()
            .to_src();
        for name in [
            "embed_rows",
            "rms_norm_bf16",
            "rms_norm_f32",
            "qkv_rope",
            "attend",
            "gate_mul",
            "add_f32",
            "copy_rows",
        ] {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing from the PTX");
        }
    }
}
