//! Transform-coded patches (`/klt`, `/klte`): the per-model basis measured on calibration tasks
//! (the eigenvectors of the deficit's second moment, a Karhunen-Loève transform; its file format
//! is kamera-eval's `DeficitBasis`), and each chunk's patch coded in it by kamera-ops' transform
//! coder, optionally under the run's token weights and per-model column metrics. Bytes are the
//! records kamera-store writes (format version 3).

use kamera_eval::{BasisHeader, DeficitBasis, Task, eigenbasis};
use kamera_ops::{Coefficients, KvLayout, Patch, PatchConfig, RankPolicy, code_coefficients};

use crate::config::EvalConfig;
use crate::deficit::ChunkDeficit;
use crate::error::{Error, OpsCtx, Result};
use crate::evaluator::Evaluator;

/// One value per K and per V column (or entry) of a layer.
type KvPair<T> = (Vec<T>, Vec<T>);

fn invalid(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Invalid {
        op,
        detail: detail.into(),
    }
}

/// Σ ΔᵀΔ over the rows of `d` (`rows x f`, row-major), added to `g` (`f x f`, upper triangle).
fn add_gram(g: &mut [f64], d: &[f32], f: usize) {
    for row in d.chunks_exact(f) {
        for i in 0..f {
            let x = row[i] as f64;
            if x == 0.0 {
                continue;
            }
            let gi = &mut g[i * f..(i + 1) * f];
            for j in i..f {
                gi[j] += x * row[j] as f64;
            }
        }
    }
}

/// The upper triangle `g` (f64) as a full symmetric f32 matrix.
fn symmetric(g: &[f64], f: usize) -> Vec<f32> {
    let mut full = vec![0f32; f * f];
    for i in 0..f {
        for j in i..f {
            let x = g[i * f + j] as f32;
            full[i * f + j] = x;
            full[j * f + i] = x;
        }
    }
    full
}

/// Measures the basis on `tasks` (calibration tasks, not the scored ones): every chunk's deficit
/// in its task's order (the pages prefilled in order after the system prefix, against each page
/// prefilled alone), summed as ΔᵀΔ per layer and K/V, then eigendecomposed.
pub fn calibrate_basis(
    model: &kamera_model::Model,
    model_name: &str,
    tasks: &[Task],
    cfg: EvalConfig,
    on_task: &mut dyn FnMut(usize),
) -> Result<DeficitBasis> {
    if tasks.is_empty() {
        return Err(invalid("deficit basis", "no calibration tasks"));
    }
    let sensitivity = (!cfg.layer_sensitivity.is_empty()).then(|| cfg.layer_sensitivity.clone());
    let ev = Evaluator::new(model, cfg);
    let mut grams: Option<(KvLayout, Vec<KvPair<f64>>)> = None;
    for (t, task) in tasks.iter().enumerate() {
        let p = ev.prepare(task)?;
        for (cond, canon) in p.cond.iter().zip(&p.canon) {
            let d = kamera_ops::deficit(cond, canon, model.rope()).ops("deficit")?;
            let layout = *canon.layout();
            let (kf, vf) = (layout.k_features(), layout.v_features());
            let (_, g) = grams.get_or_insert_with(|| {
                (
                    layout,
                    (0..layout.n_layers)
                        .map(|_| (vec![0f64; kf * kf], vec![0f64; vf * vf]))
                        .collect(),
                )
            });
            for ((gk, gv), (dk, dv)) in g.iter_mut().zip(&d.layers) {
                add_gram(gk, &dk.to_f32_vec(), kf);
                add_gram(gv, &dv.to_f32_vec(), vf);
            }
        }
        on_task(t);
    }
    let (layout, g) = grams.ok_or_else(|| invalid("deficit basis", "the calibration tasks have no chunks"))?;
    let (kf, vf) = (layout.k_features(), layout.v_features());
    let grams = g
        .iter()
        .map(|(gk, gv)| (symmetric(gk, kf), symmetric(gv, vf)))
        .collect();
    let header = BasisHeader {
        model: model_name.to_string(),
        tasks: tasks.iter().map(|t| t.id.clone()).collect(),
        layers: layout.n_layers,
        k_features: kf,
        v_features: vf,
        sensitivity,
    };
    Ok(DeficitBasis::from_grams(header, grams)?)
}

