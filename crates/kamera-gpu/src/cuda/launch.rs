//! Picks the kernel family for a launch (kernels/reuse.cu) and launches it over every layer of a
//! channel: two-column FMA kernels for any shape, four-column ones where heads, the rotary span
//! and rows are multiples of 4, and their tensor-core variants for 16-bit patch factors: the
//! cp.async-pipelined one for 16-bit rows where every staged piece is 16-byte aligned, the
//! one-stage one elsewhere.

use super::{Channel, CudaBackend, DevBuf, Factors, Rotation, driver};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use kamera_ops::DType;

/// Shared memory a launch may use without an opt-in.
const SMEM_LIMIT: usize = 48 * 1024;
/// Rows per MMA tile, tiles per block and shared-tile padding of the tensor-core kernels
/// (`TC_ROWS`, `TC_TILES`, `TC_PAD`).
const TC_ROWS: usize = 16;
const TC_TILES: usize = 8;
const TC_PAD: usize = 8;
/// Columns a tensor-core block takes at most (whole heads; two threads per 4-column unit).
const TC_CHUNK: usize = 512;
/// The pipelined kernels (`reuse4tcp_*`): shared-memory slots of the row ring (`TCP_STAGES`),
/// the largest rank (16 · `TCP_KSTEPS`), the columns a block aims for (whole heads when
/// rotating; at most `TC_CHUNK`) and the block size.
const TCP_STAGES: usize = 4;
const TCP_MAX_RANK: usize = 64;
const TCP_CHUNK: usize = 256;
const TCP_THREADS: usize = 256;

/// A kernel family of kernels/reuse.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernel {
    /// `reuse_*`: two-column units, f32 factors, any shape.
    Pairs,
    /// `reuse4_*`: four-column units, f32 factors.
    Wide,
    /// Four-column units, 16-bit factors through the MMA, `chunk` columns per block:
    /// `reuse4tc_*` (one stage, rows in registers) or, `pipelined`, `reuse4tcp_*` (rows staged
    /// through a cp.async ring in shared memory). One variant for both, as `upload_factors`
    /// uploads 16-bit factors for every `WideTc`.
    WideTc {
        factors: DType,
        chunk: usize,
        pipelined: bool,
    },
}

impl Kernel {
    /// The family's short name in reports: Pairs, Wide, WideTc or WideTcp.
    pub(super) fn family(self) -> &'static str {
        match self {
            Kernel::Pairs => "Pairs",
            Kernel::Wide => "Wide",
            Kernel::WideTc { pipelined: false, .. } => "WideTc",
            Kernel::WideTc { pipelined: true, .. } => "WideTcp",
        }
    }
}

/// Shared memory of a tensor-core block: the f32 patch tile, Wᵀ and P as 16-bit words.
pub(super) fn tc_smem(chunk: usize, max_rank: usize) -> usize {
    let kp = max_rank.next_multiple_of(16);
    TC_ROWS * (chunk + TC_PAD) * 4 + kp * (chunk + TC_PAD) * 2 + TC_ROWS * (kp + TC_PAD) * 2
}

/// Shared memory of a pipelined tensor-core block (kernels/reuse.cu, `reuse4tcp_body`): the ring
/// of row tiles (16-bit), the f32 patch tile, Wᵀ and the ring of P tiles (16-bit, 8 words of
/// slack for a run that starts between 16-byte boundaries).
pub(super) fn tcp_smem(chunk: usize, max_rank: usize) -> usize {
    let (kp, stride) = (max_rank.next_multiple_of(16), chunk + TC_PAD);
    TCP_STAGES * TC_ROWS * stride * 2 + TC_ROWS * stride * 4 + kp * stride * 2 + TCP_STAGES * (TC_ROWS * kp + 8) * 2
}

/// Row tiles per pipelined block: 8 on long chunks (the block's Wᵀ staging spread over more
/// rows), 4 on shorter ones (more blocks, fewer idle SMs in the last wave).
fn tcp_tiles(rows: usize) -> usize {
    if rows >= 4096 { 8 } else { 4 }
}

/// Columns per tensor-core block: whole heads when rotating (a half-split unit spans half a
/// head), at most `aim` columns unless one head is wider, at most the row.
fn tc_chunk(cols: usize, rot: (&Rotation, bool), aim: usize) -> usize {
    let (r, rotate) = rot;
    if rotate {
        r.head_dim * (aim / r.head_dim).max(1)
    } else {
        aim
    }
    .min(cols)
}

