//! Transform-coded patches (KAMERA.md, "The operator": the patch term, coded in a per-model
//! Karhunen-Loève basis): each deficit matrix rotated into the model's [`PatchBasis`] and its
//! coefficient columns given 0-8 bits by one greedy byte budget over every layer's columns (reverse
//! water-filling); a record stores the codes, never the basis.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use rayon::prelude::*;

use crate::basis::{BasisFp, PatchBasis};
use crate::coding::{CodedColumn, WIDTHS, choose_huffman, map_bytes, quantise_column, read_map, symbol, write_map};
use crate::deficit::Deficit;
use crate::error::{Result, invalid, shape};
use crate::layout::KvLayout;
use crate::patch::{LayerPatch, Patch, RankPolicy};
use crate::svd::LowRank;
use crate::tensor::Mat;

/// The smallest KL sensitivity a layer gets (of the blind KL) when a basis' sensitivities weigh
/// the budget: a layer measured at ~0 still gets columns where its deficit is large.
pub const SENSITIVITY_FLOOR: f64 = 0.005;

/// A matrix's gain in a sensitivity-weighted budget: its layer's KL sensitivity `s` (floored at
/// [`SENSITIVITY_FLOOR`]) over its deficit energy, so each unit of error counts as its share of
/// the KL that leaving the matrix uncorrected costs (0 for a matrix without deficit).
pub fn sensitivity_gain(s: f64, energy: f64) -> f64 {
    if energy > 0.0 {
        s.max(SENSITIVITY_FLOOR) / energy
    } else {
        0.0
    }
}

/// Transform coding in a patch configuration: the model's basis, and whether codes and the width
/// map are Huffman-coded where shorter.
#[derive(Debug, Clone, PartialEq)]
pub struct BasisCoding {
    pub basis: Arc<PatchBasis>,
    pub entropy: bool,
}

/// The stored form of a transform-coded patch: the basis' fingerprint, then per matrix
/// (layer-major, K then V) its coded columns by ascending basis index.
#[derive(Debug, Clone, PartialEq)]
pub struct BasisCode {
    pub basis: BasisFp,
    pub entropy: bool,
    pub n_tokens: usize,
    /// Features of K's and of V's matrices.
    pub features: [usize; 2],
    pub mats: Vec<Vec<CodedColumn>>,
}

impl BasisCode {
    /// Symbols of the width map: one per basis column of every matrix.
    fn symbols(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for (m, cols) in self.mats.iter().enumerate() {
            let mut s = vec![0usize; self.features[m % 2]];
            cols.iter().for_each(|c| s[c.index as usize] = c.symbol());
            out.extend(s);
        }
        out
    }
    /// Stored bytes: fingerprint, width map, columns.
    pub fn bytes(&self) -> usize {
        8 + map_bytes(&self.symbols(), self.entropy) + self.mats.iter().flatten().map(CodedColumn::bytes).sum::<usize>()
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.basis.0);
        write_map(out, &self.symbols(), self.entropy);
        self.mats.iter().flatten().for_each(|c| c.write(out));
    }
    /// Reads a code written by [`BasisCode::write`] for `n_tokens` tokens of `layout`; every byte
    /// must be used.
    pub fn read(mut r: &[u8], layout: &KvLayout, n_tokens: usize, entropy: bool) -> Result<BasisCode> {
        const OP: &str = "coded patch";
        if r.len() < 8 {
            return Err(invalid(
                OP,
                "payload",
                format!("{} bytes, shorter than a basis fingerprint", r.len()),
            ));
        }
        let mut fp = [0u8; 8];
        fp.copy_from_slice(&r[..8]);
        r = &r[8..];
        let features = [layout.k_features(), layout.v_features()];
        let n_mats = 2 * layout.n_layers;
        let symbols = read_map(&mut r, layout.n_layers * (features[0] + features[1]), entropy)?;
        let mut mats = Vec::with_capacity(n_mats);
        let mut at = 0;
        for m in 0..n_mats {
            let f = features[m % 2];
            let mut cols = Vec::new();
            for (j, &s) in symbols[at..at + f].iter().enumerate() {
                let bits = WIDTHS[s / 2];
                if bits > 0 {
                    cols.push(CodedColumn::read(&mut r, n_tokens, j as u16, bits, s % 2 == 1)?);
                }
            }
            at += f;
            mats.push(cols);
        }
        if !r.is_empty() {
            return Err(invalid(OP, "payload", format!("{} trailing bytes", r.len())));
        }
        Ok(BasisCode {
            basis: BasisFp(fp),
            entropy,
            n_tokens,
            features,
            mats,
        })
    }
}