/// Bytes of a kamera-store record besides its payload.
const RECORD_OVERHEAD: usize = kamera_store::codec::HEADER_LEN + kamera_store::codec::CHECKSUM_LEN;

/// The transform-coded patch of one chunk (its bytes are its record's). `cfg` holds the byte budget
/// (`Budget`, or `BudgetGains` with its layer gains set); `weights` may weigh each matrix's token
/// rows, and its feature columns by a per-model metric D (`wq=cal`, `o`): the matrix is then coded
/// as Δ·D^½ in the eigenbasis of D^½·ΔᵀΔ·D^½, and read back times D^-½.
pub(crate) fn klt_patch(
    deficit: &ChunkDeficit,
    cfg: &PatchConfig,
    basis: &DeficitBasis,
    entropy: bool,
) -> Result<Patch> {
    let (svds, weights, n, layout, kv_bytes) = deficit.parts();
    const OP: &str = "klt patch";
    basis.check(layout)?;
    let (fraction, gains) = match &cfg.rank {
        RankPolicy::Budget { fraction } => (*fraction, vec![(1.0, 1.0); svds.len()]),
        RankPolicy::BudgetGains { fraction, gains } => (*fraction, gains.clone()),
        other => return Err(invalid(OP, format!("/klt needs a byte budget, not {other:?}"))),
    };
    if svds.len() != layout.n_layers || gains.len() != svds.len() {
        return Err(invalid(
            OP,
            format!(
                "{} layers, {} gains for a model of {}",
                svds.len(),
                gains.len(),
                layout.n_layers
            ),
        ));
    }
    let (kf, vf) = (layout.k_features(), layout.v_features());
    // Per matrix (layer-major, K then V): its coefficients (n x f, column-major) and row weights.
    let mut mats: Vec<Coefficients> = Vec::with_capacity(2 * svds.len());
    let mut bases: Vec<Vec<f32>> = Vec::with_capacity(2 * svds.len());
    for (l, (sk, sv)) in svds.iter().enumerate() {
        for (ch, s, f) in [(0, sk, kf), (1, sv, vf)] {
            let mw = weights.map(|w| if ch == 0 { &w.layers[l].0 } else { &w.layers[l].1 });
            let rows = mw.and_then(|m| m.rows.clone());
            let dcols = mw.and_then(|m| m.cols.as_deref());
            let gram = if ch == 0 { &basis.grams[l].0 } else { &basis.grams[l].1 };
            let plain = &basis.basis.mats()[2 * l + ch];
            let b = match dcols {
                Some(c) => eigenbasis(gram, f, Some(c))?,
                None => plain.clone(),
            };
            let coeffs = if s.tail_energy(0) > 0.0 {
                let mut d = s
                    .truncate(s.max_rank(), kamera_ops::DType::F32)
                    .ops("truncate")?
                    .dense();
                if let Some(c) = dcols {
                    for row in d.chunks_mut(f) {
                        row.iter_mut().zip(c).for_each(|(x, cj)| *x *= cj.sqrt());
                    }
                }
                Some(kamera_ops::coefficients(&d, n, f, &b))
            } else {
                None
            };
            let gain = if ch == 0 { gains[l].0 } else { gains[l].1 };
            // The basis read back: its rows times D^-½.
            bases.push(match dcols {
                Some(c) => b
                    .chunks(f)
                    .flat_map(|r| r.iter().zip(c).map(|(x, cj)| x / cj.sqrt()))
                    .collect(),
                None => b,
            });
            mats.push(Coefficients {
                values: coeffs,
                rows,
                features: f,
                gain,
            });
        }
    }
    // The budget holds the whole record, kamera-store's header and checksum included.
    let budget = ((fraction * kv_bytes as f64).floor() as usize).saturating_sub(RECORD_OVERHEAD);
    let code = code_coefficients(&mats, n, budget, entropy, basis.basis.fp());
    Patch::from_code(*layout, code, &bases).ops("klt patch")
}

#[cfg(test)]
mod tests {
    use kamera_ops::{Mat, Svd};

    use super::*;

    fn layout(layers: usize, f: usize) -> KvLayout {
        KvLayout::mha(layers, 1, f)
    }

    /// diag(f, f-1, ..., 1): its eigenbasis is the identity (up to signs).
    fn ranked(f: usize) -> Vec<f32> {
        (0..f * f)
            .map(|i| {
                if i % (f + 1) == 0 {
                    (f - i / (f + 1)) as f32
                } else {
                    0.0
                }
            })
            .collect()
    }

