//! Rotary position embedding (RoPE) as a spec: pair layout, partial rotary, per-layer base,
//! linear scaling and M-RoPE sections. Angles are computed in f64 so large positions do not drift.
//! Paper: KAMERA.md "Relocation R(δ)": rotations compose, R(p+q) = R(p)R(q).

use crate::error::{Result, invalid};

/// Which two dims of a head form a rotary pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PairLayout {
    /// Pairs (2i, 2i+1): llama weights as llama.cpp stores them, GPT-J.
    Interleaved,
    /// Pairs (i, i + rotary_dims/2): HF llama, NeoX, Qwen, Gemma.
    HalfSplit,
}

/// Position scaling a model declares.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (equivalently θ_i / factor).
    Linear {
        factor: f64,
    },
    /// YaRN (Peng et al. 2023, arXiv:2309.00071; HF `_compute_yarn_parameters`): pairs turning
    /// fewer than `beta_slow` times over `original_max_position` are interpolated (θ_i / factor),
    /// those turning more than `beta_fast` times keep θ_i, a linear ramp between. YaRN's magnitude
    /// scale (mscale) multiplies keys and queries, not an angle: it stays with the runner.
    Yarn {
        factor: f64,
        original_max_position: f64,
        beta_fast: f64,
        beta_slow: f64,
        /// Round the correction range outwards to whole pairs (HF's default).
        truncate: bool,
    },
    /// A scaling the model declares that this crate does not implement (e.g. "yarn", "llama3");
    /// every operation on such a spec is an error.
    Other {
        kind: String,
    },
}

/// How one model rotates its keys and queries.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    /// Dims of one rotary head vector (for MLA: the decoupled k_rope dims).
    pub head_dim: usize,
    /// The first `rotary_dims` dims of each head rotate; the rest pass through (partial rotary).
    pub rotary_dims: usize,
    pub layout: PairLayout,
    /// RoPE base per layer, or a single base for every layer.
    pub bases: Vec<f64>,
    pub scaling: RopeScaling,
    /// M-RoPE (Qwen2-VL): number of rotary pairs for the (temporal, height, width) position ids.
    pub mrope_sections: Option<[usize; 3]>,
}

impl RopeSpec {
    /// Full rotary, one base for all layers, no scaling.
    pub fn new(head_dim: usize, base: f64, layout: PairLayout) -> RopeSpec {
        RopeSpec {
            head_dim,
            rotary_dims: head_dim,
            layout,
            bases: vec![base],
            scaling: RopeScaling::None,
            mrope_sections: None,
        }
    }
    pub fn with_layer_bases(mut self, bases: Vec<f64>) -> RopeSpec {
        self.bases = bases;
        self
    }
    pub fn with_rotary_dims(mut self, rotary_dims: usize) -> RopeSpec {
        self.rotary_dims = rotary_dims;
        self
    }
    pub fn with_scaling(mut self, scaling: RopeScaling) -> RopeSpec {
        self.scaling = scaling;
        self
    }
    pub fn with_mrope(mut self, sections: [usize; 3]) -> RopeSpec {
        self.mrope_sections = Some(sections);
        self
    }

    /// Rotary pairs per head.
    pub fn pairs(&self) -> usize {
        self.rotary_dims / 2
    }

