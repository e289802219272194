//! Decode products with int8 activations, after llama.cpp: the input row is quantized once per
//! product to int8 (`x ≈ dx_b · q`, `dx_b = max|x_b| / 127`), and `Σ code · q` is an integer
//! dot product (AVX512-VNNI `vpdpbusd`, 64 codes per instruction) whose 16 lanes of 4 products
//! each are scaled by their group's `scale` and their block's `dx` before they are summed.
//! Since every lane is scaled on its own anyway, the blocks are 4 values (one lane), not
//! ggml's 32: the same instructions, and a rounding error set by 4 values' largest instead of
//! 32's (SmolLM2's decode KL to f32: 1.1e-3 with blocks of 32). Against the f32 path (`dot.rs`), which
//! converts every code to f32, this halves the instructions per weight; the price is the
//! rounding of `x` (its KL is printed by `kamera bench model`). The offsets' term
//! `offset · Σ x` is taken on the same rounded `x`.

use super::{Codes, QMatrix, U5_GROUP_BYTES};

/// Input values per quantization block: one `vpdpbusd` lane.
const BLOCK: usize = 4;
/// Input values per 64-byte step of the kernel.
const STEP: usize = 64;

/// An input row quantized for [`code_dot`]: zero-padded to whole 64-value steps.
#[derive(Debug)]
pub(crate) struct Q8Input {
    /// `round(x / dx)` per block, in −127..=127.
    q: Vec<i8>,
    /// Each block's `dx` (16 per 64-value step: the kernel's lanes).
    dxv: Vec<f32>,
    /// Per step, 16 lanes: 128 · the sum of the 4 values of `q` each `vpdpbusd` lane reads
    /// (signed codes are offset by 128 to be read as unsigned; this takes it off again).
    lane128: Vec<i32>,
    /// Values of the unpadded row.
    cols: usize,
}

impl Q8Input {
    /// `x` quantized; `None` unless its length is whole groups of 16 (every quantized matrix's).
    pub(crate) fn quantize(x: &[f32]) -> Option<Q8Input> {
        if x.is_empty() || x.len() % 16 != 0 {
            return None;
        }
        let padded = x.len().next_multiple_of(STEP);
        let mut q = vec![0i8; padded];
        let mut dxv = vec![0f32; padded / BLOCK];
        for ((xb, qb), dx) in x.chunks_exact(BLOCK).zip(q.chunks_exact_mut(BLOCK)).zip(&mut dxv) {
            *dx = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            let inv = if *dx > 0.0 { 1.0 / *dx } else { 0.0 };
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
            }
        }
        let lane128 = q
            .chunks_exact(4)
            .map(|l| 128 * l.iter().map(|&v| v as i32).sum::<i32>())
            .collect();
        Some(Q8Input {
            q,
            dxv,
            lane128,
            cols: x.len(),
        })
    }

    /// `Σ dx · q` over each `group` (16 or 32) of values: the offsets' input sums, taken from
    /// the quantized row so that an offset and its codes see the same input (Q4_0's
    /// `scale · (code − 8)`: an exact sum beside a rounded code term would not cancel).
    pub(crate) fn group_sums(&self, group: usize) -> Vec<f32> {
        self.q[..self.cols]
            .chunks_exact(group)
            .zip(self.dxv.chunks_exact(group / BLOCK))
            .map(|(g, dx)| {
                g.chunks_exact(BLOCK)
                    .zip(dx)
                    .map(|(b, dx)| dx * b.iter().map(|&v| v as i32).sum::<i32>() as f32)
                    .sum()
            })
            .collect()
    }

    /// The dequantized value `i` (for tests).
    #[cfg(test)]
    pub(crate) fn value(&self, i: usize) -> f32 {
        self.q[i] as f32 * self.dxv[i / BLOCK]
    }
}

