//! Per-layer gains of the greedy byte budget (kamera-ops `RankPolicy::BudgetGains`): by the
//! layer's own KV energy, by a measured per-layer KL sensitivity, by K/V and by attention kind.

use kamera_ops::{ChunkKv, RankPolicy, Svd, sensitivity_gain};

use crate::error::{Error, Result};

/// How a byte budget weighs its layers: `relative` divides each direction's σ² by its layer's
/// canonical K (V) energy ‖KV_l‖² (`/rel`); `sensitivity` replaces σ² by s_l · σ²/‖Δ_l‖², the
/// direction's share of its matrix's deficit times the share s_l of the blind KL that leaving
/// that layer's K (V) uncorrected costs (`/ls`, from `--layer-sensitivity`; first order: the
/// KL a layer leaves scales with the energy share of its deficit left out); `k_gain` multiplies
/// K's gains (`/kx=F`), `global_gain` those of the global-attention layers of a sliding-window
/// model (`/gx=F`; every layer of one without).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Alloc {
    pub relative: bool,
    pub sensitivity: bool,
    pub k_gain: f64,
    pub global_gain: f64,
}

impl Default for Alloc {
    fn default() -> Alloc {
        Alloc {
            relative: false,
            sensitivity: false,
            k_gain: 1.0,
            global_gain: 1.0,
        }
    }
}

fn energy(m: &kamera_ops::Mat) -> f64 {
    m.to_f32_vec().iter().map(|&x| (x as f64) * (x as f64)).sum()
}

impl Alloc {
    pub fn any(&self) -> bool {
        *self != Alloc::default()
    }
    /// Per layer, the (K, V) gains for `canonical` whose deficit SVDs are `svds`; `local[l]`
    /// marks sliding-window layers; `sens` the per-layer (K, V) sensitivities.
    pub fn gains(
        &self,
        canonical: &ChunkKv,
        svds: &[(Svd, Svd)],
        local: &[bool],
        sens: &[(f64, f64)],
    ) -> Result<Vec<(f64, f64)>> {
        let n = canonical.layers().len();
        if self.sensitivity && sens.len() != n {
            return Err(Error::Invalid {
                op: "layer gains",
                detail: format!("/ls needs --layer-sensitivity with {n} layers (got {})", sens.len()),
            });
        }
        Ok(canonical
            .layers()
            .iter()
            .zip(svds)
            .enumerate()
            .map(|(l, (kv, (sk, sv)))| {
                let mut g = [self.k_gain, 1.0];
                if !local.get(l).copied().unwrap_or(false) {
                    g = g.map(|x| x * self.global_gain);
                }
                if self.relative {
                    let (ek, ev) = (energy(&kv.k), energy(&kv.v));
                    g[0] = if ek > 0.0 { g[0] / ek } else { 0.0 };
                    g[1] = if ev > 0.0 { g[1] / ev } else { 0.0 };
                }
                if self.sensitivity {
                    // A matrix without deficit (the first chunk's) gets no directions anyway.
                    g[0] *= sensitivity_gain(sens[l].0, sk.tail_energy(0));
                    g[1] *= sensitivity_gain(sens[l].1, sv.tail_energy(0));
                }
                (g[0], g[1])
            })
            .collect())
    }
    /// `rank` with these gains (a byte budget; other policies as they are).
    pub fn policy(
        &self,
        rank: &RankPolicy,
        canonical: &ChunkKv,
        svds: &[(Svd, Svd)],
        local: &[bool],
        sens: &[(f64, f64)],
    ) -> Result<RankPolicy> {
        Ok(match rank {
            RankPolicy::Budget { fraction } if self.any() => RankPolicy::BudgetGains {
                fraction: *fraction,
                gains: self.gains(canonical, svds, local, sens)?,
            },
            other => other.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kamera_ops::{KvLayout, LayerKv, Mat, SENSITIVITY_FLOOR};

    fn chunk(scales: &[f32]) -> ChunkKv {
        let layout = KvLayout::gqa(scales.len(), 1, 1, 2);
        let layers = scales
            .iter()
            .map(|&s| LayerKv {
                k: Mat::from_f32(2, 2, vec![s; 4]).unwrap(),
                v: Mat::from_f32(2, 2, vec![2.0 * s; 4]).unwrap(),
            })
            .collect();
        ChunkKv::new(layout, 0, layers).unwrap()
    }

    fn svd(x: f32) -> Svd {
        Svd::compute(&Mat::from_f32(2, 2, vec![x, 0.0, 0.0, 0.0]).unwrap()).unwrap()
    }

    #[test]
    fn gains_follow_energy_sensitivity_and_kind() {
        let c = chunk(&[1.0, 2.0]);
        let svds = vec![(svd(1.0), svd(2.0)), (svd(0.0), svd(1.0))];
        let rel = Alloc {
            relative: true,
            ..Alloc::default()
        };
        // ‖K_0‖² = 4, ‖V_0‖² = 16, ‖K_1‖² = 16, ‖V_1‖² = 64.
        assert_eq!(
            rel.gains(&c, &svds, &[], &[]).unwrap(),
            vec![(0.25, 1.0 / 16.0), (1.0 / 16.0, 1.0 / 64.0)]
        );
        let ls = Alloc {
            sensitivity: true,
            k_gain: 2.0,
            global_gain: 3.0,
            ..Alloc::default()
        };
        let sens = [(0.5, 0.2), (0.1, 0.0)];
        // s / ‖Δ‖², K times 2, layer 1 (global) times 3; a matrix without deficit gets 0,
        // a sensitivity under the floor the floor.
        let g = ls.gains(&c, &svds, &[true, false], &sens).unwrap();
        assert_eq!(g[0], (2.0 * 0.5, 0.2 / 4.0));
        assert_eq!(g[1], (0.0, 3.0 * SENSITIVITY_FLOOR));
        assert!(ls.gains(&c, &svds, &[], &sens[..1]).is_err());
        assert_eq!(
            Alloc::default()
                .policy(&RankPolicy::Budget { fraction: 0.1 }, &c, &svds, &[], &[])
                .unwrap(),
            RankPolicy::Budget { fraction: 0.1 }
        );
    }
}