/// The device address of a buffer is 16-byte aligned (cp.async pieces).
fn aligned16(buf: &DevBuf, stream: &cudarc::driver::CudaStream) -> bool {
    let ptr = match buf {
        DevBuf::F32(s) => s.device_ptr(stream).0,
        DevBuf::U16(s) => s.device_ptr(stream).0,
    };
    ptr % 16 == 0
}

/// Token rows per block of the FMA kernels (`ROWS`): the two-column ones take 8; the
/// four-column ones 8 for f32 sources and 16 for 16-bit ones.
fn fma_rows(kernel: Kernel, src: DType) -> usize {
    if kernel == Kernel::Wide && src != DType::F32 {
        16
    } else {
        8
    }
}

impl CudaBackend {
    /// The fastest kernel the source dtype, row width, rotation, factor dtype (`Some` when every
    /// ranked layer has 16-bit factors of that one type) and device allow.
    pub(super) fn plan(
        &self,
        src: DType,
        cols: usize,
        rot: (&Rotation, bool),
        factors: Option<DType>,
        max_rank: usize,
    ) -> Kernel {
        let (r, rotate) = rot;
        let wide = self.wide
            && cols % 4 == 0
            && (!rotate || (r.head_dim % 4 == 0 && r.rotary_dims % 4 == 0 && r.n_heads * r.head_dim <= cols));
        if !wide {
            return Kernel::Pairs;
        }
        // The MMA pays off for 16-bit rows; f32 rows stay on the FMA kernel (measured faster).
        let Some(factors) = factors.filter(|_| self.tensor_cores && max_rank > 0 && src != DType::F32) else {
            return Kernel::Wide;
        };
        // Pipelined where every staged piece (8 elements of a row, a chunk of whole heads) is
        // 16-byte aligned and the rank fits its unrolled k-steps; buffer addresses are checked
        // at launch.
        let chunk = tc_chunk(cols, rot, TCP_CHUNK);
        if cols % 8 == 0
            && chunk % 8 == 0
            && chunk <= TC_CHUNK
            && max_rank <= TCP_MAX_RANK
            && tcp_smem(chunk, max_rank) <= self.smem_optin
        {
            return Kernel::WideTc {
                factors,
                chunk,
                pipelined: true,
            };
        }
        self.plan_tc(factors, cols, rot, max_rank)
    }

    /// The one-stage tensor-core kernel where its shared memory fits, else the FMA kernel.
    pub(super) fn plan_tc(&self, factors: DType, cols: usize, rot: (&Rotation, bool), max_rank: usize) -> Kernel {
        let chunk = tc_chunk(cols, rot, TC_CHUNK);
        if chunk > TC_CHUNK || tc_smem(chunk, max_rank) > self.smem_optin {
            return Kernel::Wide;
        }
        Kernel::WideTc {
            factors,
            chunk,
            pipelined: false,
        }
    }