    fn seeded(n: usize, f: usize, seed: u64) -> Vec<f32> {
        let mut r = kamera_eval::Rng::new(seed);
        (0..n * f)
            .map(|_| (r.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }

    fn header(layers: usize, k_features: usize, v_features: usize) -> BasisHeader {
        BasisHeader {
            model: "test".into(),
            tasks: vec![],
            layers,
            k_features,
            v_features,
            sensitivity: None,
        }
    }

    #[test]
    fn the_budget_holds_the_whole_record_and_favours_energy() {
        let (n, f) = (40, 8);
        let lay = layout(2, f);
        // Layer 0 K: energy in feature 0 only; everything else small noise.
        let mut svds = Vec::new();
        for l in 0..2 {
            let mk = |scale: f32, seed: u64| {
                let mut d = seeded(n, f, seed);
                d.iter_mut().for_each(|x| *x *= 0.01);
                if l == 0 {
                    for i in 0..n {
                        d[i * f] += scale * (i as f32 - 20.0) / 20.0;
                    }
                }
                Svd::compute(&Mat::from_f32(n, f, d).unwrap()).unwrap()
            };
            svds.push((mk(1.0, 1 + l as u64), mk(0.0, 9 + l as u64)));
        }
        let basis = DeficitBasis::from_grams(header(2, f, f), vec![(ranked(f), ranked(f)); 2]).unwrap();
        let kv = 100_000;
        let chunk = ChunkDeficit::plain(&svds, n, &lay, kv);
        let budget = |fraction| PatchConfig {
            rank: RankPolicy::Budget { fraction },
            ..PatchConfig::fixed(0, kamera_ops::DType::F32)
        };
        for entropy in [false, true] {
            let patch = klt_patch(&chunk, &budget(0.004), &basis, entropy).unwrap();
            let stored = crate::evaluator::stored_bytes([&patch]).unwrap();
            assert!(stored <= 400, "{stored} record bytes over the budget of 400");
            assert!(patch.layers()[0].k.rank() >= 1, "the energetic column is bought first");
            let d = svds[0].0.truncate(f, kamera_ops::DType::F32).unwrap().dense();
            let r = patch.layers()[0].k.dense();
            let col_err: f32 = (0..n).map(|i| (d[i * f] - r[i * f]).powi(2)).sum();
            let col_energy: f32 = (0..n).map(|i| d[i * f].powi(2)).sum();
            assert!(col_err < 0.01 * col_energy, "{col_err} of {col_energy}");
        }
        // A large budget holds everything closely.
        let patch = klt_patch(&chunk, &budget(1.0), &basis, false).unwrap();
        for (l, (sk, sv)) in svds.iter().enumerate() {
            for (s, lr) in [(sk, &patch.layers()[l].k), (sv, &patch.layers()[l].v)] {
                let d = s.truncate(f, kamera_ops::DType::F32).unwrap().dense();
                let e: f64 = d.iter().zip(lr.dense()).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
                assert!(e <= 1e-4 * s.tail_energy(0) + 1e-12, "layer {l}: error {e}");
            }
        }
    }

    #[test]
    fn calibrated_bases_are_orthonormal_and_lead_with_the_deficit_direction() {
        let f = 6;
        let mut g = vec![0f64; f * f];
        // Rows along (1, 1, 0, ...) mostly, plus a little of everything.
        let mut d = seeded(50, f, 3);
        d.iter_mut().for_each(|x| *x *= 0.05);
        for (i, row) in d.chunks_mut(f).enumerate() {
            let a = (i as f32 - 25.0) / 10.0;
            row[0] += a;
            row[1] += a;
        }
        add_gram(&mut g, &d, f);
        let b = eigenbasis(&symmetric(&g, f), f, None).unwrap();
        for i in 0..f {
            for j in 0..f {
                let dot: f32 = (0..f).map(|k| b[i * f + k] * b[j * f + k]).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-4, "rows {i}, {j}: {dot}");
            }
        }
        let lead = (b[0].abs() - 0.5f32.sqrt()).abs() + (b[1].abs() - 0.5f32.sqrt()).abs();
        assert!(lead < 0.01, "first eigenvector {:?}", &b[..f]);
    }
}
