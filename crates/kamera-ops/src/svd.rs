//! Truncated SVD (faer) of a tokens x features deficit: the best rank-m approximation
//! (Eckart-Young), stored as P = U_m Σ_m (tokens x m) and W_mᵀ (m x features).

use crate::error::{Error, Result};
use crate::tensor::{DType, Mat};

/// A full thin SVD, singular values in descending order.
#[derive(Debug, Clone)]
pub struct Svd {
    rows: usize,
    cols: usize,
    /// U Σ, rows x k, row-major.
    us: Vec<f32>,
    /// Vᵀ, k x cols, row-major.
    vt: Vec<f32>,
    /// The k = min(rows, cols) singular values, descending.
    pub singular: Vec<f32>,
}

impl Svd {
    /// Decomposes an f32 view of `m`.
    pub fn compute(m: &Mat) -> Result<Svd> {
        Svd::of_rows(m.rows(), m.cols(), &m.to_f32_vec())
    }

    /// The best rank-m approximations of `m` under the weighted error
    /// Σ_ij r_i c_j (m_ij − x_ij)² with separable weights `r` (per row, e.g. per token) and `c`
    /// (per column, e.g. per feature), all finite and > 0 (`None`: all 1). Exact for separable
    /// weights: the plain SVD of diag(√r) · m · diag(√c), its factors scaled back (P rows by
    /// 1/√r, Wᵀ columns by 1/√c). The singular values (and [`Svd::tail_energy`]) are those of
    /// the weighted matrix: the weighted error of each truncation.
    pub fn compute_weighted(m: &Mat, w: &crate::weights::MatWeights) -> Result<Svd> {
        const OP: &str = "Svd::compute_weighted";
        let (rows, cols) = (m.rows(), m.cols());
        let sqrt = |ws: &Option<Vec<f32>>, len: usize, what: &str| -> Result<Option<Vec<f32>>> {
            let Some(ws) = ws else { return Ok(None) };
            if ws.len() != len {
                return Err(crate::error::shape(OP, format!("{what} weights"), len, ws.len()));
            }
            if let Some(i) = ws.iter().position(|x| !(x.is_finite() && *x > 0.0)) {
                return Err(crate::error::invalid(
                    OP,
                    "weights",
                    format!("{what} weight {i} is {} (finite and > 0 expected)", ws[i]),
                ));
            }
            Ok(Some(ws.iter().map(|x| x.sqrt()).collect()))
        };
        let (r, c) = (sqrt(&w.rows, rows, "row")?, sqrt(&w.cols, cols, "column")?);
        let mut data = m.to_f32_vec();
        for (i, row) in data.chunks_mut(cols.max(1)).enumerate() {
            let ri = r.as_ref().map_or(1.0, |r| r[i]);
            for (j, x) in row.iter_mut().enumerate() {
                *x *= ri * c.as_ref().map_or(1.0, |c| c[j]);
            }
        }
        let mut s = Svd::of_rows(rows, cols, &data)?;
        let k = s.max_rank();
        if let Some(r) = &r {
            for (i, row) in s.us.chunks_mut(k.max(1)).enumerate() {
                row.iter_mut().for_each(|x| *x /= r[i]);
            }
        }
        if let Some(c) = &c {
            for row in s.vt.chunks_mut(cols.max(1)) {
                row.iter_mut().zip(c).for_each(|(x, cj)| *x /= cj);
            }
        }
        Ok(s)
    }

    /// Decomposes a symmetric positive semi-definite matrix (a Gram matrix, a covariance): its
    /// SVD is its eigendecomposition, taken directly (faer's symmetric eigensolver on the lower
    /// triangle) rather than through the Gram matrix of a Gram matrix, whose f32 condition would
    /// be squared. Eigenvalues rounded below 0 are taken as 0.
    pub fn compute_psd(m: &Mat) -> Result<Svd> {
        const OP: &str = "Svd::compute_psd";
        let k = m.rows();
        if m.cols() != k {
            return Err(crate::error::shape(OP, "columns of a square matrix", k, m.cols()));
        }
        let data = m.to_f32_vec();
        finite(OP, k, k, &data)?;
        let eig = symmetric_eigen(OP, k, k, faer::Mat::<f32>::from_fn(k, k, |i, j| data[i * k + j]))?;
        let (e, values) = (eig.U(), eig.S().column_vector());
        let lambda: Vec<f64> = (0..k).map(|j| values[j].max(0.0) as f64).collect();
        Svd::from_directions(OP, k, k, &lambda, |i, j| e[(i, j)] * lambda[j] as f32, |c, j| e[(c, j)])
    }

