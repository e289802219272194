//! The per-model deficit basis file (`--calibrate-basis` writes it, `--deficit-basis` and the
//! runtime's patch store read it): a JSON header line, then per layer the K and V second moments
//! ΔᵀΔ of the deficit (f32 little-endian); the basis is their eigenvectors (a Karhunen-Loève
//! transform), the one kamera-ops' transform coder codes `/klt` patches in.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::Arc;

use kamera_ops::{KvLayout, Mat, PatchBasis, Svd};
use serde::{Deserialize, Serialize};

use crate::error::{Error, OpsCtx, Result};

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
    /// Per layer, the (K, V) KL sensitivities the runtime's budget weighs layers by (from
    /// `--layer-sensitivity` at calibration; absent in older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitivity: Option<Vec<(f64, f64)>>,
}

/// Per layer, the K and V second moments ΔᵀΔ summed over the calibration chunks (`features x
/// features`, what the file holds) and their bases (row j the j-th eigenvector, by descending
/// eigenvalue): the basis a store is given (`kamera_ops::Bases`) to decode records coded in it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeficitBasis {
    pub header: BasisHeader,
    pub grams: Vec<(Vec<f32>, Vec<f32>)>,
    pub basis: Arc<PatchBasis>,
}

fn invalid(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Invalid {
        op,
        detail: detail.into(),
    }
}

impl DeficitBasis {
    /// Checks the basis against a patch layout (kamera-ops `PatchBasis::check`).
    pub fn check(&self, layout: &KvLayout) -> Result<()> {
        self.basis
            .check("deficit basis", layout)
            .map_err(|e| invalid("deficit basis", format!("{e} (measured on {})", self.header.model)))
    }

    /// The basis of `grams` (per layer, K and V, full symmetric `f x f`).
    pub fn from_grams(header: BasisHeader, grams: Vec<(Vec<f32>, Vec<f32>)>) -> Result<DeficitBasis> {
        let (kf, vf) = (header.k_features, header.v_features);
        let layers = grams
            .iter()
            .map(|(gk, gv)| Ok((eigenbasis(gk, kf, None)?, eigenbasis(gv, vf, None)?)))
            .collect::<Result<Vec<_>>>()?;
        let basis = PatchBasis::new(kf, vf, layers, header.sensitivity.clone()).ops("deficit basis")?;
        Ok(DeficitBasis {
            header,
            grams,
            basis: Arc::new(basis),
        })
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

/// The eigenvectors of the symmetric PSD `gram` (`f x f`), or of D^½ · gram · D^½ with `cols` the
/// diagonal D (a per-model metric on the features), as rows by descending eigenvalue
/// ([`Svd::compute_psd`]).
pub fn eigenbasis(gram: &[f32], f: usize, cols: Option<&[f32]>) -> Result<Vec<f32>> {
    let mut g = gram.to_vec();
    if let Some(c) = cols {
        for i in 0..f {
            for j in 0..f {
                g[i * f + j] *= (c[i] * c[j]).sqrt();
            }
        }
    }
    let s = Svd::compute_psd(&Mat::from_f32(f, f, g).ops("gram")?).ops("eigenbasis")?;
    let lr = s.truncate(f, kamera_ops::DType::F32).ops("eigenbasis")?;
    Ok(lr.wt.to_f32_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn identity(f: usize) -> Vec<f32> {
        (0..f * f).map(|i| if i % (f + 1) == 0 { 1.0 } else { 0.0 }).collect()
    }

    #[test]
    fn a_basis_file_round_trips_and_bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("kamera-klt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("basis.bin");
        let mut h = header(1, 2, 3);
        h.sensitivity = Some(vec![(0.25, 0.5)]);
        let grams = vec![(vec![2.0, 1.0, 1.0, 3.0], identity(3))];
        let basis = DeficitBasis::from_grams(h, grams).unwrap();
        basis.save(&path).unwrap();
        let back = DeficitBasis::load(&path).unwrap();
        assert_eq!(back, basis);
        assert_eq!(back.basis.sensitivity(), Some(&[(0.25, 0.5)][..]));
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let e = DeficitBasis::load(&path).unwrap_err().to_string();
        assert!(e.contains("expected from its header"), "{e}");
        assert!(
            basis
                .check(&KvLayout::mha(2, 1, 2))
                .unwrap_err()
                .to_string()
                .contains("another model")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