impl Patch {
    /// The patch a code stands for in `basis` (per matrix, layer-major K then V, its `f x f`
    /// rows): per matrix P the dequantised columns, Wᵀ the basis rows they multiply.
    pub fn from_code(layout: KvLayout, code: BasisCode, basis: &[Vec<f32>]) -> Result<Patch> {
        const OP: &str = "Patch::from_code";
        let n = code.n_tokens;
        if code.mats.len() != 2 * layout.n_layers || basis.len() != code.mats.len() {
            return Err(shape(
                OP,
                "code / basis matrices",
                2 * layout.n_layers,
                format!("{} / {}", code.mats.len(), basis.len()),
            ));
        }
        if code.features != [layout.k_features(), layout.v_features()] {
            return Err(shape(
                OP,
                "code features",
                format!("{:?}", [layout.k_features(), layout.v_features()]),
                format!("{:?}", code.features),
            ));
        }
        let factor = |m: usize| -> Result<LowRank> {
            let (cols, f) = (&code.mats[m], code.features[m % 2]);
            if basis[m].len() != f * f {
                return Err(shape(OP, format!("basis matrix {m}"), f * f, basis[m].len()));
            }
            let r = cols.len();
            let mut p = vec![0f32; n * r];
            let mut wt = Vec::with_capacity(r * f);
            for (k, c) in cols.iter().enumerate() {
                let j = c.index as usize;
                if j >= f {
                    return Err(shape(OP, format!("matrix {m} column index"), format!("< {f}"), j));
                }
                c.check(OP, n).map_err(|e| match e {
                    crate::Error::Invalid { what, detail, .. } => invalid(OP, what, format!("matrix {m}: {detail}")),
                    e => e,
                })?;
                if k > 0 && cols[k - 1].index >= c.index {
                    return Err(invalid(
                        OP,
                        "coded column",
                        format!("matrix {m}: columns out of order at {j}"),
                    ));
                }
                c.values().into_iter().enumerate().for_each(|(i, v)| p[i * r + k] = v);
                wt.extend_from_slice(&basis[m][j * f..(j + 1) * f]);
            }
            Ok(LowRank {
                p: Mat::from_f32(n, r, p)?,
                wt: Mat::from_f32(r, f, wt)?,
                spectrum: Vec::new(),
            })
        };
        let layers = (0..layout.n_layers)
            .map(|l| {
                Ok(LayerPatch {
                    k: factor(2 * l)?,
                    v: factor(2 * l + 1)?,
                })
            })
            .collect::<Result<_>>()?;
        let mut p = Patch::new(layout, n, layers)?;
        p.set_code(code);
        Ok(p)
    }
}

/// One matrix to code: its coefficients (column-major `n x features`; `None` without deficit),
/// optional per-token weights of the error, and the gain its error counts with in the budget.
pub struct Coefficients {
    pub values: Option<Vec<f32>>,
    pub rows: Option<Vec<f32>>,
    pub features: usize,
    pub gain: f64,
}

