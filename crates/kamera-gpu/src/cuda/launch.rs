//! Picks the kernel family for a launch (kernels/reuse.cu) and launches it over every layer of a
//! channel: two-column FMA kernels for any shape, four-column ones where heads, the rotary span
//! and rows are multiples of 4, and their tensor-core variant for 16-bit patch factors.

use super::{Channel, CudaBackend, DevBuf, Factors, Rotation, driver};
use crate::error::{Error, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
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

/// A kernel family of kernels/reuse.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernel {
    /// `reuse_*`: two-column units, f32 factors, any shape.
    Pairs,
    /// `reuse4_*`: four-column units, f32 factors.
    Wide,
    /// `reuse4tc_*`: four-column units, 16-bit factors through the MMA, `chunk` columns per block.
    WideTc { factors: DType, chunk: usize },
}

/// Shared memory of a tensor-core block: the f32 patch tile, Wᵀ and P as 16-bit words.
pub(super) fn tc_smem(chunk: usize, max_rank: usize) -> usize {
    let kp = max_rank.next_multiple_of(16);
    TC_ROWS * (chunk + TC_PAD) * 4 + kp * (chunk + TC_PAD) * 2 + TC_ROWS * (kp + TC_PAD) * 2
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
        // Whole heads per block when rotating (a half-split unit spans half a head).
        let chunk = if rotate {
            r.head_dim * (TC_CHUNK / r.head_dim).max(1)
        } else {
            TC_CHUNK
        }
        .min(cols);
        if chunk > TC_CHUNK || tc_smem(chunk, max_rank) > self.smem_optin {
            return Kernel::Wide;
        }
        Kernel::WideTc { factors, chunk }
    }

    /// One launch over every layer of a channel: `dst[l, dst_row + t] = R(src[l, t] + P Wᵀ)`
    /// (R only when `rot.1`).
    #[allow(clippy::too_many_arguments)]
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
            Kernel::WideTc { chunk, .. } => (
                TC_ROWS * TC_TILES,
                2 * (chunk / 4).next_multiple_of(32),
                chunk,
                tc_smem(chunk, fac.max_rank),
            ),
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
        if matches!(kernel, Kernel::WideTc { .. }) {
            b.arg(&chunk);
        }
        b.arg(bad);
        // SAFETY: argument types and order match the kernel signatures in kernels/reuse.cu (the
        // tensor-core ones take 16-bit factors and `chunk_cols`, which `upload_factors` and `plan`
        // provide for Kernel::WideTc); src holds layers·n·cols elements, dst layers·dst_rows·cols
        // with dst_row + n ≤ dst_rows (check_reuse), the factors what `jobs` points at, the tables
        // layers·rotary_dims/2; the tensor-core kernels are only planned on sm_80 or newer.
        unsafe { b.launch(cfg) }.map_err(driver(OP))?;
        Ok(())
    }
}
