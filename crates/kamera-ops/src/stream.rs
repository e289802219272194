//! The fused reuse pass in one sweep (KAMERA.md, "The operator": R(δ)·(KV + P Wᵀ)): each tile of
//! 4 rows × up to 64 columns is loaded once, patched and rotated in registers and stored once (no
//! second and third pass over a cached block; measured 0-9% faster, the product still not
//! overlapping the stream of bytes: bench/eval/README.md, "Reuse bench").

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use crate::lowrank::Factors;
use crate::rope::{PairLayout, Rotation};

/// Where the sweep stores row `t`, column `c`: `off(c) + t · stride` in `dst` (contiguous rows:
/// `off(c) = c`; head-first buffers: head `c / w`'s rows from `row0`, `stride = w`).
pub(crate) struct Dst<'a> {
    pub(crate) data: &'a mut [MaybeUninit<f32>],
    pub(crate) stride: usize,
    /// Per head group of `width` columns, where its row 0 starts in `data`.
    pub(crate) group_base: Vec<usize>,
    pub(crate) width: usize,
}

impl Dst<'_> {
    fn off(&self, c: usize) -> usize {
        self.group_base[c / self.width] + c % self.width
    }
}

/// A source the sweep reads 16 values at a time as f32.
pub(crate) trait Lanes: Copy {
    #[cfg(target_arch = "x86_64")]
    /// # Safety
    /// `p..p + 16` readable; AVX-512F available.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Lanes for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: as documented.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl Lanes for half::bf16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const half::bf16) -> __m512 {
        // SAFETY: as documented; bf16 is f32's upper half.
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
}

/// Runs the sweep where this CPU and these shapes allow it (AVX-512, columns in 16s, a rotation
/// of half-split pairs covering whole heads); `None` where the blockwise pass must run instead.
/// `Some(Err(index))` names the first non-finite value in source (row-major) coordinates.
pub(crate) fn sweep<S: Lanes>(
    src: &[S],
    cols: usize,
    patch: Option<&Factors<'_>>,
    rot: Option<(&Rotation, usize)>,
    dst: &mut Dst<'_>,
) -> Option<Result<(), usize>> {
    #[cfg(target_arch = "x86_64")]
    {
        if cols == 0 || cols % 16 != 0 || dst.width % 16 != 0 || !std::arch::is_x86_feature_detected!("avx512f") {
            return None;
        }
        let tiles = tiles(cols, rot)?;
        let n = src.len() / cols;
        let (cos, sin) = rot.map_or((&[][..], &[][..]), |(r, _)| (&r.cos[..], &r.sin[..]));
        // SAFETY: AVX-512F detected; AVX512_BF16 for bf16 factors, which exist only where the CPU
        // has it (`Factors::new`); shapes: the factors are n × k and k × cols as built, tiles
        // stay inside `cols`, and `dst` holds every (row, column) `off` names (checked by callers).
        return Some(unsafe {
            match patch {
                Some(f @ Factors::Bf16 { .. }) => avx512::sweep_bf16(src, n, cols, f, &tiles, cos, sin, dst),
                f => avx512::sweep_f32(src, n, cols, f, &tiles, cos, sin, dst),
            }
        });
    }
    #[allow(unreachable_code)]
    {
        let _ = (src, cols, patch, rot, dst);
        None
    }
}

/// Up to four vectors of 16 columns handled together: `cols[v]` their first columns; with a
/// rotation, vectors `v` and `v + V/2` hold pairs (lo, hi) whose angles start at `pair`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tile {
    pub(crate) cols: [usize; 4],
    pub(crate) width: usize,
    pub(crate) pair: Option<usize>,
}