    /// Decomposes a row-major `rows x cols` matrix through the eigendecomposition of its Gram
    /// matrix on the smaller side (AᵀA when rows ≥ cols, AAᵀ otherwise): A = U Σ Vᵀ gives
    /// AᵀA = V Σ² Vᵀ, so with V from the eigenvectors, U Σ = A V; the wide case is the
    /// transpose's. Each σ is the norm of its recomputed factor column (‖A v‖ or ‖Aᵀ u‖), not
    /// √λ, so the top directions keep f32 accuracy; a direction of the null space has σ = 0 and
    /// zero factors. About half the time of a bidiagonal SVD at the shapes patches take
    /// (100-400 tokens x 128-192 features).
    fn of_rows(rows: usize, cols: usize, data: &[f32]) -> Result<Svd> {
        const OP: &str = "Svd::compute";
        if rows.min(cols) == 0 {
            return Svd::from_directions(OP, rows, cols, &[], |_, _| 0.0, |_, _| 0.0);
        }
        finite(OP, rows, cols, data)?;
        let a = faer::Mat::<f32>::from_fn(rows, cols, |i, j| data[i * cols + j]);
        let tall = rows >= cols;
        // The Gram matrix on the small side and its eigenvectors (k x k).
        let gram = if tall { a.transpose() * &a } else { &a * a.transpose() };
        let eig = symmetric_eigen(OP, rows, cols, gram)?;
        let e = eig.U();
        // The other side's factor, unnormalised: A e_j (tall: σ_j u_j) or Aᵀ e_j (wide: σ_j v_j).
        let other = if tall { &a * e } else { a.transpose() * e };
        let sigma: Vec<f64> = (0..e.ncols())
            .map(|j| {
                (0..other.nrows())
                    .map(|i| (other[(i, j)] as f64).powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        if tall {
            // U Σ = A V; V = the eigenvectors.
            Svd::from_directions(OP, rows, cols, &sigma, |i, j| other[(i, j)], |c, j| e[(c, j)])
        } else {
            // U = the eigenvectors, U Σ = U · ‖Aᵀu‖; V = Aᵀ u / ‖Aᵀu‖ (0 where σ is).
            let v = |c: usize, j: usize| {
                if sigma[j] > 0.0 {
                    (other[(c, j)] as f64 / sigma[j]) as f32
                } else {
                    0.0
                }
            };
            Svd::from_directions(OP, rows, cols, &sigma, |i, j| (e[(i, j)] as f64 * sigma[j]) as f32, v)
        }
    }

    /// An SVD from its directions in any order: direction j's `sigma[j]`, (U Σ)_ij = `us(i, j)`
    /// and V_cj = `v(c, j)`; stored by descending σ. A σ that is not finite is an error.
    fn from_directions(
        op: &'static str,
        rows: usize,
        cols: usize,
        sigma: &[f64],
        us: impl Fn(usize, usize) -> f32,
        v: impl Fn(usize, usize) -> f32,
    ) -> Result<Svd> {
        if sigma.iter().any(|x| !x.is_finite()) {
            return Err(Error::Svd { op, rows, cols });
        }
        let k = sigma.len();
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by(|&x, &y| sigma[y].total_cmp(&sigma[x]));
        let mut out = Svd {
            rows,
            cols,
            us: vec![0.0f32; rows * k],
            vt: vec![0.0f32; k * cols],
            singular: order.iter().map(|&j| sigma[j] as f32).collect(),
        };
        for (jj, &j) in order.iter().enumerate() {
            for i in 0..rows {
                out.us[i * k + jj] = us(i, j);
            }
            for c in 0..cols {
                out.vt[jj * cols + c] = v(c, j);
            }
        }
        Ok(out)
    }

    /// The most directions this decomposition holds.
    pub fn max_rank(&self) -> usize {
        self.singular.len()
    }

    /// Σ_{j ≥ m} σ_j²: the squared Frobenius error of the rank-m truncation.
    pub fn tail_energy(&self, m: usize) -> f64 {
        self.singular.iter().skip(m).map(|&s| (s as f64) * (s as f64)).sum()
    }

    /// The top-`m` factors (m is capped at the max rank), stored as `dtype`.
    pub fn truncate(&self, m: usize, dtype: DType) -> Result<LowRank> {
        let k = self.max_rank();
        let m = m.min(k);
        let mut p = Vec::with_capacity(self.rows * m);
        for i in 0..self.rows {
            p.extend_from_slice(&self.us[i * k..i * k + m]);
        }
        let wt = self.vt[..m * self.cols].to_vec();
        Ok(LowRank {
            p: Mat::from_f32(self.rows, m, p)?.to_dtype(dtype),
            wt: Mat::from_f32(m, self.cols, wt)?.to_dtype(dtype),
            spectrum: self.singular.clone(),
        })
    }
}

/// An error for `op` on the `rows x cols` input `data` unless every value is finite (checked
/// before any product is formed from it).
fn finite(op: &'static str, rows: usize, cols: usize, data: &[f32]) -> Result<()> {
    if data.iter().all(|x| x.is_finite()) {
        Ok(())
    } else {
        Err(Error::Svd { op, rows, cols })
    }
}

/// faer's eigendecomposition of the symmetric `m` (its lower triangle), for `op` on a `rows x
/// cols` input.
fn symmetric_eigen(
    op: &'static str,
    rows: usize,
    cols: usize,
    m: faer::Mat<f32>,
) -> Result<faer::linalg::solvers::SelfAdjointEigen<f32>> {
    m.self_adjoint_eigen(faer::Side::Lower)
        .map_err(|_| Error::Svd { op, rows, cols })
}

/// A rank-m factorisation P Wᵀ of one deficit matrix, with that matrix's full spectrum.
#[derive(Debug, Clone, PartialEq)]
pub struct LowRank {
    /// U_m Σ_m: tokens x m.
    pub p: Mat,
    /// W_mᵀ: m x features (each direction contiguous).
    pub wt: Mat,
    /// All singular values of the deficit this was cut from (diagnostics: energy in the top r).
    pub spectrum: Vec<f32>,
}

impl LowRank {
    pub fn rank(&self) -> usize {
        self.p.cols()
    }
    /// Bytes of P and Wᵀ.
    pub fn bytes(&self) -> usize {
        self.p.bytes() + self.wt.bytes()
    }
    /// Share of the deficit's squared energy held by the top `r` directions.
    pub fn energy_share(&self, r: usize) -> f64 {
        let sq = |s: &f32| (*s as f64) * (*s as f64);
        let total: f64 = self.spectrum.iter().map(sq).sum();
        if total == 0.0 {
            return 1.0;
        }
        self.spectrum.iter().take(r).map(sq).sum::<f64>() / total
    }
    /// P Wᵀ as a dense row-major f32 matrix.
    pub fn dense(&self) -> Vec<f32> {
        let (rows, m, cols) = (self.p.rows(), self.rank(), self.wt.cols());
        let (p, wt) = (self.p.to_f32_vec(), self.wt.to_f32_vec());
        let mut out = vec![0.0f32; rows * cols];
        for i in 0..rows {
            let row = &mut out[i * cols..(i + 1) * cols];
            for j in 0..m {
                let c = p[i * m + j];
                for (o, w) in row.iter_mut().zip(&wt[j * cols..(j + 1) * cols]) {
                    *o += c * w;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `rows x cols` matrix of rank `rank` at most, its directions' scales decaying by `decay`
    /// (a deficit's shape: a few strong directions, a long tail), from a seeded generator.
    fn decaying(rows: usize, cols: usize, rank: usize, decay: f32, seed: u64) -> Vec<f32> {
        let mut s = seed;
        let mut rnd = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let a: Vec<f32> = (0..rows * rank).map(|_| rnd()).collect();
        let b: Vec<f32> = (0..cols * rank).map(|_| rnd()).collect();
        let mut m = vec![0.0f32; rows * cols];
        for i in 0..rows {
            for c in 0..cols {
                m[i * cols + c] = (0..rank)
                    .map(|j| decay.powi(j as i32) * a[i * rank + j] * b[c * rank + j])
                    .sum();
            }
        }
        m
    }

    /// The Gram path against faer's bidiagonal SVD at the shapes patches take, tall and wide,
    /// full rank and rank-deficient: the same energies σ² (to 1e-5 of σ₁²) and, at every rank, a
    /// truncation error within 1e-4 of the total energy of the optimum's.
    #[test]
    fn gram_svd_matches_the_bidiagonal_svd() {
        for (rows, cols, rank, seed) in [
            (150, 192, 150, 1),
            (250, 192, 192, 2),
            (400, 128, 60, 3),
            (40, 192, 40, 4),
            (192, 64, 10, 5),
        ] {
            let data = decaying(rows, cols, rank, 0.95, seed);
            let ours = Svd::of_rows(rows, cols, &data).unwrap();
            let a = faer::Mat::<f32>::from_fn(rows, cols, |i, j| data[i * cols + j]);
            let mut reference: Vec<f32> = a.singular_values().unwrap();
            reference.sort_by(|x, y| y.total_cmp(x));
            let top = reference[0];
            for (j, (x, y)) in ours.singular.iter().zip(&reference).enumerate() {
                // Energies (what the rank policies weigh) to 1e-5 of σ₁²: a Gram matrix in f32
                // resolves σ² to f32's epsilon times σ₁², so a σ far below σ₁ is coarser.
                let (x2, y2) = ((*x as f64).powi(2), (*y as f64).powi(2));
                assert!(
                    (x2 - y2).abs() <= 1e-5 * (top as f64).powi(2),
                    "{rows}x{cols} σ_{j}: {x} vs {y} (σ₁ {top})"
                );
            }
            let total: f64 = data.iter().map(|x| (*x as f64).powi(2)).sum();
            for m in [1, 8, 32, 64, rows.min(cols)] {
                let lr = ours.truncate(m, DType::F32).unwrap();
                let err: f64 = data.iter().zip(lr.dense()).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
                let optimum: f64 = reference.iter().skip(m).map(|&s| (s as f64).powi(2)).sum();
                assert!(
                    err - optimum <= 1e-4 * total,
                    "{rows}x{cols} rank {m}: error {err} vs optimum {optimum}"
                );
            }
        }
    }

    /// A covariance spanning 1e-6 of its top eigenvalue: its eigenvectors straight from the
    /// symmetric solver (each Gv = λv to 1e-6 of λ₁), where the Gram path would square that span.
    #[test]
    fn a_psd_matrix_decomposes_as_itself() {
        let (n, f) = (300, 64);
        let a = decaying(n, f, f, 0.8, 9);
        let mut g = vec![0.0f32; f * f];
        for i in 0..f {
            for j in 0..f {
                g[i * f + j] = (0..n).map(|t| a[t * f + i] * a[t * f + j]).sum();
            }
        }
        let s = Svd::compute_psd(&Mat::from_f32(f, f, g.clone()).unwrap()).unwrap();
        assert!(s.singular.windows(2).all(|w| w[0] >= w[1]));
        let top = s.singular[0] as f64;
        assert!(
            s.singular[f - 1] as f64 / top < 1e-6,
            "span {}",
            s.singular[f - 1] as f64 / top
        );
        for j in 0..f {
            let v = &s.vt[j * f..(j + 1) * f];
            let worst = (0..f)
                .map(|i| {
                    let gv: f64 = (0..f).map(|c| g[i * f + c] as f64 * v[c] as f64).sum();
                    (gv - s.singular[j] as f64 * v[i] as f64).abs()
                })
                .fold(0.0, f64::max);
            assert!(worst <= 1e-6 * top, "direction {j}: residual {worst} (λ₁ {top})");
        }
        assert!(Svd::compute_psd(&Mat::from_f32(2, 3, vec![0.0; 6]).unwrap()).is_err());
    }

    #[test]
    fn a_zero_or_non_finite_matrix() {
        let zero = Svd::of_rows(3, 5, &[0.0; 15]).unwrap();
        assert!(zero.singular.iter().all(|&s| s == 0.0));
        assert!(zero.truncate(2, DType::F32).unwrap().dense().iter().all(|&x| x == 0.0));
        let mut bad = vec![1.0f32; 6];
        bad[4] = f32::NAN;
        assert!(matches!(
            Svd::of_rows(2, 3, &bad),
            Err(Error::Svd { rows: 2, cols: 3, .. })
        ));
    }
}