/// The transform-coded patch of deficit `d` in `coding`'s basis: `rank` a byte budget
/// (`Budget`, layers weighed by the basis' sensitivities s_l as s_l/‖Δ_l‖² when it has them, or
/// `BudgetGains`) over the patch's stored bytes, a fraction of `kv_bytes`.
pub fn transform_patch(
    d: &Deficit,
    layout: &KvLayout,
    kv_bytes: usize,
    rank: &RankPolicy,
    coding: &BasisCoding,
) -> Result<Patch> {
    const OP: &str = "transform_patch";
    let basis = &coding.basis;
    basis.check(OP, layout)?;
    if d.layers.len() != layout.n_layers {
        return Err(shape(OP, "deficit layers", layout.n_layers, d.layers.len()));
    }
    // Per matrix (layer-major, K then V): its values and deficit energy, read once.
    let dense: Vec<(Vec<f32>, f64)> = d
        .layers
        .iter()
        .flat_map(|(k, v)| [k, v])
        .map(|m| {
            let x = m.to_f32_vec();
            let e = x.iter().map(|&v| (v as f64).powi(2)).sum();
            (x, e)
        })
        .collect();
    let (fraction, gains): (f64, Vec<(f64, f64)>) = match rank {
        RankPolicy::Budget { fraction } => {
            let gains = match basis.sensitivity() {
                Some(s) => s
                    .iter()
                    .enumerate()
                    .map(|(l, &(sk, sv))| {
                        (
                            sensitivity_gain(sk, dense[2 * l].1),
                            sensitivity_gain(sv, dense[2 * l + 1].1),
                        )
                    })
                    .collect(),
                None => vec![(1.0, 1.0); layout.n_layers],
            };
            (*fraction, gains)
        }
        RankPolicy::BudgetGains { fraction, gains } if gains.len() == layout.n_layers => (*fraction, gains.clone()),
        other => {
            return Err(invalid(
                OP,
                "rank policy",
                format!("transform coding needs a byte budget, not {other:?}"),
            ));
        }
    };
    if !(fraction.is_finite() && fraction >= 0.0) {
        return Err(invalid(
            OP,
            "budget fraction",
            format!("{fraction} must be finite and >= 0"),
        ));
    }
    let n = d.n_tokens();
    let mats: Vec<Coefficients> = dense
        .iter()
        .enumerate()
        .map(|(m, (x, e))| {
            let (l, f) = (m / 2, [layout.k_features(), layout.v_features()][m % 2]);
            Coefficients {
                values: (*e > 0.0).then(|| coefficients(x, n, f, &basis.mats()[m])),
                rows: None,
                features: f,
                gain: if m % 2 == 0 { gains[l].0 } else { gains[l].1 },
            }
        })
        .collect();
    let budget = (fraction * kv_bytes as f64).floor() as usize;
    let code = code_coefficients(&mats, n, budget, coding.entropy, basis.fp());
    Patch::from_code(*layout, code, basis.mats())
}

/// Cᵀ = B Δᵀ for Δ (`n x f`, row-major) and basis rows B: C column-major, column j = Δ b_j, each
/// entry one sequential f32 dot product (the coder's discrete choices are sensitive to rounding:
/// a blocked GEMM's summation order moved Gemma's measured gap by 0.002, bench/eval/README.md).
pub fn coefficients(d: &[f32], n: usize, f: usize, b: &[f32]) -> Vec<f32> {
    let mut c = vec![0f32; f * n];
    c.par_chunks_mut(n.max(1))
        .zip(b.par_chunks(f.max(1)))
        .for_each(|(cj, bj)| {
            for (i, x) in cj.iter_mut().enumerate() {
                *x = d[i * f..(i + 1) * f].iter().zip(bj).map(|(x, y)| x * y).sum();
            }
        });
    c
}

/// One way to store a column: its width, Huffman or not, weighted error and bytes.
#[derive(Clone, Copy)]
struct Coding {
    bits: u8,
    huffman: bool,
    err: f64,
    bytes: i64,
}

/// One column in the greedy: its gain, the codings it may take (0 bits first), the current one.
struct Column {
    gain: f64,
    opts: Vec<Coding>,
    at: usize,
    version: u32,
}

impl Column {
    /// The change of coding with the most error removed per byte that fits in `left` bytes; one
    /// that costs no bytes (a Huffman-coded width can be shorter than a narrower one) is free.
    fn best(&self, left: i64) -> Option<(f64, usize)> {
        let now = &self.opts[self.at];
        self.opts
            .iter()
            .enumerate()
            .filter(|(_, o)| o.err < now.err && o.bytes - now.bytes <= left)
            .map(|(t, o)| {
                let (gain, cost) = (self.gain * (now.err - o.err), o.bytes - now.bytes);
                (if cost <= 0 { f64::INFINITY } else { gain / cost as f64 }, t)
            })
            .filter(|(r, _)| *r > 0.0)
            .max_by(|a, b| a.0.total_cmp(&b.0))
    }
}

struct Cand(f64, usize, usize, u32);
impl PartialEq for Cand {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0).then(o.1.cmp(&self.1))
    }
}

/// The greedy: buys, across every column of every matrix, the upgrade with the most
/// gain-weighted error removed per byte until `budget` bytes are spent.
fn allocate(cols: &mut [Column], budget: usize) {
    let mut left = budget as i64;
    let mut heap: BinaryHeap<Cand> = cols
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.best(left).map(|(r, t)| Cand(r, i, t, c.version)))
        .collect();
    while let Some(Cand(_, i, t, v)) = heap.pop() {
        let c = &mut cols[i];
        if v != c.version {
            continue;
        }
        let cost = c.opts[t].bytes - c.opts[c.at].bytes;
        c.version += 1;
        if cost <= left {
            left -= cost;
            c.at = t;
        }
        if let Some((r, t)) = c.best(left) {
            heap.push(Cand(r, i, t, c.version));
        }
    }
}

