//! Transform-coded patches, simulated (`/klt`): each deficit matrix rotated into a per-model
//! basis (the eigenvectors of the deficit's second moment on calibration tasks, a Karhunen-Loève
//! transform) and its coefficient columns quantised with bit widths from one greedy byte budget.
//!
//! The basis is a per-model constant, like the weights, so a record stores only the coefficients
//! (per column a width of 0, 2-6 or 8 bits, codes and an f16 scale per 32 tokens): rate-distortion
//! by reverse water-filling over the basis' columns, where low-rank factors pay for a per-chunk
//! basis. Quality is measured on the dequantised deficit; bytes are those of a record of that layout
//! ([`klt_fixed_bytes`] and each column's codes; `/klte` Huffman-codes the codes and the width
//! map where that is shorter).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

use half::f16;
use kamera_ops::{INT4_GROUP, KvLayout, LayerPatch, LowRank, Mat, Patch, PatchConfig, RankPolicy, Svd};
use serde::{Deserialize, Serialize};

use crate::deficit::ChunkDeficit;
use crate::error::{Error, OpsCtx, Result};
use crate::run::{EvalConfig, Evaluator};
use crate::task::Task;

/// The bit widths a coefficient column may take (index = its 4-bit width code in a record).
pub const WIDTHS: [usize; 7] = [0, 2, 3, 4, 5, 6, 8];

/// Clip ratios tried per group of 32 for widths up to 4 bits (the scale is `ratio · max|x| / qmax`,
/// the one with the least squared error wins): coarse codes lose less to clipping a few large
/// values than to rounding all the others.
const CLIPS: [f32; 4] = [1.0, 0.85, 0.7, 0.55];

/// One value per K and per V column (or entry) of a layer.
type KvPair<T> = (Vec<T>, Vec<T>);

/// The header of a basis file (its first line, JSON; the f32 little-endian bases follow).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BasisHeader {
    /// The model the basis was measured on (as named on the command line).
    pub model: String,
    /// The calibration tasks' ids.
    pub tasks: Vec<String>,
    pub layers: usize,
    pub k_features: usize,
    pub v_features: usize,
}

/// Per layer, the K and V second moments ΔᵀΔ summed over the calibration chunks (`features x
/// features`, what the file holds) and their bases: row j the j-th eigenvector, by descending
/// eigenvalue.
#[derive(Debug, Clone, PartialEq)]
pub struct DeficitBasis {
    pub header: BasisHeader,
    pub grams: Vec<(Vec<f32>, Vec<f32>)>,
    pub layers: Vec<(Vec<f32>, Vec<f32>)>,
}

fn invalid(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Invalid {
        op,
        detail: detail.into(),
    }
}

impl DeficitBasis {
    /// Checks the basis against a patch layout.
    pub fn check(&self, layout: &KvLayout) -> Result<()> {
        let h = &self.header;
        if h.layers != layout.n_layers || h.k_features != layout.k_features() || h.v_features != layout.v_features() {
            return Err(invalid(
                "deficit basis",
                format!(
                    "basis of {} layers x ({}, {}) features (model {}) for a model of {} layers x ({}, {}): measured on another model?",
                    h.layers,
                    h.k_features,
                    h.v_features,
                    h.model,
                    layout.n_layers,
                    layout.k_features(),
                    layout.v_features()
                ),
            ));
        }
        Ok(())
    }

