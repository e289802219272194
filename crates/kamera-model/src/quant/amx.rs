//! The bf16 tiles' products on Intel AMX (`TDPBF16PS`, Sapphire Rapids and later), where the
//! CPU and the kernel allow it: a 16 x 16 f32 block of the output from 16 input rows and 16
//! weight rows, 32 bf16 values deep, per instruction (Intel SDM vol. 1 ch. 18). The operands
//! are the ones [`super::bf16::product`] takes unchanged: the input's bf16 pairs row-major, and
//! the weight tiles `[pair][48 rows]`, which are exactly AMX's pair-interleaved B layout (16
//! pair rows of 16 columns, at a stride of 48 columns). Whole blocks of 16 pairs run here (a
//! last block of rows padded to 16), a tail of pairs on the AVX512_BF16 kernel. Dense bf16
//! weights ([`dense`]) are AMX's A operand as they lie and the input is packed as B.

use std::arch::asm;
use std::sync::OnceLock;

/// Weight rows of a packed tile (three AMX B tiles of 16 columns).
const TILE: usize = 48;
/// Input rows and pairs of an AMX tile.
const ROWS: usize = 16;

/// Whether this process multiplies on AMX: the CPU has AMX-TILE and AMX-BF16, the kernel granted
/// the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), and `KAMERA_NO_AMX` is not set
/// (the AVX512_BF16 kernel then runs, e.g. to compare the two).
pub(crate) fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var_os("KAMERA_NO_AMX").is_none() && cpu_has_amx() && request_tile_state();
        tracing::debug!(amx = on, "bf16 products");
        on
    })
}

fn cpu_has_amx() -> bool {
    // cpuid is always available on x86-64; leaf 7 reports 0s where it does not exist.
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    // EDX bit 22: AMX-BF16, bit 24: AMX-TILE.
    leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0
}

/// Linux hands the tile data state out on request only (since 5.16).
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let rc: isize;
    // SAFETY: the arch_prctl system call (158) with a permission request reads no memory.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") 158isize => rc,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// The tile configuration (palette 1): tmm0-2 the output blocks, tmm3 the input, tmm4-6 the
/// weights, each 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = {
    let mut c = Config {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    let mut t = 0;
    while t < 7 {
        c.colsb[t] = 64;
        c.rows[t] = ROWS as u8;
        t += 1;
    }
    c
};

