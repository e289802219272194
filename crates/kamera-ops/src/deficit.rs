//! The conditioning deficit Δ = KV(B|A) − KV(B|∅), taken in the canonical frame: the conditioned
//! keys are un-rotated to the canonical positions first, so a patch relocates with its chunk
//! (KAMERA.md, "Patch").

use crate::chunk::ChunkKv;
use crate::error::{Result, shape};
use crate::relocate::relocate;
use crate::rope::RopeSpec;
use crate::tensor::Mat;

/// Per layer, the K and V deficits as f32 tokens x features matrices.
#[derive(Debug, Clone, PartialEq)]
pub struct Deficit {
    pub layers: Vec<(Mat, Mat)>,
}

/// Δ of a chunk prefilled after its antecedents (`conditioned`, at any offset) against its
/// canonical KV (`canonical`).
pub fn deficit(conditioned: &ChunkKv, canonical: &ChunkKv, rope: &RopeSpec) -> Result<Deficit> {
    const OP: &str = "deficit";
    canonical.check_same_shape(OP, "conditioned vs canonical", conditioned)?;
    canonical.check_finite(OP)?;
    conditioned.check_finite(OP)?;
    let frame = relocate(conditioned, rope, canonical.offset())?;
    let layers = frame
        .layers()
        .iter()
        .zip(canonical.layers())
        .map(|(c, b)| Ok((sub(&c.k, &b.k)?, sub(&c.v, &b.v)?)))
        .collect::<Result<_>>()?;
    Ok(Deficit { layers })
}

fn sub(a: &Mat, b: &Mat) -> Result<Mat> {
    let diff = a.to_f32_vec().iter().zip(b.to_f32_vec()).map(|(x, y)| x - y).collect();
    Mat::from_f32(a.rows(), a.cols(), diff)
}

impl Deficit {
    /// The element-wise mean of several deficits of one chunk (the orbit deficit).
    pub fn mean(deficits: &[Deficit]) -> Result<Deficit> {
        const OP: &str = "Deficit::mean";
        let first = deficits
            .first()
            .ok_or_else(|| shape(OP, "deficits", "at least one", 0))?;
        let scale = 1.0 / deficits.len() as f32;
        let mut acc: Vec<(Vec<f32>, Vec<f32>)> = first
            .layers
            .iter()
            .map(|(k, v)| (k.to_f32_vec(), v.to_f32_vec()))
            .collect();
        for (i, d) in deficits.iter().enumerate().skip(1) {
            if d.layers.len() != acc.len() {
                return Err(shape(OP, format!("deficit {i} layers"), acc.len(), d.layers.len()));
            }
            for ((ak, av), (k, v)) in acc.iter_mut().zip(&d.layers) {
                add_into(OP, ak, k, i)?;
                add_into(OP, av, v, i)?;
            }
        }
        let layers = acc
            .into_iter()
            .zip(&first.layers)
            .map(|((k, v), (k0, v0))| {
                Ok((
                    Mat::from_f32(k0.rows(), k0.cols(), k.into_iter().map(|x| x * scale).collect())?,
                    Mat::from_f32(v0.rows(), v0.cols(), v.into_iter().map(|x| x * scale).collect())?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Deficit { layers })
    }

    /// Tokens of the chunk.
    pub fn n_tokens(&self) -> usize {
        self.layers.first().map_or(0, |(k, _)| k.rows())
    }
}

fn add_into(op: &'static str, acc: &mut [f32], m: &Mat, i: usize) -> Result<()> {
    if m.rows() * m.cols() != acc.len() {
        return Err(shape(op, format!("deficit {i} matrix"), acc.len(), m.rows() * m.cols()));
    }
    for (a, x) in acc.iter_mut().zip(m.to_f32_vec()) {
        *a += x;
    }
    Ok(())
}
