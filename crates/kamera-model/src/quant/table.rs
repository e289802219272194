//! A [`QMatrix`](super::QMatrix)'s per-group scales (and offsets), kept as the GGUF block holds
//! them: f16 where the block stores the value itself (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: exact, and
//! half the bytes decode streams for them), f32 where the value is a product (the K-quants'
//! `d · sc`, an f16 times a 6- or 8-bit integer: exact in f32, not in f16).
//!
//! The decode kernels are generic over the element ([`Scale`]) and dispatched once per call;
//! the other products read a value at a time through [`Table::get`] or [`x86::get`].

use half::f16;

/// One group's scale or offset as stored.
pub(crate) trait Scale: Copy + Send + Sync + 'static {
    /// Bytes per value (4: f32, 2: f16).
    const BYTES: usize;
    /// The value as f32 (exact: f16 → f32 is).
    fn f32(self) -> f32;
    /// `t`'s values, which are of this type (a matrix's offsets are of its scales' type, and
    /// the kernels are dispatched on the scales').
    fn values(t: &Table) -> &[Self];
    /// `s` itself where the values are f32 (no widening needed).
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
}

impl Scale for f32 {
    const BYTES: usize = 4;
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
    fn values(t: &Table) -> &[f32] {
        match t {
            Table::F32(v) => v,
            Table::F16(_) => panic!("f16 offsets beside f32 scales"),
        }
    }
    fn as_f32(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
}

impl Scale for f16 {
    const BYTES: usize = 2;
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }
    fn values(t: &Table) -> &[f16] {
        match t {
            Table::F16(v) => v,
            Table::F32(_) => panic!("f32 offsets beside f16 scales"),
        }
    }
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }
}

/// Per-group values of a matrix, row-major (`rows · cols / group`).
#[derive(Debug)]
pub(crate) enum Table {
    /// As the block stores them (Q4_0 ... Q8_0).
    F16(Vec<f16>),
    /// Products (K-quants).
    F32(Vec<f32>),
}

/// `$body` with `$v` bound to the table's slice, once per element type: generic code
/// instantiated for both.
macro_rules! with_table {
    ($t:expr, $v:ident => $body:expr) => {
        match $t {
            $crate::quant::table::Table::F16($v) => $body,
            $crate::quant::table::Table::F32($v) => $body,
        }
    };
}
pub(crate) use with_table;

impl Table {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        with_table!(self, v => v.len())
    }

    /// Resident bytes.
    pub fn bytes(&self) -> usize {
        with_table!(self, v => std::mem::size_of_val(v.as_slice()))
    }

    /// Value `i` as f32.
    #[inline(always)]
    pub fn get(&self, i: usize) -> f32 {
        with_table!(self, v => v[i].f32())
    }

    /// Appends `more` (the same element type: rows of one tensor).
    pub fn append(&mut self, more: Table) {
        match (self, more) {
            (Table::F16(a), Table::F16(b)) => a.extend(b),
            (Table::F32(a), Table::F32(b)) => a.extend(b),
            _ => unreachable!("rows of one tensor share their scale type"),
        }
    }

    /// The address and bytes of values `from..from + n` (for prefetches; not read here).
    pub fn span(&self, from: usize, n: usize) -> (*const u8, usize) {
        fn at<S: Scale>(v: &[S], from: usize, n: usize) -> (*const u8, usize) {
            (v.as_ptr().wrapping_add(from) as *const u8, S::BYTES * n)
        }
        with_table!(self, v => at(v, from, n))
    }

    /// `Σ_i t[from + i] · x[i]` over `x`'s length (a row's offsets times its input's group sums).
    #[inline]
    pub fn dot(&self, from: usize, x: &[f32]) -> f32 {
        match self {
            Table::F32(v) => crate::lanes::dot(&v[from..from + x.len()], x),
            Table::F16(v) => dot_f16(&v[from..from + x.len()], x),
        }
    }
}