/// `c[i, j] = Σ_p a[i, p] · b[j, p]` for whole blocks: input rows `0..m16` (a multiple of 16) of
/// `a` (`lda` pairs a row), pairs `0..k16` (a multiple of 16), every packed tile of `b` (`pairs`
/// pair rows each) whose rows hold one of the first `width` columns; `c` at row stride `ldc`
/// gets columns `0..width` of those rows.
///
/// # Safety
/// [`available`] must hold; `a` must hold `m16` rows of `lda ≥ k16` pairs, `b` the tiles, `c`
/// be writable as [`super::bf16::product`] requires.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn blocks(
    a: &[u32],
    lda: usize,
    (m16, k16): (usize, usize),
    b: &[u32],
    pairs: usize,
    width: usize,
    c: *mut f32,
    ldc: usize,
) {
    debug_assert!(m16 % ROWS == 0 && k16 % ROWS == 0 && k16 <= pairs && k16 <= lda);
    debug_assert!(a.len() >= m16 * lda && b.len() >= width.div_ceil(TILE) * pairs * TILE);
    let mut out = super::Aligned::<f32>::zeroed(ROWS * TILE);
    // SAFETY: (caller) AMX is enabled for this process; the configuration is valid for palette
    // 1. Every load reads 16 rows of 64 bytes inside `a` (rows m0.., pairs k..k + 16) or inside
    // a tile of `b` (pair rows k..k + 16, 16 columns at 16j); stores go to `out`.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const Config, options(nostack, readonly));
        for (i, tile) in b.chunks_exact(pairs * TILE).take(width.div_ceil(TILE)).enumerate() {
            let (j0, w) = (i * TILE, TILE.min(width - i * TILE));
            for m0 in (0..m16).step_by(ROWS) {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    options(nostack, nomem)
                );
                for k in (0..k16).step_by(ROWS) {
                    let ap = a.as_ptr().add(m0 * lda + k);
                    let bp = tile.as_ptr().add(k * TILE);
                    asm!(
                        "tileloadd tmm3, [{a} + {lda}*1]",
                        "tileloadd tmm4, [{b0} + {ldb}*1]",
                        "tileloadd tmm5, [{b1} + {ldb}*1]",
                        "tileloadd tmm6, [{b2} + {ldb}*1]",
                        "tdpbf16ps tmm0, tmm3, tmm4",
                        "tdpbf16ps tmm1, tmm3, tmm5",
                        "tdpbf16ps tmm2, tmm3, tmm6",
                        a = in(reg) ap,
                        lda = in(reg) lda * 4,
                        b0 = in(reg) bp,
                        b1 = in(reg) bp.add(16),
                        b2 = in(reg) bp.add(32),
                        ldb = in(reg) TILE * 4,
                        options(nostack, readonly),
                    );
                }
                asm!(
                    "tilestored [{o0} + {ld}*1], tmm0",
                    "tilestored [{o1} + {ld}*1], tmm1",
                    "tilestored [{o2} + {ld}*1], tmm2",
                    o0 = in(reg) out.as_mut_ptr(),
                    o1 = in(reg) out.as_mut_ptr().add(16),
                    o2 = in(reg) out.as_mut_ptr().add(32),
                    ld = in(reg) TILE * 4,
                    options(nostack),
                );
                for (r, row) in out.chunks_exact(TILE).enumerate() {
                    std::ptr::copy_nonoverlapping(row.as_ptr(), c.add((m0 + r) * ldc + j0), w);
                }
            }
        }
        release();
    }
}

/// Marks the tiles unused (TILERELEASE), as Intel asks once a thread is done with them: the
/// thread then saves and restores no tile state on a switch, and the core leaves AMX's power
/// state.
///
/// # Safety
/// AMX must be available.
#[inline(always)]
unsafe fn release() {
    unsafe { asm!("tilerelease", options(nostack, nomem)) }
}

/// Inputs per pass over a weight (their packed pairs stay in L2: 256 inputs of 1280 columns
/// take 640 KiB).
const IN_CHUNK: usize = 256;

/// The configuration of [`dense`]: tmm0-3 the output blocks, tmm4-5 weight rows, tmm6-7 inputs.
const DENSE_CONFIG: Config = {
    let mut c = CONFIG;
    c.colsb[7] = 64;
    c.rows[7] = ROWS as u8;
    c
};

/// `y = x Wᵀ` for a dense bf16 weight `w` (`rows` rows of bf16 pairs, `stride` pairs apart, a
/// multiple of 16, zeros past `cols / 2`, zero rows up to a multiple of 32) and `x: [n, cols]`
/// (rounded to bf16 here). The weight's rows are AMX's A operand as they lie, 32 at a time; the
/// input is packed as B (16 inputs a tile, pair-interleaved). Blocks of 32 weight rows are the
/// parallel tasks, within passes of [`IN_CHUNK`] inputs. `then` adds a bias and/or adds to `y`
/// as the blocks are written. Callers check [`available`].
pub(crate) fn dense(
    w: &[u32],
    (rows, cols, stride): (usize, usize, usize),
    x: &[f32],
    n: usize,
    y: &mut [f32],
    then: super::Epilogue<'_>,
) {
    use rayon::prelude::*;
    assert!(available() && stride % ROWS == 0 && cols / 2 <= stride);
    assert!(w.len() >= rows.next_multiple_of(2 * ROWS) * stride && x.len() == n * cols && y.len() == n * rows);
    assert!(then.bias.is_none_or(|b| b.len() == rows), "bias length");
    let out = super::Out(y.as_mut_ptr());
    let blocks = rows.div_ceil(2 * ROWS);
    for c0 in (0..n).step_by(IN_CHUNK) {
        let cn = IN_CHUNK.min(n - c0);
        let xb = pack_inputs(&x[c0 * cols..(c0 + cn) * cols], cn, cols, stride);
        (0..blocks).into_par_iter().for_each(|jb| {
            // SAFETY: AMX is available (asserted); the task reads its 32 weight rows (padded
            // storage, asserted) and the packed inputs, and writes only columns jb·32.. of
            // rows c0.. of y, which no other task writes.
            unsafe { dense_block(w, stride, jb * 2 * ROWS, &xb, cn, (rows, c0), out, then) }
        });
    }
}

