//! Small ChunkKv helpers: row slices, row splicing, per-token deviation.

use kamera_ops::{ChunkKv, LayerKv, Mat};

use crate::error::{OpsCtx, Result};

fn rows(m: &Mat, from: usize, len: usize) -> Result<Mat> {
    let c = m.cols();
    let v = m.to_f32_vec();
    Mat::from_f32(len, c, v[from * c..(from + len) * c].to_vec()).ops("kv::rows")
}

/// Tokens `from..from + len` of `chunk`, at their own positions.
pub fn slice(chunk: &ChunkKv, from: usize, len: usize) -> Result<ChunkKv> {
    let layers = chunk
        .layers()
        .iter()
        .map(|l| {
            Ok(LayerKv {
                k: rows(&l.k, from, len)?,
                v: rows(&l.v, from, len)?,
            })
        })
        .collect::<Result<_>>()?;
    ChunkKv::new(*chunk.layout(), chunk.offset() + from as i64, layers).ops("kv::slice")
}

/// `base` with the rows in `take` (indices into the chunk) copied from `donor` in every layer.
pub fn splice(base: &ChunkKv, donor: &ChunkKv, take: &[usize]) -> Result<ChunkKv> {
    let cp = |b: &Mat, d: &Mat| {
        let c = b.cols();
        let mut out = b.to_f32_vec();
        let src = d.to_f32_vec();
        for &r in take {
            out[r * c..(r + 1) * c].copy_from_slice(&src[r * c..(r + 1) * c]);
        }
        Mat::from_f32(b.rows(), c, out).ops("kv::splice")
    };
    let layers = base
        .layers()
        .iter()
        .zip(donor.layers())
        .map(|(b, d)| {
            Ok(LayerKv {
                k: cp(&b.k, &d.k)?,
                v: cp(&b.v, &d.v)?,
            })
        })
        .collect::<Result<_>>()?;
    ChunkKv::new(*base.layout(), base.offset(), layers).ops("kv::splice")
}

/// `base` with layer `layer`'s K (`k`) and/or V (`v`) taken from `donor` (same shapes).
pub fn swap_layer(base: &ChunkKv, donor: &ChunkKv, layer: usize, k: bool, v: bool) -> Result<ChunkKv> {
    let mut out = base.clone();
    let (Some(o), Some(d)) = (out.layers_mut().get_mut(layer), donor.layers().get(layer)) else {
        return Err(crate::error::invalid(&format!("layer {layer} outside the model")));
    };
    if k {
        o.k = d.k.clone();
    }
    if v {
        o.v = d.v.clone();
    }
    Ok(out)
}

/// Per token, the squared L2 distance of its K and V rows summed over layers (both chunks at the
/// same positions, so RoPE does not change the norms).
pub fn token_deviation(a: &ChunkKv, b: &ChunkKv) -> Vec<f64> {
    let n = a.n_tokens();
    let mut out = vec![0.0f64; n];
    for (la, lb) in a.layers().iter().zip(b.layers()) {
        for (ma, mb) in [(&la.k, &lb.k), (&la.v, &lb.v)] {
            let c = ma.cols().max(1);
            let (x, y) = (ma.to_f32_vec(), mb.to_f32_vec());
            for (t, (rx, ry)) in x.chunks(c).zip(y.chunks(c)).enumerate() {
                out[t] += rx.iter().zip(ry).map(|(p, q)| ((p - q) as f64).powi(2)).sum::<f64>();
            }
        }
    }
    out
}

/// Indices of the `k` largest scores (ties to the lower index).
pub fn top_k(scores: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.sort_unstable();
    idx
}