/// Codes `mats` (layer-major, K then V) within `budget` stored bytes ([`BasisCode::bytes`]).
pub fn code_coefficients(mats: &[Coefficients], n: usize, budget: usize, entropy: bool, basis: BasisFp) -> BasisCode {
    let features = [
        mats.first().map_or(0, |m| m.features),
        mats.get(1).map_or(0, |m| m.features),
    ];
    // Every column's codings, the columns in parallel.
    let owner: Vec<(usize, usize)> = mats
        .iter()
        .enumerate()
        .filter(|(_, m)| m.values.is_some())
        .flat_map(|(m, mat)| (0..mat.features).map(move |j| (m, j)))
        .collect();
    let mut cols: Vec<Column> = owner
        .par_iter()
        .map(|&(m, j)| {
            let mat = &mats[m];
            let x = &mat.values.as_ref().expect("owned columns have values")[j * n..(j + 1) * n];
            let opts = WIDTHS
                .iter()
                .map(|&bits| {
                    let (mut col, err) = quantise_column(x, mat.rows.as_deref(), j as u16, bits);
                    let bytes = choose_huffman(&mut col, entropy) as i64;
                    Coding {
                        bits,
                        huffman: col.huffman,
                        err,
                        bytes,
                    }
                })
                .collect();
            Column {
                gain: mat.gain,
                opts,
                at: 0,
                version: 0,
            }
        })
        .collect();
    let n_cols: usize = mats.iter().map(|m| m.features).sum();
    // Each matrix's first symbol in the width map.
    let base: Vec<usize> = mats
        .iter()
        .scan(0, |at, m| {
            let b = *at;
            *at += m.features;
            Some(b)
        })
        .collect();
    let total = |cols: &[Column]| {
        let mut symbols = vec![0usize; n_cols];
        let mut bytes = 8;
        for (c, &(m, j)) in cols.iter().zip(&owner) {
            let o = &c.opts[c.at];
            symbols[base[m] + j] = symbol(o.bits, o.huffman);
            bytes += o.bytes as usize;
        }
        bytes + map_bytes(&symbols, entropy)
    };
    // Allocate against the map's 4-bit bound, then spend what an entropy-coded map leaves,
    // undoing a round that would pass the budget.
    let bound = 8 + n_cols.div_ceil(2) + entropy as usize;
    allocate(&mut cols, budget.saturating_sub(bound));
    for _ in 0..4 {
        let left = budget.saturating_sub(total(&cols));
        if !entropy || left == 0 {
            break;
        }
        let before: Vec<usize> = cols.iter().map(|c| c.at).collect();
        allocate(&mut cols, left);
        if total(&cols) > budget {
            cols.iter_mut().zip(before).for_each(|(c, at)| c.at = at);
            break;
        }
    }
    let mut out: Vec<Vec<CodedColumn>> = vec![Vec::new(); mats.len()];
    for (c, &(m, j)) in cols.iter().zip(&owner) {
        let o = &c.opts[c.at];
        if o.bits == 0 {
            continue;
        }
        let x = &mats[m].values.as_ref().expect("a column with widths has coefficients")[j * n..(j + 1) * n];
        let (mut col, _) = quantise_column(x, mats[m].rows.as_deref(), j as u16, o.bits);
        col.huffman = o.huffman;
        out[m].push(col);
    }
    BasisCode {
        basis,
        entropy,
        n_tokens: n,
        features,
        mats: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deficit::Deficit;

    fn rotation(f: usize, seed: u32) -> Vec<f32> {
        // Gram-Schmidt on a seeded matrix: an orthonormal basis that is not the identity.
        let mut x = seed as u64 * 2_654_435_761 + 1;
        let mut rows: Vec<Vec<f64>> = (0..f)
            .map(|_| {
                (0..f)
                    .map(|_| {
                        x = x
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5
                    })
                    .collect()
            })
            .collect();
        for i in 0..f {
            for k in 0..i {
                let dot: f64 = (0..f).map(|j| rows[i][j] * rows[k][j]).sum();
                for j in 0..f {
                    rows[i][j] -= dot * rows[k][j];
                }
            }
            let norm = rows[i].iter().map(|x| x * x).sum::<f64>().sqrt();
            rows[i].iter_mut().for_each(|x| *x /= norm);
        }
        rows.into_iter().flatten().map(|x| x as f32).collect()
    }

    fn deficit(n: usize, f: usize, layers: usize) -> Deficit {
        let m = |l: usize, ch: usize| {
            let v = (0..n * f)
                .map(|i| {
                    let (t, c) = (i / f, i % f);
                    ((t as f32 * 0.3 + c as f32 * 0.7 + (l * 2 + ch) as f32).sin()) * if c < 3 { 1.0 } else { 0.05 }
                })
                .collect();
            Mat::from_f32(n, f, v).unwrap()
        };
        Deficit {
            layers: (0..layers).map(|l| (m(l, 0), m(l, 1))).collect(),
        }
    }

    #[test]
    fn transform_coded_patches_keep_the_budget_round_trip_and_approach_the_deficit() {
        let (n, f, layers) = (70, 8, 2);
        let layout = KvLayout::mha(layers, 1, f);
        let basis = PatchBasis::new(
            f,
            f,
            (0..layers)
                .map(|l| (rotation(f, l as u32), rotation(f, 7 + l as u32)))
                .collect(),
            None,
        )
        .unwrap();
        let coding = BasisCoding {
            basis: Arc::new(basis),
            entropy: true,
        };
        let d = deficit(n, f, layers);
        let kv_bytes = 2 * layers * n * f * 4;
        let energy: f64 = d
            .layers
            .iter()
            .flat_map(|(k, v)| [k, v])
            .flat_map(|m| m.to_f32_vec())
            .map(|x| (x as f64).powi(2))
            .sum();
        let mut last = f64::INFINITY;
        for fraction in [0.05, 0.15, 0.4] {
            let p = transform_patch(&d, &layout, kv_bytes, &RankPolicy::Budget { fraction }, &coding).unwrap();
            assert!(
                p.bytes() as f64 <= fraction * kv_bytes as f64,
                "{} bytes at {fraction}",
                p.bytes()
            );
            let code = p.code().unwrap();
            let mut out = Vec::new();
            code.write(&mut out);
            assert_eq!(out.len(), p.bytes());
            let back = BasisCode::read(&out, &layout, n, true).unwrap();
            assert_eq!(&back, code);
            assert_eq!(Patch::from_code(layout, back, coding.basis.mats()).unwrap(), p);
            let err: f64 = d
                .layers
                .iter()
                .zip(p.layers())
                .flat_map(|((k, v), lp)| [(k, &lp.k), (v, &lp.v)])
                .map(|(m, lr)| {
                    m.to_f32_vec()
                        .iter()
                        .zip(lr.dense())
                        .map(|(a, b)| ((a - b) as f64).powi(2))
                        .sum::<f64>()
                })
                .sum();
            assert!(err < last, "more bytes, less error: {err} after {last}");
            last = err;
        }
        assert!(last < 0.01 * energy, "40% of the bytes leave {last} of {energy}");
        // Damaged payloads are refused, not misread.
        let p = transform_patch(&d, &layout, kv_bytes, &RankPolicy::Budget { fraction: 0.15 }, &coding).unwrap();
        let mut out = Vec::new();
        p.code().unwrap().write(&mut out);
        assert!(BasisCode::read(&out[..out.len() - 1], &layout, n, true).is_err());
        let mut long = out.clone();
        long.push(0);
        assert!(
            BasisCode::read(&long, &layout, n, true)
                .unwrap_err()
                .to_string()
                .contains("trailing")
        );
        // A hand-built code with an unknown width or short scales is refused by name.
        let mut bad = p.code().unwrap().clone();
        let col = bad.mats.iter_mut().flatten().next().unwrap();
        col.bits = 7;
        let e = Patch::from_code(layout, bad, coding.basis.mats())
            .unwrap_err()
            .to_string();
        assert!(e.contains("7 bits"), "{e}");
        let mut bad = p.code().unwrap().clone();
        bad.mats.iter_mut().flatten().next().unwrap().scales.pop();
        assert!(Patch::from_code(layout, bad, coding.basis.mats()).is_err());
        let other = KvLayout::mha(3, 1, f);
        assert!(transform_patch(&d, &other, kv_bytes, &RankPolicy::Budget { fraction: 0.1 }, &coding).is_err());
    }
}
