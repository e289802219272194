//! The rank-m conditioning patch: per layer and per K/V, the top SVD factors of the canonical-
//! frame deficit, with a fixed rank or per-layer ranks chosen under a byte budget by singular
//! energy (KAMERA.md, "The operator": KV^(B|A) = R(δ)·(KV(B|∅) + U_m V_mᵀ)).

use crate::chunk::{ChunkKv, LayerKv};
use crate::deficit::{Deficit, deficit};
use crate::error::{Result, invalid, shape};
use crate::layout::KvLayout;
use crate::rope::RopeSpec;
use crate::svd::{LowRank, Svd};
use crate::tensor::{Buf, DType, Mat};

/// How many directions each (layer, K/V) keeps.
#[derive(Debug, Clone, PartialEq)]
pub enum RankPolicy {
    /// The same rank in every layer for K and V (capped at min(tokens, features)).
    Fixed(usize),
    /// One rank per layer, for both K and V.
    PerLayer(Vec<usize>),
    /// Ranks chosen greedily by singular energy per byte until the patch reaches `fraction` of
    /// the chunk's KV bytes: deep layers with concentrated deficits get more.
    Budget { fraction: f64 },
    /// As `Budget`, but each direction's gain is its share σ²/‖Δ‖² of its own matrix's energy, so
    /// every layer weighs the same whatever the scale of its KV.
    BudgetShare { fraction: f64 },
}

/// Patch formation settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchConfig {
    pub rank: RankPolicy,
    /// Storage type of the factors.
    pub dtype: DType,
}

impl PatchConfig {
    pub fn fixed(rank: usize, dtype: DType) -> PatchConfig {
        PatchConfig {
            rank: RankPolicy::Fixed(rank),
            dtype,
        }
    }
}

/// Factors of one layer's K and V deficits.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerPatch {
    pub k: LowRank,
    pub v: LowRank,
}

/// The conditioning patch of one chunk, in that chunk's canonical frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Patch {
    layout: KvLayout,
    n_tokens: usize,
    layers: Vec<LayerPatch>,
}

impl Patch {
    /// Checks factor shapes against the layout and token count.
    pub fn new(layout: KvLayout, n_tokens: usize, layers: Vec<LayerPatch>) -> Result<Patch> {
        const OP: &str = "Patch::new";
        if layers.len() != layout.n_layers {
            return Err(shape(OP, "layers", layout.n_layers, layers.len()));
        }
        for (l, lp) in layers.iter().enumerate() {
            for (lr, feats, ch) in [(&lp.k, layout.k_features(), "k"), (&lp.v, layout.v_features(), "v")] {
                let ok = lr.p.rows() == n_tokens && lr.wt.cols() == feats && lr.p.cols() == lr.wt.rows();
                if !ok {
                    return Err(shape(
                        OP,
                        format!("layer {l} {ch} factors (P rows x rank, Wᵀ rank x features)"),
                        format!("{n_tokens} x m, m x {feats}"),
                        format!("{} x {}, {} x {}", lr.p.rows(), lr.p.cols(), lr.wt.rows(), lr.wt.cols()),
                    ));
                }
            }
        }
        Ok(Patch {
            layout,
            n_tokens,
            layers,
        })
    }
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }
    pub fn layers(&self) -> &[LayerPatch] {
        &self.layers
    }
    /// (K rank, V rank) per layer.
    pub fn ranks(&self) -> Vec<(usize, usize)> {
        self.layers.iter().map(|l| (l.k.rank(), l.v.rank())).collect()
    }
    /// Exact storage bytes of all factors.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.k.bytes() + l.v.bytes()).sum()
    }
    /// Patch bytes / the chunk's KV bytes.
    pub fn bytes_ratio(&self, chunk: &ChunkKv) -> f64 {
        self.bytes() as f64 / chunk.kv_bytes().max(1) as f64
    }
    pub(crate) fn check_fits(&self, op: &'static str, chunk: &ChunkKv) -> Result<()> {
        if self.layout != *chunk.layout() {
            return Err(shape(
                op,
                "patch layout",
                format!("{:?}", chunk.layout()),
                format!("{:?}", self.layout),
            ));
        }
        if self.n_tokens != chunk.n_tokens() {
            return Err(shape(op, "patch tokens", chunk.n_tokens(), self.n_tokens));
        }
        Ok(())
    }
}

/// Forms the patch of `canonical` from one conditioned prefill of the same chunk.
pub fn form_patch(conditioned: &ChunkKv, canonical: &ChunkKv, rope: &RopeSpec, cfg: &PatchConfig) -> Result<Patch> {
    let d = deficit(conditioned, canonical, rope)?;
    patch_from_deficit(&d, canonical.layout(), canonical.kv_bytes(), cfg)
}

