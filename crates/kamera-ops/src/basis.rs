//! A per-model patch basis: per layer, for K and for V, an orthonormal basis of the feature space
//! (rows by descending deficit energy on calibration chunks, a Karhunen-Loève transform). A
//! transform-coded patch stores only coefficients and the basis' fingerprint; bases are per-model
//! constants, loaded with the model. A decoder resolves a record's fingerprint against the
//! [`Bases`] it is given (the runtime passes the model's basis to the store it opens): there is
//! no process-wide registry.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

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

/// The patch bases a decoder may resolve a transform-coded record against, by fingerprint: a
/// small value passed to whoever decodes (kamera-store's codec and the stores it serves), cheap
/// to clone (the bases are shared). A record naming a basis not in the set is refused by name.
///
/// ```
/// use std::sync::Arc;
/// use kamera_ops::{Bases, PatchBasis};
/// let eye = vec![1.0, 0.0, 0.0, 1.0];
/// let basis = Arc::new(PatchBasis::new(2, 2, vec![(eye.clone(), eye)], None).unwrap());
/// let bases = Bases::from(basis.clone());
/// assert!(Arc::ptr_eq(bases.get(basis.fp()).unwrap(), &basis));
/// assert!(Bases::new().get(basis.fp()).is_none());
/// ```
#[derive(Clone, Default, PartialEq)]
pub struct Bases(BTreeMap<BasisFp, Arc<PatchBasis>>);

impl Bases {
    /// No bases: every transform-coded record is refused.
    pub fn new() -> Bases {
        Bases(BTreeMap::new())
    }

    /// Adds `basis`, returning the one the set keeps under its fingerprint (the first added of
    /// equal fingerprints: their matrices are equal).
    pub fn insert(&mut self, basis: Arc<PatchBasis>) -> Arc<PatchBasis> {
        self.0.entry(basis.fp()).or_insert(basis).clone()
    }

    /// The set with `basis` added ([`Bases::insert`]).
    pub fn with(mut self, basis: Arc<PatchBasis>) -> Bases {
        self.insert(basis);
        self
    }

    /// The basis with fingerprint `fp`, when the set holds it.
    pub fn get(&self, fp: BasisFp) -> Option<&Arc<PatchBasis>> {
        self.0.get(&fp)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The bases, by fingerprint.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<PatchBasis>> {
        self.0.values()
    }
}

impl From<Arc<PatchBasis>> for Bases {
    fn from(basis: Arc<PatchBasis>) -> Bases {
        Bases::new().with(basis)
    }
}

impl FromIterator<Arc<PatchBasis>> for Bases {
    fn from_iter<I: IntoIterator<Item = Arc<PatchBasis>>>(it: I) -> Bases {
        let mut b = Bases::new();
        it.into_iter().for_each(|x| {
            b.insert(x);
        });
        b
    }
}

impl fmt::Debug for Bases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basis(scale: f32) -> Arc<PatchBasis> {
        let m = vec![scale, 0.0, 0.0, scale];
        Arc::new(PatchBasis::new(2, 2, vec![(m.clone(), m)], None).unwrap())
    }

    #[test]
    fn bases_resolve_by_fingerprint_and_keep_the_first_of_equal_ones() {
        let (a, b) = (basis(1.0), basis(-1.0));
        assert_ne!(a.fp(), b.fp());
        let mut set = Bases::from(a.clone());
        assert!(
            Arc::ptr_eq(&set.insert(basis(1.0)), &a),
            "an equal basis keeps the first"
        );
        assert_eq!(set.len(), 1);
        assert!(set.get(b.fp()).is_none());
        let set = set.with(b.clone());
        assert!(Arc::ptr_eq(set.get(b.fp()).unwrap(), &b));
        assert_eq!(set, [b.clone(), a.clone()].into_iter().collect::<Bases>());
        assert!(Bases::new().is_empty());
        let shown = format!("{set:?}");
        assert!(
            shown.contains(&a.fp().to_string()) && shown.contains(&b.fp().to_string()),
            "{shown}"
        );
    }
}