/// Inputs `x: [n, cols]` as AMX B tiles: for each block of 16 inputs, `stride` pair rows of 16
/// (input `i`'s pair `k` at `[k][i]`), zeros past `n` (up to a multiple of 32) and `cols / 2`.
fn pack_inputs(x: &[f32], n: usize, cols: usize, stride: usize) -> super::Aligned<u32> {
    use rayon::prelude::*;
    let mut xb = super::Aligned::zeroed(n.next_multiple_of(2 * ROWS) * stride);
    xb.par_chunks_mut(ROWS * stride).enumerate().for_each(|(ib, tile)| {
        let mut row = vec![0u32; cols / 2];
        for i in 0..ROWS.min(n.saturating_sub(ib * ROWS)) {
            let r = ib * ROWS + i;
            super::bf16::round_pairs(&x[r * cols..(r + 1) * cols], &mut row);
            for (k, &p) in row.iter().enumerate() {
                tile[k * ROWS + i] = p;
            }
        }
    });
    xb
}

/// Pairs per pass of a weight block over the inputs: its 32 rows' slice (16 KiB) stays in L1,
/// every input's slice (256 inputs: 128 KiB) in L2.
const KC: usize = 128;

/// Weight rows `j0..j0 + 32` against every packed input (`n` live), into `y`'s rows `c0..`:
/// the pairs in passes of [`KC`], the output blocks kept in `acc` between passes.
///
/// # Safety
/// As in [`dense`].
#[allow(clippy::too_many_arguments)]
unsafe fn dense_block(
    w: &[u32],
    stride: usize,
    j0: usize,
    xb: &[u32],
    n: usize,
    (rows, c0): (usize, usize),
    y: super::Out,
    then: super::Epilogue<'_>,
) {
    // Four 16 x 16 output blocks per pair of input blocks: (weight half a, input half b).
    let pairs_of_inputs = n.div_ceil(2 * ROWS);
    let mut acc = super::Aligned::<f32>::zeroed(pairs_of_inputs * 4 * ROWS * ROWS);
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &DENSE_CONFIG as *const Config, options(nostack, readonly));
        let a0 = w.as_ptr().add(j0 * stride);
        let a1 = a0.add(ROWS * stride);
        for k0 in (0..stride).step_by(KC) {
            let k1 = (k0 + KC).min(stride);
            // The next pass's slice of the 32 weight rows on its way while this one runs: 32
            // streams are more than the hardware prefetcher follows.
            for r in 0..2 * ROWS {
                let row = a0.add(r * stride) as *const i8;
                for l in (k1..(k1 + KC).min(stride)).step_by(16) {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(row.add(4 * l));
                }
            }
            for (ip, t) in acc.chunks_exact_mut(4 * ROWS * ROWS).enumerate() {
                let t = t.as_mut_ptr();
                let b0 = xb.as_ptr().add(2 * ip * ROWS * stride);
                let b1 = b0.add(ROWS * stride);
                if k0 == 0 {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        options(nostack, nomem)
                    );
                } else {
                    asm!(
                        "tileloadd tmm0, [{t0} + {ld}*1]",
                        "tileloadd tmm1, [{t1} + {ld}*1]",
                        "tileloadd tmm2, [{t2} + {ld}*1]",
                        "tileloadd tmm3, [{t3} + {ld}*1]",
                        t0 = in(reg) t,
                        t1 = in(reg) t.add(ROWS * ROWS),
                        t2 = in(reg) t.add(2 * ROWS * ROWS),
                        t3 = in(reg) t.add(3 * ROWS * ROWS),
                        ld = in(reg) ROWS * 4,
                        options(nostack, readonly),
                    );
                }
                for k in (k0..k1).step_by(ROWS) {
                    asm!(
                        "tileloadd tmm4, [{a0} + {lda}*1]",
                        "tileloadd tmm6, [{b0} + {ldb}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tileloadd tmm7, [{b1} + {ldb}*1]",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tileloadd tmm5, [{a1} + {lda}*1]",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a0 = in(reg) a0.add(k),
                        a1 = in(reg) a1.add(k),
                        b0 = in(reg) b0.add(k * ROWS),
                        b1 = in(reg) b1.add(k * ROWS),
                        lda = in(reg) stride * 4,
                        ldb = in(reg) ROWS * 4,
                        options(nostack, readonly),
                    );
                }
                asm!(
                    "tilestored [{t0} + {ld}*1], tmm0",
                    "tilestored [{t1} + {ld}*1], tmm1",
                    "tilestored [{t2} + {ld}*1], tmm2",
                    "tilestored [{t3} + {ld}*1], tmm3",
                    t0 = in(reg) t,
                    t1 = in(reg) t.add(ROWS * ROWS),
                    t2 = in(reg) t.add(2 * ROWS * ROWS),
                    t3 = in(reg) t.add(3 * ROWS * ROWS),
                    ld = in(reg) ROWS * 4,
                    options(nostack),
                );
            }
        }
        release();
        // Block (a, b) of input pair ip holds weight rows j0 + 16a.. against inputs
        // (2·ip + b)·16..: row r, column c is y[that input + c][that weight row + r]. Each
        // block is transposed in registers, so every input's 16 outputs are one vector.
        for (ip, t) in acc.chunks_exact(4 * ROWS * ROWS).enumerate() {
            for (blk, vals) in t.chunks_exact(ROWS * ROWS).enumerate() {
                let (a, b) = (blk / 2, blk % 2);
                let (first, j) = ((2 * ip + b) * ROWS, j0 + a * ROWS);
                if first < n && j < rows {
                    write_block(
                        vals,
                        (n - first).min(ROWS),
                        y.at(c0 * rows + first * rows + j),
                        rows,
                        (rows - j).min(ROWS),
                        then.bias.map(|b| &b[j..]),
                        then.add,
                    );
                }
            }
        }
    }
}