    /// One launch over every layer of a channel: `dst[l, dst_row + t] = R(src[l, t] + P Wᵀ)`
    /// (R only when `rot.1`).
    #[allow(clippy::too_many_arguments)]
    // Long: the kernel's arguments are pushed in its signature's order into one launch builder.
    pub(super) fn launch(
        &self,
        kernel: Kernel,
        src: &Channel,
        dst: &mut Channel,
        dst_row: usize,
        fac: &Factors,
        rot: (&Rotation, bool),
        bad: &mut CudaSlice<i32>,
    ) -> Result<()> {
        const OP: &str = "CudaBackend::launch";
        if src.rows == 0 || src.layers == 0 {
            return Ok(());
        }
        // The pipelined kernel copies 16-byte pieces from src, P and Wᵀ: on a buffer that is not
        // 16-byte aligned, the one-stage kernel (same factors) instead.
        let kernel = match kernel {
            Kernel::WideTc {
                factors,
                pipelined: true,
                ..
            } if ![&src.buf, &fac.p, &fac.wt].iter().all(|b| aligned16(b, &self.stream)) => {
                match self.plan_tc(factors, src.cols, rot, fac.max_rank) {
                    k @ Kernel::WideTc { .. } => k,
                    _ => {
                        return Err(Error::Unsupported {
                            op: OP,
                            detail: format!("rank {} factors on an unaligned buffer", fac.max_rank),
                        });
                    }
                }
            }
            k => k,
        };
        let tiles = tcp_tiles(src.rows);
        // (rows per block, threads, columns per block, shared memory)
        let (rows, threads, chunk, smem) = match kernel {
            Kernel::Pairs => {
                let rows = fma_rows(kernel, src.dtype);
                let threads = src.cols.div_ceil(2).next_multiple_of(32).min(256);
                (rows, threads, src.cols, rows * fac.max_rank.next_multiple_of(4) * 4)
            }
            // One 4-column unit per thread; blockIdx.z picks the group of units (`chunk` columns).
            Kernel::Wide => {
                let rows = fma_rows(kernel, src.dtype);
                let threads = (src.cols / 4).next_multiple_of(32).min(256);
                (rows, threads, 4 * threads, rows * fac.max_rank.next_multiple_of(4) * 4)
            }
            // Two threads per 4-column unit (rows 0-7 and 8-15 of each tile).
            Kernel::WideTc {
                chunk,
                pipelined: false,
                ..
            } => (
                TC_ROWS * TC_TILES,
                2 * (chunk / 4).next_multiple_of(32),
                chunk,
                tc_smem(chunk, fac.max_rank),
            ),
            Kernel::WideTc {
                chunk, pipelined: true, ..
            } => (TC_ROWS * tiles, TCP_THREADS, chunk, tcp_smem(chunk, fac.max_rank)),
        };
        let limit = if matches!(kernel, Kernel::WideTc { .. }) {
            self.smem_optin
        } else {
            SMEM_LIMIT
        };
        if smem > limit {
            return Err(Error::Driver {
                op: OP,
                detail: format!(
                    "patch rank {} needs {smem} B of shared memory (at most {limit})",
                    fac.max_rank
                ),
            });
        }
        let f = self.function(kernel, src.dtype, dst.dtype)?;
        if smem > SMEM_LIMIT {
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(driver(OP))?;
        }
        if let Kernel::WideTc { pipelined: true, .. } = kernel {
            // All of the unified L1 as shared memory, so that three blocks (their ring slots
            // full) fit on an SM rather than whatever split the driver would pick.
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )
            .map_err(driver(OP))?;
        }
        let cfg = LaunchConfig {
            grid_dim: (
                src.rows.div_ceil(rows) as u32,
                src.layers as u32,
                src.cols.div_ceil(chunk) as u32,
            ),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let int = |x: usize| x as i32;
        let (n, cols, d_row, d_rows) = (int(src.rows), int(src.cols), int(dst_row), int(dst.rows));
        let (rotation, rotate) = rot;
        let (rotate, heads, hd, rd, inter, chunk) = (
            rotate as i32,
            int(rotation.n_heads),
            int(rotation.head_dim),
            int(rotation.rotary_dims),
            rotation.interleaved as i32,
            int(chunk),
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
        for buf in [&fac.p, &fac.wt] {
            match buf {
                DevBuf::F32(s) => b.arg(s),
                DevBuf::U16(s) => b.arg(s),
            };
        }
        b.arg(&fac.jobs);
        b.arg(&rotation.cos).arg(&rotation.sin).arg(&rotate);
        b.arg(&heads).arg(&hd).arg(&rd).arg(&inter);
        let tiles = tiles as i32;
        if let Kernel::WideTc { pipelined, .. } = kernel {
            b.arg(&chunk);
            if pipelined {
                b.arg(&tiles);
            }
        }
        b.arg(bad);
        // SAFETY: argument types and order match the kernel signatures in kernels/reuse.cu (the
        // tensor-core ones take 16-bit factors and `chunk_cols`, which `upload_factors` and `plan`
        // provide for Kernel::WideTc, the pipelined ones then `tiles`, the row tiles per block
        // that the grid's x dimension was sized with); src holds layers·n·cols elements, dst
        // layers·dst_rows·cols with dst_row + n ≤ dst_rows (check_reuse), the factors what `jobs`
        // points at, the tables layers·rotary_dims/2; the tensor-core kernels are only planned on
        // sm_80 or newer, the pipelined ones only where `plan` and the alignment check above
        // found every staged piece 16-byte aligned and the rank at most TCP_MAX_RANK.
        unsafe { b.launch(cfg) }.map_err(driver(OP))?;
        Ok(())
    }
}
