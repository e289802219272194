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

    /// Decomposes a row-major `rows x cols` matrix.
    fn of_rows(rows: usize, cols: usize, data: &[f32]) -> Result<Svd> {
        let k = rows.min(cols);
        if k == 0 {
            return Ok(Svd {
                rows,
                cols,
                us: vec![],
                vt: vec![],
                singular: vec![],
            });
        }
        let a = faer::Mat::<f32>::from_fn(rows, cols, |i, j| data[i * cols + j]);
        let svd = a.thin_svd().map_err(|_| Error::Svd {
            op: "Svd::compute",
            rows,
            cols,
        })?;
        let (u, s, v) = (svd.U(), svd.S().column_vector(), svd.V());
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by(|&x, &y| s[y].total_cmp(&s[x]));
        let singular: Vec<f32> = order.iter().map(|&j| s[j]).collect();
        if singular.iter().any(|x| !x.is_finite()) {
            return Err(Error::Svd {
                op: "Svd::compute",
                rows,
                cols,
            });
        }
        let mut us = vec![0.0f32; rows * k];
        let mut vt = vec![0.0f32; k * cols];
        for (jj, &j) in order.iter().enumerate() {
            for i in 0..rows {
                us[i * k + jj] = u[(i, j)] * s[j];
            }
            for c in 0..cols {
                vt[jj * cols + c] = v[(c, j)];
            }
        }
        Ok(Svd {
            rows,
            cols,
            us,
            vt,
            singular,
        })
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
