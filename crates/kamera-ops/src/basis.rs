//! A per-model patch basis: per layer, for K and for V, an orthonormal basis of the feature space
//! (rows by descending deficit energy on calibration chunks, a Karhunen-Loève transform). A
//! transform-coded patch stores only coefficients and the basis' fingerprint; bases are per-model
//! constants, loaded with the model and registered so a decoded record finds its basis.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Result, invalid, shape};
use crate::layout::KvLayout;

/// The first 8 bytes of blake3 over a basis' shape and values: what a coded record names.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BasisFp(pub [u8; 8]);

impl fmt::Display for BasisFp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}
impl fmt::Debug for BasisFp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BasisFp({self})")
    }
}

/// Per layer the K and V bases (row-major `f x f`, row j the j-th basis vector), and optionally
/// the per-layer (K, V) KL sensitivities the coding's byte budget weighs layers by.
pub struct PatchBasis {
    k_features: usize,
    v_features: usize,
    /// Layer-major, K then V.
    mats: Vec<Vec<f32>>,
    sensitivity: Option<Vec<(f64, f64)>>,
    fp: BasisFp,
}

impl PatchBasis {
    /// Checks every matrix's size and values; `sensitivity`, when given, has one (K, V) pair per
    /// layer, each finite and >= 0.
    pub fn new(
        k_features: usize,
        v_features: usize,
        layers: Vec<(Vec<f32>, Vec<f32>)>,
        sensitivity: Option<Vec<(f64, f64)>>,
    ) -> Result<PatchBasis> {
        const OP: &str = "PatchBasis::new";
        if layers.is_empty() {
            return Err(invalid(OP, "basis", "no layers"));
        }
        let mut mats = Vec::with_capacity(2 * layers.len());
        let mut h = blake3::Hasher::new_derive_key("kamera.basis.v1");
        h.update(&(layers.len() as u64).to_le_bytes());
        h.update(&(k_features as u64).to_le_bytes());
        h.update(&(v_features as u64).to_le_bytes());
        for (l, (k, v)) in layers.into_iter().enumerate() {
            for (m, f, ch) in [(k, k_features, "k"), (v, v_features, "v")] {
                if m.len() != f * f {
                    return Err(shape(OP, format!("layer {l} {ch} basis"), f * f, m.len()));
                }
                if let Some(i) = m.iter().position(|x| !x.is_finite()) {
                    return Err(invalid(OP, "basis", format!("layer {l} {ch}: value {i} is not finite")));
                }
                m.iter().for_each(|x| {
                    h.update(&x.to_le_bytes());
                });
                mats.push(m);
            }
        }
        if let Some(s) = &sensitivity {
            if s.len() != mats.len() / 2 {
                return Err(shape(OP, "layer sensitivities", mats.len() / 2, s.len()));
            }
            if s.iter()
                .any(|&(k, v)| !(k.is_finite() && v.is_finite() && k >= 0.0 && v >= 0.0))
            {
                return Err(invalid(OP, "layer sensitivity", "every value must be finite and >= 0"));
            }
        }
        let mut fp = [0u8; 8];
        fp.copy_from_slice(&h.finalize().as_bytes()[..8]);
        Ok(PatchBasis {
            k_features,
            v_features,
            mats,
            sensitivity,
            fp: BasisFp(fp),
        })
    }

    pub fn fp(&self) -> BasisFp {
        self.fp
    }
    pub fn n_layers(&self) -> usize {
        self.mats.len() / 2
    }
    /// Per matrix (layer-major, K then V), its rows (`f x f`, row-major).
    pub fn mats(&self) -> &[Vec<f32>] {
        &self.mats
    }
    /// Per layer the (K, V) KL sensitivities, when calibrated.
    pub fn sensitivity(&self) -> Option<&[(f64, f64)]> {
        self.sensitivity.as_deref()
    }

    /// Checks the basis against a KV layout.
    pub fn check(&self, op: &'static str, layout: &KvLayout) -> Result<()> {
        let ours = (self.n_layers(), self.k_features, self.v_features);
        let theirs = (layout.n_layers, layout.k_features(), layout.v_features());
        if ours != theirs {
            return Err(shape(
                op,
                format!(
                    "patch basis {} (layers, K features, V features): another model's?",
                    self.fp
                ),
                format!("{theirs:?}"),
                format!("{ours:?}"),
            ));
        }
        Ok(())
    }

    /// Makes the basis findable by its fingerprint ([`PatchBasis::registered`]), returning the
    /// registered one (the first registered of equal fingerprints).
    pub fn register(self) -> Arc<PatchBasis> {
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        reg.entry(self.fp).or_insert_with(|| Arc::new(self)).clone()
    }

    /// The registered basis with fingerprint `fp`.
    pub fn registered(fp: BasisFp) -> Option<Arc<PatchBasis>> {
        registry().lock().unwrap_or_else(|e| e.into_inner()).get(&fp).cloned()
    }
}

fn registry() -> &'static Mutex<HashMap<BasisFp, Arc<PatchBasis>>> {
    static REG: OnceLock<Mutex<HashMap<BasisFp, Arc<PatchBasis>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

impl PartialEq for PatchBasis {
    fn eq(&self, o: &PatchBasis) -> bool {
        self.fp == o.fp && self.sensitivity == o.sensitivity
    }
}

impl fmt::Debug for PatchBasis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PatchBasis({}, {} layers x ({}, {}) features{})",
            self.fp,
            self.n_layers(),
            self.k_features,
            self.v_features,
            if self.sensitivity.is_some() {
                ", with layer sensitivities"
            } else {
                ""
            }
        )
    }
}