    /// Checks the spec is one this crate computes exactly.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "RopeSpec::validate";
        if self.rotary_dims == 0 || self.rotary_dims % 2 != 0 || self.rotary_dims > self.head_dim {
            return Err(invalid(
                OP,
                "rotary_dims",
                format!(
                    "{} must be even, > 0 and <= head_dim {}",
                    self.rotary_dims, self.head_dim
                ),
            ));
        }
        if self.bases.is_empty() || self.bases.iter().any(|b| !(b.is_finite() && *b > 1.0)) {
            return Err(invalid(
                OP,
                "base",
                format!("{:?}: need at least one finite base > 1", self.bases),
            ));
        }
        match &self.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } if factor.is_finite() && *factor > 0.0 => {}
            RopeScaling::Linear { factor } => {
                return Err(invalid(
                    OP,
                    "linear scaling factor",
                    format!("{factor} must be finite and > 0"),
                ));
            }
            RopeScaling::Yarn {
                factor,
                original_max_position,
                beta_fast,
                beta_slow,
                ..
            } => {
                let ok = [*factor, *original_max_position, *beta_fast, *beta_slow]
                    .iter()
                    .all(|x| x.is_finite() && *x > 0.0);
                if !ok {
                    return Err(invalid(
                        OP,
                        "yarn scaling",
                        format!("{:?}: every parameter must be finite and > 0", self.scaling),
                    ));
                }
            }
            RopeScaling::Other { kind } => {
                return Err(invalid(
                    OP,
                    "rope scaling",
                    format!("'{kind}' is not implemented (supported: none, linear, yarn)"),
                ));
            }
        }
        if let Some(s) = self.mrope_sections
            && s.iter().sum::<usize>() != self.pairs()
        {
            return Err(invalid(
                OP,
                "mrope_sections",
                format!("{s:?} must sum to rotary_dims/2 = {}", self.pairs()),
            ));
        }
        Ok(())
    }

    /// The base used by `layer`.
    pub fn base(&self, layer: usize) -> Result<f64> {
        match self.bases.as_slice() {
            [b] => Ok(*b),
            bs => bs.get(layer).copied().ok_or_else(|| {
                invalid(
                    "RopeSpec::base",
                    "layer",
                    format!("layer {layer} but {} per-layer bases", bs.len()),
                )
            }),
        }
    }

    /// θ_i = base^(-2i/rotary_dims) / scaling, for each rotary pair i of `layer`.
    pub fn inv_freqs(&self, layer: usize) -> Result<Vec<f64>> {
        self.validate()?;
        let base = self.base(layer)?;
        let factor = match self.scaling {
            RopeScaling::Linear { factor } => factor,
            _ => 1.0,
        };
        let d = self.rotary_dims as f64;
        let plain = (0..self.pairs()).map(|i| base.powf(-2.0 * i as f64 / d) / factor);
        match self.scaling {
            RopeScaling::Yarn { factor, .. } => Ok(plain
                .zip(self.yarn_ramp(base))
                .map(|(t, r)| t * (1.0 - r) + t / factor * r)
                .collect()),
            _ => Ok(plain.collect()),
        }
    }

    /// Per pair, YaRN's interpolation weight in [0, 1] (0: θ_i kept, 1: θ_i / factor), as HF
    /// computes it (find_correction_range, linear_ramp_factor).
    fn yarn_ramp(&self, base: f64) -> Vec<f64> {
        let RopeScaling::Yarn {
            original_max_position: max_pos,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } = self.scaling
        else {
            return vec![0.0; self.pairs()];
        };
        let d = self.rotary_dims as f64;
        let dim = |rot: f64| d * (max_pos / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
        let (mut lo, mut hi) = (dim(beta_fast), dim(beta_slow));
        if truncate {
            (lo, hi) = (lo.floor(), hi.ceil());
        }
        let (lo, mut hi) = (lo.max(0.0), hi.min(d - 1.0));
        if lo == hi {
            hi += 0.001;
        }
        (0..self.pairs())
            .map(|i| ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0))
            .collect()
    }

    /// Which M-RoPE section (0 = t, 1 = h, 2 = w) each rotary pair reads its position from.
    fn pair_sections(&self) -> Vec<usize> {
        match self.mrope_sections {
            None => vec![0; self.pairs()],
            Some(s) => (0..3).flat_map(|k| std::iter::repeat_n(k, s[k])).collect(),
        }
    }

    /// cos and sin of every (token, pair) angle for scalar positions (M-RoPE: t = h = w = pos).
    /// Each output is `[positions.len(), rotary_dims/2]`, row-major.
    pub fn cos_sin(&self, layer: usize, positions: &[i64]) -> Result<(Vec<f32>, Vec<f32>)> {
        let pos3: Vec<[i64; 3]> = positions.iter().map(|&p| [p, p, p]).collect();
        self.cos_sin_mrope(layer, &pos3)
    }

    /// cos and sin for 3-D M-RoPE position ids (t, h, w); without sections only t is read.
    pub fn cos_sin_mrope(&self, layer: usize, positions: &[[i64; 3]]) -> Result<(Vec<f32>, Vec<f32>)> {
        let theta = self.inv_freqs(layer)?;
        let sec = self.pair_sections();
        let half = theta.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for p in positions {
            for i in 0..half {
                let a = p[sec[i]] as f64 * theta[i];
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Ok((cos, sin))
    }

    /// Rotates the rows of `x` (`[n, n_heads * head_dim]`) to scalar `positions` in place.
    pub fn apply(&self, layer: usize, x: &mut [f32], n_heads: usize, positions: &[i64]) -> Result<()> {
        let (cos, sin) = self.cos_sin(layer, positions)?;
        self.apply_cos_sin(x, n_heads, positions.len(), &cos, &sin)
    }

    /// Rotates the rows of `x` to 3-D M-RoPE positions in place.
    pub fn apply_mrope(&self, layer: usize, x: &mut [f32], n_heads: usize, positions: &[[i64; 3]]) -> Result<()> {
        let (cos, sin) = self.cos_sin_mrope(layer, positions)?;
        self.apply_cos_sin(x, n_heads, positions.len(), &cos, &sin)
    }

    /// Rotates the `n` rows of `x` by angle tables from [`RopeSpec::cos_sin`] (or its M-RoPE
    /// form), so Q and K of the same positions share one table.
    pub fn apply_cos_sin(&self, x: &mut [f32], n_heads: usize, n: usize, cos: &[f32], sin: &[f32]) -> Result<()> {
        let half = self.pairs();
        if cos.len() != n * half || sin.len() != n * half {
            return Err(crate::error::shape(
                "RopeSpec::apply",
                "cos/sin tables",
                format!("{n} positions x {half} pairs"),
                cos.len().min(sin.len()),
            ));
        }
        let width = n_heads * self.head_dim;
        if x.len() != n * width {
            return Err(crate::error::shape(
                "RopeSpec::apply",
                "x",
                format!("{n} positions x {n_heads} heads x {} = {}", self.head_dim, n * width),
                x.len(),
            ));
        }
        for (t, row) in x.chunks_exact_mut(width.max(1)).enumerate() {
            let (c, s) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
            rotate_row(row, n_heads, self.head_dim, self.layout, c, s);
        }
        Ok(())
    }
}

/// A rotation by a fixed shift δ: every token of a relocated chunk turns by the same angles.
#[derive(Debug, Clone)]
pub struct Rotation {
    pub(crate) cos: Vec<f32>,
    pub(crate) sin: Vec<f32>,
    pub(crate) layout: PairLayout,
    pub(crate) head_dim: usize,
}

impl Rotation {
    /// R(δ) for `layer`: angle δ·θ_i per pair, in f64. Under M-RoPE a chunk shift adds δ to
    /// every section's id, so each pair still turns by δ·θ_i.
    pub fn new(spec: &RopeSpec, layer: usize, delta: i64) -> Result<Rotation> {
        let (cos, sin) = spec.cos_sin(layer, &[delta])?;
        Ok(Rotation {
            cos,
            sin,
            layout: spec.layout,
            head_dim: spec.head_dim,
        })
    }

    /// Whether this rotation is the identity (δ = 0).
    pub fn is_identity(&self) -> bool {
        self.sin.iter().all(|&s| s == 0.0) && self.cos.iter().all(|&c| c == 1.0)
    }

    /// Rotates one row of `n_heads` head vectors in place.
    #[inline(always)]
    pub fn rotate(&self, row: &mut [f32], n_heads: usize) {
        rotate_row(row, n_heads, self.head_dim, self.layout, &self.cos, &self.sin);
    }

    /// Rotates every row (`cols` values, the first `n_heads` heads) of `rows` in place: whole
    /// AVX-512 vectors for half-split pairs where the half is a multiple of 16.
    pub fn rotate_rows(&self, rows: &mut [f32], cols: usize, n_heads: usize) {
        #[cfg(target_arch = "x86_64")]
        if self.layout == PairLayout::HalfSplit
            && self.cos.len() % 16 == 0
            && n_heads * self.head_dim <= cols
            && std::arch::is_x86_feature_detected!("avx512f")
        {
            // SAFETY: the CPU has AVX-512F; every row holds n_heads heads of head_dim >= 2·half.
            unsafe { half_split_avx512(rows, cols, n_heads, self.head_dim, &self.cos, &self.sin) };
            return;
        }
        for row in rows.chunks_exact_mut(cols.max(1)) {
            self.rotate(row, n_heads);
        }
    }

    /// [`Rotation::rotate_rows`], returning whether every value of `rows` is finite afterwards:
    /// checked on the rotated vectors in registers where the heads fill the rows, by a pass
    /// after the rotation otherwise.
    pub fn rotate_rows_finite(&self, rows: &mut [f32], cols: usize, n_heads: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.layout == PairLayout::HalfSplit
            && self.cos.len() % 16 == 0
            && 2 * self.cos.len() == self.head_dim
            && n_heads * self.head_dim == cols
            && std::arch::is_x86_feature_detected!("avx512f")
        {
            // SAFETY: as in rotate_rows; the heads cover every value of a row.
            return unsafe { half_split_avx512(rows, cols, n_heads, self.head_dim, &self.cos, &self.sin) };
        }
        self.rotate_rows(rows, cols, n_heads);
        rows.iter().fold(true, |a, r| a & r.is_finite())
    }
}

/// [`rotate_row`]'s half-split case over rows, 16 pairs per vector (`cos.len()` a multiple of 16).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn half_split_avx512(
    rows: &mut [f32],
    cols: usize,
    n_heads: usize,
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
) -> bool {
    use std::arch::x86_64::*;
    let half = cos.len();
    // Lanes that held a non-finite result.
    let mut bad: __mmask16 = 0;
    for row in rows.chunks_exact_mut(cols) {
        for h in 0..n_heads {
            let p = row[h * head_dim..h * head_dim + 2 * half].as_mut_ptr();
            for i in (0..half).step_by(16) {
                // SAFETY: i + 16 <= half; lo at p + i, hi at p + half + i, inside the head.
                unsafe {
                    let (c, s) = (
                        _mm512_loadu_ps(cos.as_ptr().add(i)),
                        _mm512_loadu_ps(sin.as_ptr().add(i)),
                    );
                    let (a, b) = (_mm512_loadu_ps(p.add(i)), _mm512_loadu_ps(p.add(half + i)));
                    let (lo, hi) = (
                        _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)),
                        _mm512_fmadd_ps(a, s, _mm512_mul_ps(b, c)),
                    );
                    _mm512_storeu_ps(p.add(i), lo);
                    _mm512_storeu_ps(p.add(half + i), hi);
                    bad |= crate::lanes::non_finite(lo) | crate::lanes::non_finite(hi);
                }
            }
        }
    }
    bad == 0
}