/// `Σ a_i · x_i` for f16 `a` (the portable path's; the x86 kernels add offsets with
/// [`x86::RowOffsets`]).
fn dot_f16(a: &[f16], x: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), x.len());
    a.iter().zip(x).map(|(a, x)| a.to_f32() * x).sum()
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::super::{Offsets, QMatrix};
    use super::Scale;

    /// Whether the CPU has AVX2, FMA and F16C (every AVX2 CPU shipped has all three; the
    /// kernels that read f16 scales check it with their own features).
    pub(crate) fn has_f16c() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }

    /// The value at `p` as f32.
    ///
    /// # Safety
    /// `p` is valid for one `S`; the caller runs with F16C enabled.
    #[inline(always)]
    pub(crate) unsafe fn get<S: Scale>(p: *const S) -> f32 {
        unsafe {
            if S::BYTES == 2 {
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u16).read() as i32)))
            } else {
                (p as *const f32).read()
            }
        }
    }

    /// The value at `p` in 8 lanes.
    ///
    /// # Safety
    /// `p` is valid for one `S`; the caller runs with AVX and F16C enabled.
    #[inline(always)]
    pub(crate) unsafe fn set8<S: Scale>(p: *const S) -> __m256 {
        unsafe {
            if S::BYTES == 2 {
                _mm256_cvtph_ps(_mm_set1_epi16((p as *const u16).read() as i16))
            } else {
                _mm256_broadcast_ss(&*(p as *const f32))
            }
        }
    }

    /// The first `n ≤ 16` values at `p` as f32, the other lanes zero (nothing past them read).
    ///
    /// # Safety
    /// `p` is valid for `n` values of `S`; the caller runs with AVX-512 F/BW enabled.
    #[inline(always)]
    pub(crate) unsafe fn load16<S: Scale>(p: *const S, n: usize) -> __m512 {
        unsafe {
            let mask = ((1u32 << n) - 1) as u16;
            if S::BYTES == 2 {
                _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(
                    mask as u32,
                    p as *const i16,
                )))
            } else {
                _mm512_maskz_loadu_ps(mask, p as *const f32)
            }
        }
    }

    /// `n ≤ 256` values at `p` as f32 into `out`, 16 at a time.
    ///
    /// # Safety
    /// `p` is valid for `n` values of `S`; the caller runs with AVX-512 F/BW enabled.
    #[inline(always)]
    pub(crate) unsafe fn widen16<S: Scale>(p: *const S, n: usize, out: &mut [f32; 256]) {
        unsafe {
            debug_assert!(n <= 256);
            let mut i = 0;
            while i < n {
                let m = (n - i).min(16);
                // A whole vector stored (zeros past `n`; 256 is whole vectors).
                _mm512_storeu_ps(out.as_mut_ptr().add(i), load16(p.add(i), m));
                i += 16;
            }
        }
    }

    /// `Σ_i t_i · x_i` over `x.len()` values at `p`, 16 at a time (a masked tail).
    ///
    /// # Safety
    /// `p` is valid for `x.len()` values of `S`; the caller runs with AVX-512 F/BW enabled.
    #[inline(always)]
    unsafe fn dot16<S: Scale>(p: *const S, x: &[f32]) -> f32 {
        unsafe {
            let (n, xp) = (x.len(), x.as_ptr());
            let mut acc = _mm512_setzero_ps();
            let mut i = 0;
            while i < n {
                let m = (n - i).min(16);
                let xv = _mm512_maskz_loadu_ps(((1u32 << m) - 1) as u16, xp.add(i));
                acc = _mm512_fmadd_ps(load16(p.add(i), m), xv, acc);
                i += 16;
            }
            _mm512_reduce_add_ps(acc)
        }
    }

    /// `Σ_i t_i · x_i` over `x.len()` values at `p`, 8 at a time (a scalar tail).
    ///
    /// # Safety
    /// `p` is valid for `x.len()` values of `S`; the caller runs with AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot8<S: Scale>(p: *const S, x: &[f32]) -> f32 {
        unsafe {
            let (n, xp) = (x.len(), x.as_ptr());
            let whole = n / 8 * 8;
            let mut acc = _mm256_setzero_ps();
            for i in (0..whole).step_by(8) {
                let v = if S::BYTES == 2 {
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(i) as *const __m128i))
                } else {
                    _mm256_loadu_ps(p.add(i) as *const f32)
                };
                acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(xp.add(i)), acc);
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
            let mut sum: f32 = lanes.iter().sum();
            for i in whole..n {
                sum += get(p.add(i)) * x[i];
            }
            sum
        }
    }

    /// A matrix's offsets' term for its row kernels: row `r`'s `Σ_g offset_g · xsum_g`
    /// (`xsum` the input's group sums), taken right after the row's codes while its scales are
    /// in cache (a pass over a task's rows afterwards: Q5_0 about 4% slower in the probe).
    pub(crate) struct RowOffsets<'a, S> {
        /// The offsets (`PerGroup`) or the scales (`Zero`), row-major; null for none.
        values: *const S,
        /// The factor: 1 for offsets, `−zero` for scales.
        factor: f32,
        xsum: &'a [f32],
    }

    impl<'a, S: Scale> RowOffsets<'a, S> {
        /// `q`'s term with `scales` (its scales' values) on `xsum`: none for signed codes or an
        /// empty `xsum` (the code products alone, as tests compare them).
        ///
        /// # Panics
        /// Where `xsum` is neither empty nor one sum per group of a row.
        pub(crate) fn new(q: &QMatrix, scales: &[S], xsum: &'a [f32]) -> Self {
            let none = RowOffsets {
                values: std::ptr::null(),
                factor: 0.0,
                xsum,
            };
            if xsum.is_empty() {
                return none;
            }
            // The kernels read through pointers: a caller's shape error stops here.
            assert_eq!(xsum.len(), q.cols / q.group, "group sums of one input row");
            match &q.offsets {
                Offsets::None => none,
                Offsets::Zero(z) => RowOffsets {
                    values: scales.as_ptr(),
                    factor: -z,
                    xsum,
                },
                Offsets::PerGroup(t) => RowOffsets {
                    values: S::values(t).as_ptr(),
                    factor: 1.0,
                    xsum,
                },
            }
        }

        /// Row `r`'s term, 16 values at a time.
        ///
        /// # Safety
        /// `r` is a row of the matrix; the caller runs with AVX-512 F/BW enabled.
        #[inline(always)]
        pub(crate) unsafe fn avx512(&self, r: usize) -> f32 {
            if self.values.is_null() {
                return 0.0;
            }
            unsafe { self.factor * dot16(self.values.add(r * self.xsum.len()), self.xsum) }
        }

        /// Row `r`'s term, 8 values at a time.
        ///
        /// # Safety
        /// `r` is a row of the matrix; the caller runs with AVX2, FMA and F16C enabled.
        #[inline(always)]
        pub(crate) unsafe fn avx2(&self, r: usize) -> f32 {
            if self.values.is_null() {
                return 0.0;
            }
            unsafe { self.factor * dot8(self.values.add(r * self.xsum.len()), self.xsum) }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::Table;

    #[test]
    fn an_f16_table_reads_and_multiplies_as_its_f32_values() {
        // 37 values, all of which f16 holds exactly.
        let vals: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.125).collect();
        let x: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 * 0.5).collect();
        let mut h = Table::F16(vals.iter().map(|&v| f16::from_f32(v)).collect());
        let f = Table::F32(vals.clone());
        assert_eq!((h.bytes(), f.bytes()), (74, 148));
        for i in 0..vals.len() {
            assert_eq!(h.get(i), f.get(i));
        }
        // Exact sums here (multiples of 1/16 well inside f32), so any order gives the same.
        for from in [0, 3] {
            let want: f32 = vals[from..].iter().zip(&x).map(|(a, b)| a * b).sum();
            assert_eq!(h.dot(from, &x[..37 - from]), want, "from {from}");
            assert_eq!(f.dot(from, &x[..37 - from]), want, "from {from}");
        }
        h.append(Table::F16(vec![f16::from_f32(2.5)]));
        assert_eq!((h.len(), h.get(37)), (38, 2.5));
        assert_eq!(h.span(2, 3).1, 6);
    }
}