/// A 16 x 16 output block `vals` (row r: weight row r, column c: input c) into `y` at row stride
/// `ldy` (`y` at the block's first input and weight row): `inputs` rows of `width` values, plus
/// the bias (from the block's first weight row), added to what `y` holds with `add`.
///
/// # Safety
/// AVX-512F; `y` writable at those rows and values, `bias` (when given) `width` long at least.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn write_block(
    vals: &[f32],
    inputs: usize,
    y: *mut f32,
    ldy: usize,
    width: usize,
    bias: Option<&[f32]>,
    add: bool,
) {
    use std::arch::x86_64::*;
    unsafe {
        let mut v = [_mm512_setzero_si512(); 16];
        for (r, vr) in v.iter_mut().enumerate() {
            *vr = _mm512_loadu_si512(vals.as_ptr().add(r * ROWS) as *const _);
        }
        super::bf16::avx512::transpose16(&mut v);
        let mask = ((1u32 << width) - 1) as __mmask16;
        let b = bias.map_or(_mm512_setzero_ps(), |b| _mm512_maskz_loadu_ps(mask, b.as_ptr()));
        for (c, &vc) in v[..inputs].iter().enumerate() {
            let dst = y.add(c * ldy);
            let mut o = _mm512_add_ps(_mm512_castsi512_ps(vc), b);
            if add {
                o = _mm512_add_ps(o, _mm512_maskz_loadu_ps(mask, dst));
            }
            _mm512_mask_storeu_ps(dst, mask, o);
        }
    }
}