/// Truncates each deficit matrix to the ranks the policy picks. `kv_bytes` is the chunk's KV
/// size that a [`RankPolicy::Budget`] fraction refers to.
pub fn patch_from_deficit(d: &Deficit, layout: &KvLayout, kv_bytes: usize, cfg: &PatchConfig) -> Result<Patch> {
    const OP: &str = "patch_from_deficit";
    if d.layers.len() != layout.n_layers {
        return Err(shape(OP, "deficit layers", layout.n_layers, d.layers.len()));
    }
    let svds: Vec<(Svd, Svd)> = d
        .layers
        .iter()
        .map(|(k, v)| Ok((Svd::compute(k)?, Svd::compute(v)?)))
        .collect::<Result<_>>()?;
    let n = d.n_tokens();
    let ranks: Vec<(usize, usize)> = match &cfg.rank {
        RankPolicy::Fixed(m) => vec![(*m, *m); layout.n_layers],
        RankPolicy::PerLayer(rs) if rs.len() == layout.n_layers => rs.iter().map(|&m| (m, m)).collect(),
        RankPolicy::PerLayer(rs) => return Err(shape(OP, "per-layer ranks", layout.n_layers, rs.len())),
        RankPolicy::Budget { fraction } | RankPolicy::BudgetShare { fraction } => {
            if !(fraction.is_finite() && *fraction >= 0.0) {
                return Err(invalid(
                    OP,
                    "budget fraction",
                    format!("{fraction} must be finite and >= 0"),
                ));
            }
            let budget = (*fraction * kv_bytes as f64).floor() as usize;
            let share = matches!(cfg.rank, RankPolicy::BudgetShare { .. });
            budget_ranks(&svds, n, layout, budget, cfg.dtype.size(), share)
        }
    };
    let layers = svds
        .iter()
        .zip(ranks)
        .map(|((sk, sv), (rk, rv))| {
            Ok(LayerPatch {
                k: sk.truncate(rk, cfg.dtype)?,
                v: sv.truncate(rv, cfg.dtype)?,
            })
        })
        .collect::<Result<_>>()?;
    Patch::new(*layout, n, layers)
}

/// Greedy knapsack over directions: highest gain per byte first, the gain being σ² (or, with
/// `share`, σ² over its matrix's total energy). Within one matrix the cost per direction is
/// constant and the gain descends, so every matrix keeps a prefix of its directions.
fn budget_ranks(
    svds: &[(Svd, Svd)],
    n: usize,
    layout: &KvLayout,
    budget: usize,
    elem: usize,
    share: bool,
) -> Vec<(usize, usize)> {
    let cost = [(n + layout.k_features()) * elem, (n + layout.v_features()) * elem];
    let mut items: Vec<(f64, usize, usize, usize)> = Vec::new();
    for (l, (sk, sv)) in svds.iter().enumerate() {
        for (ch, s) in [sk, sv].into_iter().enumerate() {
            let total: f64 = if share { s.tail_energy(0) } else { 1.0 };
            if total <= 0.0 {
                continue;
            }
            for (j, &x) in s.singular.iter().enumerate() {
                items.push(((x as f64).powi(2) / total / cost[ch] as f64, l, ch, j));
            }
        }
    }
    items.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.3.cmp(&b.3)));
    let mut ranks = vec![(0usize, 0usize); svds.len()];
    let mut used = 0usize;
    for (gain, l, ch, j) in items {
        let r = if ch == 0 { &mut ranks[l].0 } else { &mut ranks[l].1 };
        if gain > 0.0 && *r == j && used + cost[ch] <= budget {
            *r += 1;
            used += cost[ch];
        }
    }
    ranks
}

/// `chunk` + P Wᵀ in every layer, in the chunk's own frame (use on canonical KV).
pub fn apply_patch(chunk: &ChunkKv, patch: &Patch) -> Result<ChunkKv> {
    const OP: &str = "apply_patch";
    patch.check_fits(OP, chunk)?;
    let layers = chunk
        .layers()
        .iter()
        .zip(patch.layers())
        .map(|(kv, lp)| {
            Ok(LayerKv {
                k: add_dense(&kv.k, &lp.k)?,
                v: add_dense(&kv.v, &lp.v)?,
            })
        })
        .collect::<Result<_>>()?;
    let out = ChunkKv::new(*chunk.layout(), chunk.offset(), layers)?;
    out.check_finite(OP)?;
    Ok(out)
}

fn add_dense(m: &Mat, lr: &LowRank) -> Result<Mat> {
    let sum: Vec<f32> = m.to_f32_vec().iter().zip(lr.dense()).map(|(a, b)| a + b).collect();
    Mat::new(m.rows(), m.cols(), Buf::from_f32(m.dtype(), &sum))
}