/// Rotates each head of `row` by per-pair (cos, sin): (a, b) -> (a·c − b·s, a·s + b·c).
#[inline(always)]
pub(crate) fn rotate_row(
    row: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    layout: PairLayout,
    cos: &[f32],
    sin: &[f32],
) {
    let half = cos.len();
    for h in 0..n_heads {
        let head = &mut row[h * head_dim..h * head_dim + 2 * half];
        match layout {
            PairLayout::Interleaved => {
                for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = a * cos[i] - b * sin[i];
                    pair[1] = a * sin[i] + b * cos[i];
                }
            }
            PairLayout::HalfSplit => {
                let (lo, hi) = head.split_at_mut(half);
                for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
                    let (x, y) = (*a, *b);
                    *a = x * c - y * s;
                    *b = x * s + y * c;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HF transformers 5.25 `_compute_yarn_parameters` (f32) on DeepSeek-V2-Lite's rope (64 dims,
    /// base 1e4, factor 40, original 4096) at pairs 0, 8, 16, 24, and on the tiny golden's.
    #[test]
    fn yarn_inv_freqs_match_hf() {
        let yarn = |d: usize, factor: f64, orig: f64| {
            RopeSpec::new(d, 10_000.0, PairLayout::Interleaved).with_scaling(RopeScaling::Yarn {
                factor,
                original_max_position: orig,
                beta_fast: 32.0,
                beta_slow: 1.0,
                truncate: true,
            })
        };
        let lite = yarn(64, 40.0, 4096.0).inv_freqs(0).unwrap();
        let got: Vec<f64> = lite.iter().step_by(8).copied().collect();
        let hf = [1.0, 0.100_000_001_5, 0.005_500_000_436, 2.499_999_937e-5];
        for (g, h) in got.iter().zip(hf) {
            assert!((g - h).abs() <= 1e-6 * h, "{got:?} vs {hf:?}");
        }
        let tiny = yarn(8, 4.0, 16.0).inv_freqs(0).unwrap();
        let hf = [1.0, 0.025, 0.0025, 0.00025];
        for (g, h) in tiny.iter().zip(hf) {
            assert!((g - h).abs() <= 1e-6 * h, "{tiny:?} vs {hf:?}");
        }
    }
}