/// The column tiles of one row: whole heads' half-split pairs when rotating, else runs of 64.
fn tiles(cols: usize, rot: Option<(&Rotation, usize)>) -> Option<Vec<Tile>> {
    let mut out = Vec::new();
    let Some((r, heads)) = rot else {
        let mut c = 0;
        while c < cols {
            let width = if c + 64 <= cols { 4 } else { 1 };
            out.push(Tile {
                cols: [c, c + 16, c + 32, c + 48],
                width,
                pair: None,
            });
            c += 16 * width;
        }
        return Some(out);
    };
    let (half, hd) = (r.cos.len(), r.head_dim);
    if r.layout != PairLayout::HalfSplit || half % 16 != 0 || 2 * half != hd || heads * hd != cols {
        return None;
    }
    for h in 0..heads {
        let base = h * hd;
        let mut i = 0;
        while i < half {
            let tile = if i + 32 <= half {
                Tile {
                    cols: [base + i, base + i + 16, base + half + i, base + half + i + 16],
                    width: 4,
                    pair: Some(i),
                }
            } else {
                Tile {
                    cols: [base + i, base + half + i, 0, 0],
                    width: 2,
                    pair: Some(i),
                }
            };
            i += 8 * tile.width;
            out.push(tile);
        }
    }
    Some(out)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Dst, Lanes, Tile};
    use crate::lowrank::Factors;

    /// The factors as the kernel reads them: P rows of `k` 32-bit lanes, Wᵀ `k` rows of `cols`.
    struct Raw {
        p: *const u32,
        wt: *const u32,
        k: usize,
    }

    fn raw(f: Option<&Factors<'_>>) -> Raw {
        match f {
            Some(Factors::F32 { p, wt, m, .. }) => Raw {
                p: p.as_ptr() as *const u32,
                wt: wt.as_ptr() as *const u32,
                k: *m,
            },
            Some(Factors::Bf16 { p, wt, pairs, .. }) => Raw {
                p: p.as_ptr(),
                wt: wt.as_ptr(),
                k: *pairs,
            },
            None => Raw {
                p: std::ptr::null(),
                wt: std::ptr::null(),
                k: 0,
            },
        }
    }

    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn sweep_f32<S: Lanes>(
        src: &[S],
        n: usize,
        cols: usize,
        f: Option<&Factors<'_>>,
        tiles: &[Tile],
        cos: &[f32],
        sin: &[f32],
        dst: &mut Dst<'_>,
    ) -> Result<(), usize> {
        let fma = |acc, s, w| _mm512_fmadd_ps(s, w, acc);
        // SAFETY: as for `super::sweep`.
        unsafe { rows(src, n, cols, raw(f), tiles, cos, sin, dst, fma) }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn sweep_bf16<S: Lanes>(
        src: &[S],
        n: usize,
        cols: usize,
        f: &Factors<'_>,
        tiles: &[Tile],
        cos: &[f32],
        sin: &[f32],
        dst: &mut Dst<'_>,
    ) -> Result<(), usize> {
        // SAFETY (transmutes): 32-bit lanes holding bf16 pairs.
        let dot = |acc, s, w| unsafe {
            _mm512_dpbf16_ps(
                acc,
                std::mem::transmute::<__m512, __m512bh>(s),
                std::mem::transmute::<__m512, __m512bh>(w),
            )
        };
        // SAFETY: as for `super::sweep`.
        unsafe { rows(src, n, cols, raw(Some(f)), tiles, cos, sin, dst, dot) }
    }

    /// Rows in tiles of 4 (then 1), each across every column tile; on the first tile of rows
    /// with a non-finite value, the first such value's source index.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows<S: Lanes>(
        src: &[S],
        n: usize,
        cols: usize,
        f: Raw,
        tiles: &[Tile],
        cos: &[f32],
        sin: &[f32],
        dst: &mut Dst<'_>,
        mac: impl Fn(__m512, __m512, __m512) -> __m512 + Copy,
    ) -> Result<(), usize> {
        let offs: Vec<[usize; 4]> = tiles
            .iter()
            .map(|t| t.cols.map(|c| if c < cols { dst.off(c) } else { 0 }))
            .collect();
        let (s, d, stride) = (src.as_ptr(), dst.data.as_mut_ptr() as *mut f32, dst.stride);
        let mut t0 = 0;
        while t0 < n {
            let r = if t0 + 4 <= n { 4 } else { 1 };
            let mut bad = 0;
            for (t, off) in tiles.iter().zip(&offs) {
                let at = At {
                    src: s,
                    cols,
                    dst: d,
                    stride,
                    t0,
                };
                // SAFETY: rows t0..t0 + r exist; the tile's columns and offsets are in range.
                bad |= unsafe {
                    match (r, t.width, t.pair) {
                        (4, 4, Some(i)) => tile::<4, 4, 2, S>(&at, t, off, &f, Some((cos, sin, i)), mac),
                        (4, 2, Some(i)) => tile::<4, 2, 1, S>(&at, t, off, &f, Some((cos, sin, i)), mac),
                        (4, 4, None) => tile::<4, 4, 2, S>(&at, t, off, &f, None, mac),
                        (4, _, None) => tile::<4, 1, 1, S>(&at, t, off, &f, None, mac),
                        (_, 4, Some(i)) => tile::<1, 4, 2, S>(&at, t, off, &f, Some((cos, sin, i)), mac),
                        (_, 2, Some(i)) => tile::<1, 2, 1, S>(&at, t, off, &f, Some((cos, sin, i)), mac),
                        (_, 4, None) => tile::<1, 4, 2, S>(&at, t, off, &f, None, mac),
                        (_, _, _) => tile::<1, 1, 1, S>(&at, t, off, &f, None, mac),
                    }
                };
            }
            if bad != 0 {
                return Err(first_bad(dst, cols, t0, r));
            }
            t0 += r;
        }
        Ok(())
    }

    /// The first non-finite stored value of rows `t0..t0 + r`, in source (row-major) index.
    fn first_bad(dst: &Dst<'_>, cols: usize, t0: usize, r: usize) -> usize {
        (t0 * cols..(t0 + r) * cols)
            .find(|&i| {
                // SAFETY: every value of these rows was stored by the sweep.
                let v = unsafe { dst.data[dst.off(i % cols) + (i / cols) * dst.stride].assume_init() };
                !v.is_finite()
            })
            .unwrap_or(t0 * cols)
    }

    /// The sweep's pointers and its first row.
    struct At<S> {
        src: *const S,
        cols: usize,
        dst: *mut f32,
        stride: usize,
        t0: usize,
    }

    /// `R` rows × `V` vectors: loaded, `+= P Wᵀ` (k steps of `mac`), rotated (pairs `v`,
    /// `v + H` with `H = V/2`, angles from `pair`), stored; the lanes left non-finite. Same
    /// operations in the same order as the blockwise pass, so the results are bit-identical.
    #[inline(always)]
    unsafe fn tile<const R: usize, const V: usize, const H: usize, S: Lanes>(
        at: &At<S>,
        t: &Tile,
        off: &[usize; 4],
        f: &Raw,
        rot: Option<(&[f32], &[f32], usize)>,
        mac: impl Fn(__m512, __m512, __m512) -> __m512,
    ) -> u16 {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            for (i, a) in acc.iter_mut().enumerate() {
                for (v, x) in a.iter_mut().enumerate() {
                    *x = S::load16(at.src.add((at.t0 + i) * at.cols + t.cols[v]));
                }
            }
            let cols = std::array::from_fn(|v| t.cols[v]);
            crate::lowrank::avx512::accumulate(&mut acc, f.p, at.t0, f.k, f.wt, at.cols, cols, mac);
            if let Some((cos, sin, i0)) = rot {
                for h in 0..H {
                    let c = _mm512_loadu_ps(cos.as_ptr().add(i0 + 16 * h));
                    let s = _mm512_loadu_ps(sin.as_ptr().add(i0 + 16 * h));
                    for a in acc.iter_mut() {
                        let (x, y) = (a[h], a[h + H]);
                        a[h] = _mm512_fmsub_ps(x, c, _mm512_mul_ps(y, s));
                        a[h + H] = _mm512_fmadd_ps(x, s, _mm512_mul_ps(y, c));
                    }
                }
            }
            let mut bad: __mmask16 = 0;
            for (i, a) in acc.iter().enumerate() {
                for (v, &x) in a.iter().enumerate() {
                    _mm512_storeu_ps(at.dst.add(off[v] + (at.t0 + i) * at.stride), x);
                    bad |= crate::lanes::non_finite(x);
                }
            }
            bad
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use super::{Dst, sweep};
    use crate::lowrank::Factors;
    use crate::rope::{PairLayout, RopeSpec, Rotation};
    use crate::tensor::{DType, Mat};

    fn wave(n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + s).sin()).collect()
    }

    /// The blockwise pass's arithmetic, one value at a time: `x + Σ_j p_j w_j` by FMAs in `j`
    /// order, then each half-split pair (a, b) -> (a·c − b·s, a·s + b·c) with the same FMAs.
    fn reference(
        src: &[f32],
        cols: usize,
        pw: Option<(&[f32], &[f32], usize)>,
        rot: Option<(&Rotation, usize)>,
    ) -> Vec<f32> {
        let mut out = src.to_vec();
        for (t, row) in out.chunks_exact_mut(cols).enumerate() {
            if let Some((p, wt, m)) = pw {
                for (c, x) in row.iter_mut().enumerate() {
                    for j in 0..m {
                        *x = p[t * m + j].mul_add(wt[j * cols + c], *x);
                    }
                }
            }
            if let Some((r, heads)) = rot {
                let half = r.cos.len();
                for h in 0..heads {
                    for i in 0..half {
                        let (lo, hi) = (h * r.head_dim + i, h * r.head_dim + half + i);
                        let (a, b, c, s) = (row[lo], row[hi], r.cos[i], r.sin[i]);
                        row[lo] = a.mul_add(c, -(b * s));
                        row[hi] = a.mul_add(s, b * c);
                    }
                }
            }
        }
        out
    }

    fn run(
        src: &[f32],
        cols: usize,
        f: Option<&Factors<'_>>,
        rot: Option<(&Rotation, usize)>,
    ) -> Option<Result<Vec<f32>, usize>> {
        let mut d = vec![MaybeUninit::new(f32::NAN); src.len()];
        let mut dst = Dst {
            data: &mut d,
            stride: cols,
            group_base: vec![0],
            width: cols,
        };
        let r = sweep(src, cols, f, rot, &mut dst)?;
        // SAFETY: initialised above.
        Some(r.map(|()| d.iter().map(|x| unsafe { x.assume_init() }).collect()))
    }

    /// `heads` half-split heads of `hd`, `n` rows, rank-`m` factors, a shift of `delta`.
    struct Case {
        cols: usize,
        r: Rotation,
        src: Vec<f32>,
        p: Vec<f32>,
        wt: Vec<f32>,
        pm: Mat,
        wm: Mat,
    }

    fn case(hd: usize, heads: usize, n: usize, m: usize, delta: i64) -> Case {
        let cols = hd * heads;
        let spec = RopeSpec::new(hd, 10000.0, PairLayout::HalfSplit);
        let (p, wt) = (wave(n * m, 0.2), wave(m * cols, 0.3));
        Case {
            cols,
            r: Rotation::new(&spec, 0, delta).unwrap(),
            src: wave(n * cols, 0.1),
            pm: Mat::from_f32(n, m, p.clone()).unwrap(),
            wm: Mat::from_f32(m, cols, wt.clone()).unwrap(),
            p,
            wt,
        }
    }

    fn avx512() -> bool {
        #[cfg(target_arch = "x86_64")]
        return std::arch::is_x86_feature_detected!("avx512f");
        #[allow(unreachable_code)]
        false
    }

    /// Bit-identical to the blockwise arithmetic for heads of 64 and 256 (3 and 1 heads), rows
    /// past a multiple of 4, with and without patch and rotation; taken wherever AVX-512 exists.
    #[test]
    fn sweep_is_the_blockwise_arithmetic() {
        for (hd, heads, n, m) in [(64, 3, 37, 32), (256, 1, 9, 5), (32, 2, 6, 3), (64, 2, 1, 1)] {
            let c = case(hd, heads, n, m, 917);
            let (cols, r, src, p, wt) = (c.cols, &c.r, &c.src, &c.p, &c.wt);
            let f = Factors::new(&c.pm, &c.wm);
            for (patched, rotated) in [(true, true), (true, false), (false, true), (false, false)] {
                let rot = rotated.then_some((r, heads));
                let fac = patched.then_some(&f);
                let want = reference(src, cols, patched.then_some((&p[..], &wt[..], m)), rot);
                match run(src, cols, fac, rot) {
                    Some(got) => assert_eq!(
                        got.unwrap(),
                        want,
                        "head {hd} x {heads}, {n} rows, rank {m}, {patched} {rotated}"
                    ),
                    None => assert!(!avx512(), "the sweep must run on AVX-512 for head {hd}"),
                }
            }
        }
    }

    /// bf16 sources widen exactly; bf16 factors (VDPBF16PS where the CPU has it) within f32
    /// rounding of the f32 product of the same bf16 values.
    #[test]
    fn bf16_sources_and_factors() {
        let (hd, heads, n, m) = (64, 3, 13, 32);
        let cols = hd * heads;
        let spec = RopeSpec::new(hd, 10000.0, PairLayout::HalfSplit);
        let r = Rotation::new(&spec, 0, -41).unwrap();
        let src = Mat::from_f32(n, cols, wave(n * cols, 0.1))
            .unwrap()
            .to_dtype(DType::Bf16);
        let pm = Mat::from_f32(n, m, wave(n * m, 0.2)).unwrap().to_dtype(DType::Bf16);
        let wm = Mat::from_f32(m, cols, wave(m * cols, 0.3))
            .unwrap()
            .to_dtype(DType::Bf16);
        let (s32, p32, w32) = (src.to_f32_vec(), pm.to_f32_vec(), wm.to_f32_vec());
        let want = reference(&s32, cols, Some((&p32, &w32, m)), Some((&r, heads)));
        let f = Factors::new(&pm, &wm);
        let crate::tensor::Buf::Bf16(s16) = src.data() else {
            unreachable!()
        };
        let mut d = vec![MaybeUninit::new(0.0f32); n * cols];
        let mut dst = Dst {
            data: &mut d,
            stride: cols,
            group_base: vec![0],
            width: cols,
        };
        let Some(res) = sweep(s16, cols, Some(&f), Some((&r, heads)), &mut dst) else {
            return assert!(!avx512());
        };
        res.unwrap();
        for (i, (g, w)) in d.iter().zip(&want).enumerate() {
            // SAFETY: initialised above.
            let g = unsafe { g.assume_init() };
            assert!((g - w).abs() < 1e-4, "value {i}: {g} vs {w}");
        }
    }

    /// Head-first destinations: head g's row t at (g·cap + row0 + t)·w; the rows around stay.
    #[test]
    fn head_first_destination() {
        let (hd, heads, n, m, cap, row0) = (64, 3, 10, 4, 16, 5);
        let c = case(hd, heads, n, m, 3);
        let (cols, r, src, p, wt) = (c.cols, &c.r, &c.src, &c.p, &c.wt);
        let f = Factors::new(&c.pm, &c.wm);
        let want = reference(src, cols, Some((p, wt, m)), Some((r, heads)));
        let mut d = vec![MaybeUninit::new(-7.0f32); heads * cap * hd];
        let mut dst = Dst {
            data: &mut d,
            stride: hd,
            group_base: (0..heads).map(|g| (g * cap + row0) * hd).collect(),
            width: hd,
        };
        let Some(res) = sweep(src, cols, Some(&f), Some((r, heads)), &mut dst) else {
            return assert!(!avx512());
        };
        res.unwrap();
        for g in 0..heads {
            for row in 0..cap {
                for c in 0..hd {
                    // SAFETY: initialised above.
                    let got = unsafe { d[(g * cap + row) * hd + c].assume_init() };
                    let expect = if (row0..row0 + n).contains(&row) {
                        want[(row - row0) * cols + g * hd + c]
                    } else {
                        -7.0
                    };
                    assert_eq!(got, expect, "head {g} row {row} col {c}");
                }
            }
        }
    }

    /// A non-finite value is reported at its source index, the first in row-major order.
    #[test]
    fn first_non_finite_is_named() {
        let (hd, heads, n) = (64, 2, 11);
        let cols = hd * heads;
        let spec = RopeSpec::new(hd, 10000.0, PairLayout::HalfSplit);
        let r = Rotation::new(&spec, 0, 5).unwrap();
        for (at, v) in [
            (9 * cols + 70, f32::NAN),
            (2 * cols + 3, f32::INFINITY),
            (10 * cols + 127, f32::NEG_INFINITY),
        ] {
            let mut src = wave(n * cols, 0.1);
            src[at] = v;
            src[n * cols - 1] = f32::NAN;
            let Some(res) = run(&src, cols, None, Some((&r, heads))) else {
                return assert!(!avx512());
            };
            // The rotation spreads a pair's bad value to its partner: the first of the two.
            let ci = (at % cols) % hd;
            let partner = at - ci + (ci + hd / 2) % hd;
            assert_eq!(res.unwrap_err(), at.min(partner), "planted at {at}");
        }
    }

    /// Interleaved pairs and partial rotary take the blockwise pass.
    #[test]
    fn other_rotations_decline() {
        let src = wave(4 * 128, 0.1);
        for spec in [
            RopeSpec::new(64, 1e4, PairLayout::Interleaved),
            RopeSpec {
                rotary_dims: 32,
                ..RopeSpec::new(64, 1e4, PairLayout::HalfSplit)
            },
        ] {
            let r = Rotation::new(&spec, 0, 5).unwrap();
            assert!(run(&src, 128, None, Some((&r, 2))).is_none());
        }
    }
}