    /// The basis of `grams` (per layer, K and V, full symmetric `f x f`).
    pub fn from_grams(header: BasisHeader, grams: Vec<(Vec<f32>, Vec<f32>)>) -> Result<DeficitBasis> {
        let (kf, vf) = (header.k_features, header.v_features);
        let layers = grams
            .iter()
            .map(|(gk, gv)| Ok((eigenbasis(gk, kf, None)?, eigenbasis(gv, vf, None)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeficitBasis { header, grams, layers })
    }

    /// Writes the header line and the second moments (f32 little-endian, layer by layer, K then
    /// V).
    pub fn save(&self, path: &Path) -> Result<()> {
        let io = |e: std::io::Error| invalid("deficit basis", format!("writing {}: {e}", path.display()));
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        let head = serde_json::to_string(&self.header).map_err(|e| invalid("deficit basis", e.to_string()))?;
        writeln!(out, "{head}").map_err(io)?;
        for (k, v) in &self.grams {
            for x in k.iter().chain(v) {
                out.write_all(&x.to_le_bytes()).map_err(io)?;
            }
        }
        out.flush().map_err(io)
    }

    /// Reads a file written by [`DeficitBasis::save`], checking its length and that every value
    /// is finite.
    pub fn load(path: &Path) -> Result<DeficitBasis> {
        let io = |e: std::io::Error| invalid("deficit basis", format!("reading {}: {e}", path.display()));
        let mut r = BufReader::new(std::fs::File::open(path).map_err(io)?);
        let mut line = String::new();
        r.read_line(&mut line).map_err(io)?;
        let header: BasisHeader = serde_json::from_str(line.trim_end()).map_err(|e| {
            invalid(
                "deficit basis",
                format!("{}: the first line is not a basis header ({e})", path.display()),
            )
        })?;
        let mut bytes = Vec::new();
        r.read_to_end(&mut bytes).map_err(io)?;
        let (kk, vv) = (
            header.k_features * header.k_features,
            header.v_features * header.v_features,
        );
        let want = header.layers * (kk + vv) * 4;
        if bytes.len() != want {
            return Err(invalid(
                "deficit basis",
                format!(
                    "{}: {} bytes of bases, {want} expected from its header",
                    path.display(),
                    bytes.len()
                ),
            ));
        }
        let vals: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if let Some(i) = vals.iter().position(|x| !x.is_finite()) {
            return Err(invalid(
                "deficit basis",
                format!("{}: value {i} is not finite", path.display()),
            ));
        }
        let grams = vals
            .chunks_exact(kk + vv)
            .map(|l| (l[..kk].to_vec(), l[kk..].to_vec()))
            .collect();
        DeficitBasis::from_grams(header, grams)
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

/// The eigenvectors of the symmetric PSD `gram` (`f x f`), or of D^½ · gram · D^½ with `cols` the
/// diagonal D (a per-model metric on the features), as rows by descending eigenvalue (the right
/// singular vectors of its SVD).
fn eigenbasis(gram: &[f32], f: usize, cols: Option<&[f32]>) -> Result<Vec<f32>> {
    let mut g = gram.to_vec();
    if let Some(c) = cols {
        for i in 0..f {
            for j in 0..f {
                g[i * f + j] *= (c[i] * c[j]).sqrt();
            }
        }
    }
    let s = Svd::compute(&Mat::from_f32(f, f, g).ops("gram")?).ops("eigenbasis")?;
    let lr = s.truncate(f, kamera_ops::DType::F32).ops("eigenbasis")?;
    Ok(lr.wt.to_f32_vec())
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
    DeficitBasis::from_grams(
        BasisHeader {
            model: model_name.to_string(),
            tasks: tasks.iter().map(|t| t.id.clone()).collect(),
            layers: layout.n_layers,
            k_features: kf,
            v_features: vf,
        },
        grams,
    )
}

/// A record's bytes besides its width map and columns: kamera-store's header (80) and checksum
/// (16), and the basis' fingerprint (8).
const RECORD_BYTES: usize = 80 + 16 + 8;

/// Record bytes of a `/klt` patch without its columns: [`RECORD_BYTES`] and per matrix a 4-bit
/// code per column (3 bits of width, 1 bit Huffman or fixed); `/klte` codes that map instead.
pub fn klt_fixed_bytes(layout: &KvLayout) -> usize {
    RECORD_BYTES + (layout.n_layers * (layout.k_features() + layout.v_features())).div_ceil(2)
}

/// `x` quantised to `bits`-bit symmetric codes with an f16 scale per group of 32 (the clip ratio
/// with the least weighted squared error per group): the dequantised values, that error, and the
/// codes.
fn quantise_column(x: &[f32], w: Option<&[f32]>, bits: usize) -> (Vec<f32>, f64, Vec<i32>) {
    let wt = |i: usize| w.map_or(1.0, |w| w[i] as f64);
    let mut codes = vec![0i32; x.len()];
    if bits == 0 {
        let e = x.iter().enumerate().map(|(i, &v)| wt(i) * (v as f64).powi(2)).sum();
        return (vec![0.0; x.len()], e, codes);
    }
    let qmax = ((1i32 << (bits - 1)) - 1) as f32;
    let clips: &[f32] = if bits <= 4 { &CLIPS } else { &CLIPS[..1] };
    let mut out = vec![0f32; x.len()];
    let mut total = 0.0;
    for (g, xs) in x.chunks(INT4_GROUP).enumerate() {
        let base = g * INT4_GROUP;
        let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        if max == 0.0 {
            continue;
        }
        let mut best: Option<(f64, f32)> = None;
        for &c in clips {
            let s = f16::from_f32(c * max / qmax).to_f32();
            if s <= 0.0 || !s.is_finite() {
                continue;
            }
            let e: f64 = xs
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let q = (v / s).round().clamp(-qmax, qmax) * s;
                    wt(base + i) * ((v - q) as f64).powi(2)
                })
                .sum();
            if best.is_none_or(|(be, _)| e < be) {
                best = Some((e, s));
            }
        }
        let Some((e, s)) = best else {
            total += xs
                .iter()
                .enumerate()
                .map(|(i, &v)| wt(base + i) * (v as f64).powi(2))
                .sum::<f64>();
            continue;
        };
        total += e;
        for (i, &v) in xs.iter().enumerate() {
            let c = (v / s).round().clamp(-qmax, qmax);
            codes[base + i] = c as i32;
            out[base + i] = c * s;
        }
    }
    (out, total, codes)
}

/// Bits of `codes` (symbols −qmax..=qmax) Huffman-coded: a 4-bit code length per symbol of the
/// alphabet, then the codes; `None` where a length would pass 15 (the column stays fixed-width).
fn huffman_bits(codes: &[i32], qmax: i32) -> Option<usize> {
    let size = (2 * qmax + 1) as usize;
    let mut counts = vec![0usize; size];
    for &c in codes {
        counts[(c + qmax) as usize] += 1;
    }
    // Merge the two lightest groups until one is left; each merge deepens its symbols by one.
    let mut groups: Vec<(usize, Vec<usize>)> = (0..size)
        .filter(|&i| counts[i] > 0)
        .map(|i| (counts[i], vec![i]))
        .collect();
    let mut depth = vec![0usize; size];
    if groups.len() == 1 {
        depth[groups[0].1[0]] = 1;
    }
    while groups.len() > 1 {
        groups.sort_by_key(|g| std::cmp::Reverse(g.0));
        let (wa, a) = groups.pop().expect("two groups");
        let (wb, b) = groups.pop().expect("two groups");
        for &i in a.iter().chain(&b) {
            depth[i] += 1;
        }
        groups.push((wa + wb, [a, b].concat()));
    }
    if depth.iter().any(|&d| d > 15) {
        return None;
    }
    Some(4 * size + counts.iter().zip(&depth).map(|(c, d)| c * d).sum::<usize>())
}

/// Bytes of one coefficient column of `codes` at `bits` bits, an f16 scale per group of 32 and the
/// codes, fixed-width or (`huffman`, where shorter) Huffman-coded (then also `true`); nothing at
/// 0 bits.
fn column_bytes(codes: &[i32], bits: usize, huffman: bool) -> (usize, bool) {
    if bits == 0 {
        return (0, false);
    }
    let n = codes.len();
    let fixed = (n * bits).div_ceil(8);
    let coded = if huffman {
        huffman_bits(codes, (1 << (bits - 1)) - 1)
            .map(|b| b.div_ceil(8))
            .filter(|&b| b < fixed)
    } else {
        None
    };
    (coded.unwrap_or(fixed) + 2 * n.div_ceil(INT4_GROUP), coded.is_some())
}

/// One way to store a coefficient column: its width, whether its codes are Huffman-coded, and
/// the weighted error and record bytes that costs.
#[derive(Clone, Copy)]
struct Coding {
    bits: usize,
    huffman: bool,
    err: f64,
    bytes: i64,
}

impl Coding {
    /// The column's symbol in the record's width map: width index, then 1 bit Huffman or fixed.
    fn symbol(&self) -> i32 {
        let w = WIDTHS.iter().position(|&b| b == self.bits).expect("a known width") as i32;
        w * 2 + self.huffman as i32
    }
}

/// The codings a column may take: each width of [`WIDTHS`] (0 bits first), its codes
/// Huffman-coded with `entropy` where that is shorter.
fn codings(x: &[f32], rows: Option<&[f32]>, entropy: bool) -> Vec<Coding> {
    WIDTHS
        .iter()
        .map(|&bits| {
            let (_, err, codes) = quantise_column(x, rows, bits);
            let (bytes, huffman) = column_bytes(&codes, bits, entropy);
            Coding {
                bits,
                huffman,
                err,
                bytes: bytes as i64,
            }
        })
        .collect()
}

/// Bytes of a record's width map: each column's 4-bit [`Coding::symbol`], or with `entropy` those
/// symbols Huffman-coded (a length table of 4 bits per symbol, then the codes) where shorter,
/// after a byte saying which.
fn width_map_bytes(symbols: &[i32], entropy: bool) -> usize {
    let fixed = symbols.len().div_ceil(2);
    if !entropy {
        return fixed;
    }
    let half = WIDTHS.len() as i32;
    let shifted: Vec<i32> = symbols.iter().map(|s| s - half).collect();
    1 + huffman_bits(&shifted, half).map_or(fixed, |b| b.div_ceil(8).min(fixed))
}

/// One coefficient column in the budget's greedy.
struct Column {
    /// Gain per unit of (weighted) squared error: the matrix's budget gain.
    gain: f64,
    /// The codings it may take ([`codings`]), the first at 0 bits.
    opts: Vec<Coding>,
    at: usize,
    version: u32,
}

impl Column {
    /// The change of coding with the most error removed per byte that fits in `left` bytes:
    /// (gain per byte, coding index); one that costs no bytes (a Huffman-coded width can be
    /// shorter than a narrower one) is free.
    fn best(&self, left: i64) -> Option<(f64, usize)> {
        let now = &self.opts[self.at];
        self.opts
            .iter()
            .enumerate()
            .filter(|(_, o)| o.err < now.err && o.bytes - now.bytes <= left)
            .map(|(t, o)| {
                let gain = self.gain * (now.err - o.err);
                let cost = o.bytes - now.bytes;
                (if cost <= 0 { f64::INFINITY } else { gain / cost as f64 }, t)
            })
            .filter(|(r, _)| *r > 0.0)
            .max_by(|a, b| a.0.total_cmp(&b.0))
    }

    fn coding(&self) -> &Coding {
        &self.opts[self.at]
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

/// Width indices per column: the greedy buys, across every column of every matrix, the upgrade
/// with the most gain-weighted error removed per byte until `budget` bytes are spent.
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
        if cost > left {
            // Stale against what is left: the best upgrade that still fits, if any.
            c.version += 1;
            if let Some((r, t)) = c.best(left) {
                heap.push(Cand(r, i, t, c.version));
            }
            continue;
        }
        left -= cost;
        c.at = t;
        c.version += 1;
        if let Some((r, t)) = c.best(left) {
            heap.push(Cand(r, i, t, c.version));
        }
    }
}

/// The transform-coded patch of one chunk and its record bytes. `cfg` holds the byte budget
/// (`Budget`, or `BudgetGains` with its layer gains set); `weights` may weigh each matrix's token
/// rows, and its feature columns by a per-model metric D (`wq=cal`, `o`): the matrix is then coded
/// as Δ·D^½ in the eigenbasis of D^½·ΔᵀΔ·D^½, and read back times D^-½.
pub(crate) fn klt_patch(
    deficit: &ChunkDeficit,
    cfg: &PatchConfig,
    basis: &DeficitBasis,
    entropy: bool,
) -> Result<(Patch, usize)> {
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
    let mut mats = Vec::with_capacity(2 * svds.len());
    let mut bases = Vec::with_capacity(2 * svds.len());
    for (l, (sk, sv)) in svds.iter().enumerate() {
        for (ch, s, f) in [(0, sk, kf), (1, sv, vf)] {
            let mw = weights.map(|w| if ch == 0 { &w.layers[l].0 } else { &w.layers[l].1 });
            let rows = mw.and_then(|m| m.rows.clone());
            let dcols = mw.and_then(|m| m.cols.as_deref());
            let (gram, plain) = if ch == 0 {
                (&basis.grams[l].0, &basis.layers[l].0)
            } else {
                (&basis.grams[l].1, &basis.layers[l].1)
            };
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
                let b = &b;
                // C[:, j] = Δ b_j, column-major.
                let mut c = vec![0f32; n * f];
                for j in 0..f {
                    let bj = &b[j * f..(j + 1) * f];
                    for i in 0..n {
                        let row = &d[i * f..(i + 1) * f];
                        c[j * n + i] = row.iter().zip(bj).map(|(x, y)| x * y).sum();
                    }
                }
                Some(c)
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
            mats.push((coeffs, rows, f, gain));
        }
    }
    let mut cols = Vec::new();
    let mut owner = Vec::new();
    for (m, (coeffs, rows, f, gain)) in mats.iter().enumerate() {
        let Some(c) = coeffs else { continue };
        for j in 0..*f {
            cols.push(Column {
                gain: *gain,
                opts: codings(&c[j * n..(j + 1) * n], rows.as_deref(), entropy),
                at: 0,
                version: 0,
            });
            owner.push((m, j));
        }
    }
    // Every column of every matrix has a symbol in the width map (0 bits where not coded).
    let n_cols = layout.n_layers * (kf + vf);
    let map = |cols: &[Column]| {
        let mut symbols = vec![0i32; n_cols];
        let mut base = vec![0usize; mats.len()];
        for m in 1..mats.len() {
            base[m] = base[m - 1] + mats[m - 1].2;
        }
        for (c, &(m, j)) in cols.iter().zip(&owner) {
            symbols[base[m] + j] = c.coding().symbol();
        }
        width_map_bytes(&symbols, entropy)
    };
    let total =
        |cols: &[Column]| RECORD_BYTES + map(cols) + cols.iter().map(|c| c.coding().bytes as usize).sum::<usize>();
    let budget = (fraction * kv_bytes as f64).floor() as usize;
    // Allocate against the map's 4-bit bound, then spend what an entropy-coded map leaves, undoing
    // a round that would pass the budget.
    let bound = klt_fixed_bytes(layout) + entropy as usize;
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
    let bytes = total(&cols);
    let mut codings: Vec<KvPair<Option<Coding>>> = vec![(vec![None; kf], vec![None; vf]); svds.len()];
    for (c, &(m, j)) in cols.iter().zip(&owner) {
        let w = &mut codings[m / 2];
        let slot = if m % 2 == 0 { &mut w.0[j] } else { &mut w.1[j] };
        *slot = Some(*c.coding()).filter(|c| c.bits > 0);
    }
    let mut layers = Vec::with_capacity(svds.len());
    for (l, (ck, cv)) in codings.iter().enumerate() {
        let lr = |m: usize, cs: &[Option<Coding>], f: usize| -> Result<LowRank> {
            let (coeffs, rows, _, _) = &mats[m];
            let b = &bases[m];
            let used: Vec<(usize, Coding)> = (0..f).filter_map(|j| cs[j].map(|c| (j, c))).collect();
            let r = used.len();
            let mut p = vec![0f32; n * r];
            let mut wt = Vec::with_capacity(r * f);
            for (k, &(j, cd)) in used.iter().enumerate() {
                let c = coeffs.as_ref().expect("a matrix with widths has coefficients");
                let (q, _, _) = quantise_column(&c[j * n..(j + 1) * n], rows.as_deref(), cd.bits);
                for (i, v) in q.into_iter().enumerate() {
                    p[i * r + k] = v;
                }
                wt.extend_from_slice(&b[j * f..(j + 1) * f]);
            }
            Ok(LowRank {
                p: Mat::from_f32(n, r, p).ops("klt coefficients")?,
                wt: Mat::from_f32(r, f, wt).ops("klt basis")?,
                spectrum: vec![],
            })
        };
        layers.push(LayerPatch {
            k: lr(2 * l, ck, kf)?,
            v: lr(2 * l + 1, cv, vf)?,
        });
    }
    let patch = Patch::new(*layout, n, layers).ops("klt patch")?;
    Ok((patch, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(layers: usize, f: usize) -> KvLayout {
        KvLayout::mha(layers, 1, f)
    }

    fn identity(f: usize) -> Vec<f32> {
        (0..f * f).map(|i| if i % (f + 1) == 0 { 1.0 } else { 0.0 }).collect()
    }

    fn seeded(n: usize, f: usize, seed: u64) -> Vec<f32> {
        let mut r = crate::Rng::new(seed);
        (0..n * f)
            .map(|_| (r.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }

    #[test]
    fn quantising_a_column_rounds_within_half_a_step() {
        let x: Vec<f32> = (0..70).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.1).collect();
        for bits in [2, 3, 4, 5, 6, 8] {
            let (q, e, codes) = quantise_column(&x, None, bits);
            assert_eq!(codes.len(), x.len());
            let direct: f64 = x.iter().zip(&q).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
            assert!(
                (e - direct).abs() <= 1e-9 * (1.0 + direct),
                "bits {bits}: {e} vs {direct}"
            );
            if bits >= 5 {
                let step = 1.1 / ((1 << (bits - 1)) - 1) as f32;
                assert!(
                    x.iter().zip(&q).all(|(a, b)| (a - b).abs() <= 0.5 * step * 1.01),
                    "bits {bits}"
                );
            }
        }
        let errs: Vec<f64> = [2, 3, 4, 6, 8]
            .iter()
            .map(|&b| quantise_column(&x, None, b).1)
            .collect();
        // Huffman: a peaked column codes in fewer bits than its width, a flat one never in more.
        let peaked: Vec<i32> = (0..300).map(|i| if i % 10 == 0 { 1 } else { 0 }).collect();
        assert_eq!(huffman_bits(&peaked, 1), Some(4 * 3 + 300));
        assert!(column_bytes(&peaked, 2, true).0 < column_bytes(&peaked, 2, false).0);
        let flat: Vec<i32> = (0..300).map(|i| (i % 255) - 127).collect();
        assert_eq!(column_bytes(&flat, 8, true), column_bytes(&flat, 8, false));
        // A width map of mostly empty columns codes in under a bit each.
        let map: Vec<i32> = (0..400).map(|i| if i % 8 == 0 { 7 } else { 0 }).collect();
        assert!(
            width_map_bytes(&map, true) < 400 / 8 + 10,
            "{}",
            width_map_bytes(&map, true)
        );
        assert_eq!(width_map_bytes(&map, false), 200);
        assert!(errs.windows(2).all(|w| w[1] < w[0]), "more bits, less error: {errs:?}");
    }

    #[test]
    fn the_greedy_spends_within_the_budget_and_favours_energy_and_gain() {
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
        let basis = DeficitBasis {
            header: BasisHeader {
                model: "test".into(),
                tasks: vec![],
                layers: 2,
                k_features: f,
                v_features: f,
            },
            grams: vec![(identity(f), identity(f)); 2],
            layers: vec![(identity(f), identity(f)); 2],
        };
        let kv = 100_000;
        let chunk = ChunkDeficit::plain(&svds, n, &lay, kv);
        let cfg = PatchConfig {
            rank: RankPolicy::Budget { fraction: 0.004 },
            ..PatchConfig::fixed(0, kamera_ops::DType::F32)
        };
        let (patch, bytes) = klt_patch(&chunk, &cfg, &basis, false).unwrap();
        assert!(bytes <= 400, "{bytes} bytes over the budget of 400");
        let (_, coded) = klt_patch(&chunk, &cfg, &basis, true).unwrap();
        assert!(coded <= 400, "{coded} bytes Huffman-coded over the budget of 400");
        assert!(patch.layers()[0].k.rank() >= 1, "the energetic column is bought first");
        // Its reconstruction is within 8-bit-ish error of the column.
        let d = svds[0].0.truncate(f, kamera_ops::DType::F32).unwrap().dense();
        let r = patch.layers()[0].k.dense();
        let col_err: f32 = (0..n).map(|i| (d[i * f] - r[i * f]).powi(2)).sum();
        let col_energy: f32 = (0..n).map(|i| d[i * f].powi(2)).sum();
        assert!(col_err < 0.01 * col_energy, "{col_err} of {col_energy}");
        // A large budget holds everything closely.
        let cfg = PatchConfig {
            rank: RankPolicy::Budget { fraction: 1.0 },
            ..PatchConfig::fixed(0, kamera_ops::DType::F32)
        };
        let (patch, bytes) = klt_patch(&chunk, &cfg, &basis, false).unwrap();
        let column = n + 2 * n.div_ceil(INT4_GROUP);
        assert_eq!(bytes, klt_fixed_bytes(&lay) + 4 * f * column, "every column at 8 bits");
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

    #[test]
    fn a_basis_file_round_trips_and_bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("kamera-klt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("basis.bin");
        let header = BasisHeader {
            model: "m".into(),
            tasks: vec!["t1".into()],
            layers: 1,
            k_features: 2,
            v_features: 3,
        };
        let grams = vec![(vec![2.0, 1.0, 1.0, 3.0], identity(3))];
        let basis = DeficitBasis::from_grams(header, grams).unwrap();
        basis.save(&path).unwrap();
        assert_eq!(DeficitBasis::load(&path).unwrap(), basis);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let e = DeficitBasis::load(&path).unwrap_err().to_string();
        assert!(e.contains("expected from its header"), "{e}");
        assert!(
            basis
                .check(&layout(2, 2))
                .unwrap_err()
                .to_string()
                .contains("another model")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