/// Whether the kernel reads `m`'s codes: 4- and 5-bit codes in groups of 32, bytes in groups of
/// 16 or 32.
pub(crate) fn reads(m: &QMatrix) -> bool {
    match m.codes {
        Codes::U4(_) | Codes::U5(_) => m.group == 32,
        Codes::U8(_) | Codes::I8(_) => m.group == 32 || m.group == 16,
    }
}

/// Whether this CPU has AVX-512 F/BW and VNNI (`vpdpbusd`).
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// Whether this CPU runs an int8 kernel: AVX512-VNNI, or AVX2 + FMA.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_vnni() || super::avx2::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[i] = Σ_g scale_g · Σ_{i∈g} code_i · dx_i q_i` over rows `r0 + i` of `m` (≈ the rows'
/// `Σ_g scale_g Σ code_i x_i`). The caller checked [`available`] and that `x` has `m.cols`
/// values.
pub(crate) fn code_rows(m: &QMatrix, r0: usize, x: &Q8Input, out: &mut [f32]) {
    // The kernels read through pointers: a caller's shape error stops here, not in memory.
    assert!(
        x.cols == m.cols && r0 + out.len() <= m.rows,
        "rows {r0}..{} of a [{}, {}] matrix against an int8 input of {}",
        r0 + out.len(),
        m.rows,
        m.cols,
        x.cols
    );
    #[cfg(target_arch = "x86_64")]
    {
        if has_vnni() {
            for (i, o) in out.iter_mut().enumerate() {
                // SAFETY: the CPU has AVX-512 F/BW and VNNI; the row's codes and scales are in
                // bounds (row `r0 + i` of `m`) and `x` is padded to whole 64-value steps.
                *o = unsafe { avx512::code_dot(m, r0 + i, x) };
            }
            return;
        }
        // SAFETY: the caller checked `available()`, so without VNNI the CPU has AVX2 + FMA;
        // bounds as above.
        unsafe { super::avx2_int8::code_rows(m, r0, x, out) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (i, o) in out.iter_mut().enumerate() {
        *o = reference(m, r0 + i, x);
    }
}

/// The parts of a [`Q8Input`] a kernel reads: the rounded values, each block's `dx`.
#[cfg(target_arch = "x86_64")]
pub(super) fn parts(x: &Q8Input) -> (&[i8], &[f32]) {
    (&x.q, &x.dxv)
}

/// [`code_dot`] in plain integer loops: the reference the kernel is tested against.
#[cfg(any(test, not(target_arch = "x86_64")))]
pub(crate) fn reference(m: &QMatrix, r: usize, x: &Q8Input) -> f32 {
    let (g, gpr) = (m.group, m.cols / m.group);
    let mut total = 0f32;
    for j in 0..gpr {
        let gi = r * gpr + j;
        let mut dot = 0f32;
        for t in 0..g {
            let code = match &m.codes {
                Codes::U8(c) => c[gi * g + t] as i32,
                Codes::I8(c) => c[gi * g + t] as i32,
                Codes::U4(c) => {
                    let b = c[gi * 16 + t % 16];
                    (if t < 16 { b & 15 } else { b >> 4 }) as i32
                }
                Codes::U5(c) => super::u5_code(&c[gi * U5_GROUP_BYTES..(gi + 1) * U5_GROUP_BYTES], t) as i32,
            };
            let i = j * g + t;
            dot += (code * x.q[i] as i32) as f32 * x.dxv[i / BLOCK];
        }
        total += m.scales[gi] * dot;
    }
    total
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Codes, Q8Input, QMatrix, U5_GROUP_BYTES};

    /// The low nibbles of 2 x 16 bytes `[a, b]` then their high nibbles, as
    /// `[a & 15, a >> 4, b & 15, b >> 4]`: two groups' 4-bit codes in order.
    #[inline(always)]
    unsafe fn nibbles(ab: __m256i) -> __m512i {
        unsafe {
            let z = _mm512_shuffle_i64x2::<0x50>(_mm512_castsi256_si512(ab), _mm512_castsi256_si512(ab));
            let z = _mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
            _mm512_and_si512(z, _mm512_set1_epi8(15))
        }
    }

    /// `acc += float(dp) · scale_lane · dx_lane` for one 64-value step, whose `k` scales (2
    /// groups of 32 or 4 of 16, fewer at a row's end) start at `s`.
    #[inline(always)]
    unsafe fn add_step(dp: __m512i, s: *const f32, k: usize, idx: __m512i, dxv: *const f32, acc: __m512) -> __m512 {
        unsafe {
            let sv = _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(((1u32 << k) - 1) as u16, s));
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(sv, _mm512_loadu_ps(dxv)), acc)
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn code_dot(m: &QMatrix, r: usize, x: &Q8Input) -> f32 {
        unsafe {
            let (g, cols) = (m.group, m.cols);
            let gpr = cols / g;
            let steps = cols.div_ceil(64);
            let scales = m.scales.as_ptr().add(r * gpr);
            // Groups per step and the lanes' group: 32-wide groups fill 8 lanes, 16-wide 4.
            let per_step = 64 / g;
            let idx = if g == 32 {
                _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
            } else {
                _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
            };
            let (xq, dxv, lane128) = (x.q.as_ptr(), x.dxv.as_ptr(), x.lane128.as_ptr());
            let mut acc = [_mm512_setzero_ps(), _mm512_setzero_ps()];
            let zero = _mm512_setzero_si512();
            for p in 0..steps {
                let groups = per_step.min(gpr - p * per_step);
                let full = groups == per_step;
                let xs = _mm512_loadu_si512(xq.add(64 * p) as *const _);
                let dp = match &m.codes {
                    Codes::U8(c) | Codes::U4(c) | Codes::U5(c) => {
                        let base = c.as_ptr();
                        let w = match &m.codes {
                            Codes::U8(_) => {
                                let at = base.add(r * cols + 64 * p);
                                if full {
                                    _mm512_loadu_si512(at as *const _)
                                } else {
                                    _mm512_maskz_loadu_epi8((1u64 << (groups * g)) - 1, at as *const i8)
                                }
                            }
                            Codes::U4(_) => {
                                let at = base.add(r * cols / 2 + 32 * p);
                                nibbles(if full {
                                    _mm256_loadu_si256(at as *const __m256i)
                                } else {
                                    _mm256_zextsi128_si256(_mm_loadu_si128(at as *const __m128i))
                                })
                            }
                            _ => {
                                let at = base.add(r * gpr * U5_GROUP_BYTES + 2 * U5_GROUP_BYTES * p);
                                let a = _mm_loadu_si128(at as *const __m128i);
                                let ha = (at.add(16) as *const u32).read_unaligned() as u64;
                                let (b, hb) = if full {
                                    let bt = at.add(U5_GROUP_BYTES);
                                    (
                                        _mm_loadu_si128(bt as *const __m128i),
                                        (bt.add(16) as *const u32).read_unaligned() as u64,
                                    )
                                } else {
                                    (_mm_setzero_si128(), 0)
                                };
                                let z = nibbles(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b));
                                _mm512_mask_add_epi8(z, ha | hb << 32, z, _mm512_set1_epi8(16))
                            }
                        };
                        _mm512_dpbusd_epi32(zero, w, xs)
                    }
                    Codes::I8(c) => {
                        // Signed codes + 128 read as unsigned; 128 · Σ q taken off per lane.
                        let at = c.as_ptr().add(r * cols + 64 * p);
                        let w = if full {
                            _mm512_loadu_si512(at as *const _)
                        } else {
                            _mm512_maskz_loadu_epi8((1u64 << (groups * g)) - 1, at)
                        };
                        let w = _mm512_xor_si512(w, _mm512_set1_epi8(-128));
                        let dp = _mm512_dpbusd_epi32(zero, w, xs);
                        _mm512_sub_epi32(dp, _mm512_loadu_si512(lane128.add(16 * p) as *const _))
                    }
                };
                acc[p % 2] = add_step(dp, scales.add(p * per_step), groups, idx, dxv.add(16 * p), acc[p % 2]);
            }
            _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
        }
    }
}
