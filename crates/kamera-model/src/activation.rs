//! The gated MLP's activation, `act(gate) · up`, in one vectorised pass: SiLU `x·σ(x)` and GELU
//! with the tanh approximation, `0.5·x·(1 + tanh(u)) = x·σ(2u)` with `u = √(2/π)·(x + 0.044715x³)`
//! (the identity 1 + tanh(u) = 2σ(2u)); σ from the branch-free exponential of `lanes`.

use crate::config::Activation;
use crate::lanes::exp_nonpositive;

/// σ(a) = 1 / (1 + e^{−a}), evaluated through e^{−|a|} so the exponential never overflows.
#[inline(always)]
fn sigmoid(a: f32) -> f32 {
    let t = exp_nonpositive(-a.abs());
    let r = 1.0 / (1.0 + t);
    if a >= 0.0 { r } else { t * r }
}

/// The activation of one value.
#[inline(always)]
pub(crate) fn activate(kind: Activation, x: f32) -> f32 {
    match kind {
        Activation::Silu => x * sigmoid(x),
        Activation::GeluTanh => {
            const C2: f32 = 2.0 * 0.797_884_6; // 2·sqrt(2/π)
            x * sigmoid(C2 * x * (1.0 + 0.044715 * x * x))
        }
    }
}

/// `gate[i] = act(gate[i]) · up[i]`.
pub(crate) fn gated(kind: Activation, gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { gated_avx2(kind, gate, up) };
    }
    gated_generic(kind, gate, up)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gated_avx2(kind: Activation, gate: &mut [f32], up: &[f32]) {
    gated_generic(kind, gate, up)
}

#[inline(always)]
fn gated_generic(kind: Activation, gate: &mut [f32], up: &[f32]) {
    match kind {
        Activation::Silu => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, u)| *g = activate(Activation::Silu, *g) * u),
        Activation::GeluTanh => gate
            .iter_mut()
            .zip(up)
            .for_each(|(g, u)| *g = activate(Activation::GeluTanh, *g) * u),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the textbook formulas in f64 (what candle's silu and tanh-GELU compute in f32).
    #[test]
    fn activations_match_their_formulas() {
        let (mut worst_silu, mut worst_gelu) = (0f64, 0f64);
        for i in -20_000..=20_000 {
            let x = i as f32 * 0.001;
            let xd = x as f64;
            let silu = xd / (1.0 + (-xd).exp());
            let u = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd * xd * xd);
            let gelu = 0.5 * xd * (1.0 + u.tanh());
            let err = |got: f32, want: f64| (got as f64 - want).abs() / want.abs().max(1e-3);
            worst_silu = worst_silu.max(err(activate(Activation::Silu, x), silu));
            worst_gelu = worst_gelu.max(err(activate(Activation::GeluTanh, x), gelu));
        }
        assert!(worst_silu < 1e-6, "SiLU relative error {worst_silu:e}");
        // u is a cubic rounded in f32 (a few ulps), which σ(2u) passes on.
        assert!(worst_gelu < 2e-6, "GELU relative error {worst_gelu:e}");
        let mut g = vec![1.0, -2.0, 100.0, -100.0];
        gated(Activation::Silu, &mut g, &[2.0, 1.0, 1.0, 1.0]);
        assert!(
            (g[0] - 2.0 * 0.731_058_6).abs() < 1e-6 && g[2] == 100.0 && g[3].abs() < 1e-30,
            "{g:?}"
        );
    }
}
