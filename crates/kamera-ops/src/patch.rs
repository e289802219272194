//! The rank-m conditioning patch: per layer and per K/V, the top SVD factors of the canonical-
//! frame deficit, with a fixed rank or per-layer ranks chosen under a byte budget by singular
//! energy (KAMERA.md, "The operator": KV^(B|A) = R(δ)·(KV(B|∅) + U_m V_mᵀ)).

use std::sync::Arc;

use rayon::prelude::*;

use crate::chunk::{ChunkKv, LayerKv};
use crate::deficit::{Deficit, deficit};
use crate::error::{Result, invalid, shape};
use crate::layout::KvLayout;
use crate::quant::{Grain, Grains, Quant, Scales, quantise, quantise_auto, quantise_grains, quantise_refit};
use crate::rope::RopeSpec;
use crate::svd::{LowRank, Svd};
use crate::tensor::{Buf, DType, Mat};
use crate::transform::{BasisCode, BasisCoding, transform_patch};
use crate::weights::PatchWeights;

mod ranks;
pub use ranks::policy_ranks;

/// How many directions each (layer, K/V) keeps.
#[derive(Debug, Clone, PartialEq)]
pub enum RankPolicy {
    /// The same rank in every layer for K and V (capped at min(tokens, features)).
    Fixed(usize),
    /// One rank per layer, for both K and V.
    PerLayer(Vec<usize>),
    /// One (K, V) rank pair per layer (e.g. ranks chosen from other spectra than the factors').
    PerLayerKv(Vec<(usize, usize)>),
    /// Ranks chosen greedily by singular energy per byte until the patch reaches `fraction` of
    /// the chunk's KV bytes: deep layers with concentrated deficits get more.
    Budget { fraction: f64 },
    /// As `Budget`, but each direction's gain is its share σ²/‖Δ‖² of its own matrix's energy, so
    /// every layer weighs the same whatever the scale of its KV.
    BudgetShare { fraction: f64 },
    /// As `Budget`, with separate byte budgets (fractions of the chunk's KV bytes) for the K and
    /// the V factors.
    BudgetKv { k: f64, v: f64 },
    /// As `Budget`, each direction's σ² multiplied by its layer's (K, V) gain, one pair per
    /// layer: a per-layer sensitivity, e.g. the share of the KL a layer's deficit costs over
    /// that deficit's energy (kamera-eval `/ls`). A gain of 0 gives the layer no directions.
    BudgetGains { fraction: f64, gains: Vec<(f64, f64)> },
    /// Per layer and per K/V, the smallest rank holding share `k` (`v`) of that matrix's
    /// deficit energy.
    Energy { k: f64, v: f64 },
}

/// Patch formation settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchConfig {
    pub rank: RankPolicy,
    /// Storage type of the factors (of the dense factors when `quant` is set).
    pub dtype: DType,
    /// Quantised storage of the factors (int8 codes with per-direction scales, 4-bit codes with
    /// per-group scales, or 4-bit codes with a scale layout per factor matrix).
    pub quant: Quant,
    /// For [`Quant::Int4Mixed`]: the scale layouts of K's and V's factor matrices, or `None` to
    /// choose each by reconstruction error ([`crate::quantise_auto`]).
    pub grain: Option<Grains>,
    /// Layers whose K (V) deficit holds less than this share of the chunk's K (V) deficit energy
    /// over all layers get rank 0 (0 keeps every layer).
    pub drop_below: f64,
    /// Quantised factors: Wᵀ refitted by least squares to the quantised P before it is
    /// quantised ([`crate::quantise_refit`]; not with `Int4Mixed` layouts chosen per matrix).
    pub refit: bool,
    /// Transform coding in the model's basis ([`crate::transform_patch`]; a byte budget, no
    /// factor quantisation): the patch stores coefficient codes instead of factors.
    pub basis: Option<BasisCoding>,
}

impl PatchConfig {
    pub fn fixed(rank: usize, dtype: DType) -> PatchConfig {
        PatchConfig {
            rank: RankPolicy::Fixed(rank),
            dtype,
            quant: Quant::None,
            grain: None,
            drop_below: 0.0,
            refit: false,
            basis: None,
        }
    }
    /// Bytes a patch stores per layer besides its directions (the scale-layout flags of
    /// `Int4Mixed`), over all layers.
    fn layer_bytes(&self, layout: &KvLayout) -> usize {
        if self.quant == Quant::Int4Mixed {
            layout.n_layers
        } else {
            0
        }
    }
    /// Bytes one direction of a factor pair costs over `n` tokens and `features` (an upper bound
    /// for 4-bit codes, whose nibbles pack per matrix).
    fn direction_bytes(&self, n: usize, features: usize) -> usize {
        match self.quant {
            Quant::None => (n + features) * self.dtype.size(),
            Quant::Int8 => n + features + 8,
            Quant::Int4 | Quant::Int4Mixed => {
                let scales = |g: Grain, len: usize| g.groups(len) * g.scale_bytes();
                let grains = match (self.grain, self.quant.grain()) {
                    (Some(g), _) => g.into_iter().flatten().collect(),
                    (None, Some(g)) => vec![g],
                    (None, None) => vec![Grain::Direction, Grain::Group],
                };
                let most = |len| grains.iter().map(|&g| scales(g, len)).max().unwrap_or(0);
                n.div_ceil(2) + features.div_ceil(2) + most(n) + most(features)
            }
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
    quant: Quant,
    /// Per layer, the (K, V) scales of a quantised patch (empty for floats).
    scales: Vec<(Scales, Scales)>,
    /// The stored form of a transform-coded patch (its factors are the code read in its basis).
    code: Option<Arc<BasisCode>>,
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
        Ok(Patch::float(layout, n_tokens, layers))
    }

    /// Float factors as given (shapes checked by the caller).
    fn float(layout: KvLayout, n_tokens: usize, layers: Vec<LayerPatch>) -> Patch {
        Patch {
            layout,
            n_tokens,
            layers,
            quant: Quant::None,
            scales: Vec::new(),
            code: None,
        }
    }

    /// The patch of rank 0 for a chunk of `n_tokens` under `layout`: placing with it is a
    /// relocation alone. A runtime stores it where canonical KV is known to be exact (a chunk's
    /// KV kept from the very context the patch key names).
    pub fn zero(layout: KvLayout, n_tokens: usize) -> Patch {
        let lr = |features: usize| LowRank {
            p: Mat::zeros(n_tokens, 0, DType::F32),
            wt: Mat::zeros(0, features, DType::F32),
            spectrum: Vec::new(),
        };
        let layers = (0..layout.n_layers)
            .map(|_| LayerPatch {
                k: lr(layout.k_features()),
                v: lr(layout.v_features()),
            })
            .collect();
        Patch::float(layout, n_tokens, layers)
    }

    pub(crate) fn set_code(&mut self, code: BasisCode) {
        self.code = Some(Arc::new(code));
    }
    /// The stored form of a transform-coded patch ([`crate::transform_patch`]).
    pub fn code(&self) -> Option<&BasisCode> {
        self.code.as_deref()
    }

    /// A quantised patch whose dense factors hold code · scale (as [`crate::dequantise`] builds
    /// them), with its per-layer (K, V) scales.
    pub fn with_quant(
        layout: KvLayout,
        n_tokens: usize,
        layers: Vec<LayerPatch>,
        quant: Quant,
        scales: Vec<(Scales, Scales)>,
    ) -> Result<Patch> {
        const OP: &str = "Patch::with_quant";
        let mut p = Patch::new(layout, n_tokens, layers)?;
        if quant == Quant::None {
            return Ok(p);
        }
        if scales.len() != p.layers.len() {
            return Err(shape(OP, "scale layers", p.layers.len(), scales.len()));
        }
        for (l, (lp, (sk, sv))) in p.layers.iter().zip(&scales).enumerate() {
            for (lr, s, ch) in [(&lp.k, sk, "k"), (&lp.v, sv, "v")] {
                if quant.grain().is_some_and(|g| s.grain != [g, g]) {
                    return Err(shape(
                        OP,
                        format!("layer {l} {ch} scale layout"),
                        format!("{:?}", quant.grain()),
                        format!("{:?}", s.grain),
                    ));
                }
                let want = (
                    lr.rank() * s.grain[0].groups(n_tokens),
                    lr.rank() * s.grain[1].groups(lr.wt.cols()),
                );
                if (s.p.len(), s.wt.len()) != want {
                    return Err(shape(
                        OP,
                        format!("layer {l} {ch} scales (P, Wᵀ)"),
                        format!("{want:?}"),
                        format!("({}, {})", s.p.len(), s.wt.len()),
                    ));
                }
            }
        }
        p.quant = quant;
        p.scales = scales;
        Ok(p)
    }

    /// This patch with its factors quantised (a float patch only); `Int4Mixed` chooses each
    /// matrix's scale layout by reconstruction error.
    pub fn quantise(&self, quant: Quant) -> Result<Patch> {
        self.quantise_with(quant, None)
    }
    /// As [`Patch::quantise`]; for `Int4Mixed`, `grain` fixes the scale layouts of K's and V's
    /// factor matrices (`None` chooses per matrix).
    pub fn quantise_with(&self, quant: Quant, grain: Option<Grains>) -> Result<Patch> {
        self.quantise_rows(quant, grain, false, None)
    }
    /// As [`Patch::quantise_with`]; with `refit`, each Wᵀ is refitted to its quantised P
    /// ([`crate::quantise_refit`]) under the per-layer (K, V) token weights `rows` (`None`: 1).
    pub fn quantise_rows(
        &self,
        quant: Quant,
        grain: Option<Grains>,
        refit: bool,
        rows: Option<&PatchWeights>,
    ) -> Result<Patch> {
        if rows.is_some_and(|w| w.layers.len() != self.layers.len()) {
            return Err(shape(
                "Patch::quantise_rows",
                "weight layers",
                self.layers.len(),
                rows.map_or(0, |w| w.layers.len()),
            ));
        }
        if self.quant != Quant::None || self.code.is_some() {
            return Err(invalid(
                "Patch::quantise",
                "patch",
                "already quantised or transform-coded",
            ));
        }
        // One layer per task (independent: the same codes on any thread count).
        let quantised: Vec<(LayerPatch, (Scales, Scales))> = self
            .layers
            .par_iter()
            .enumerate()
            .map(|(l, lp)| {
                let q = |lr: &LowRank, ch: usize| {
                    let fixed = match (quant, grain) {
                        (Quant::Int4Mixed, None) => return quantise_auto(lr),
                        (Quant::Int4Mixed, Some(g)) => g[ch],
                        _ if !refit => return quantise(lr, quant),
                        _ => {
                            let g = quant.grain().unwrap_or_default();
                            [g, g]
                        }
                    };
                    if !refit {
                        return quantise_grains(lr, quant, fixed);
                    }
                    let w = rows.map(|w| {
                        let (k, v) = &w.layers[l];
                        if ch == 0 { k } else { v }
                    });
                    quantise_refit(
                        lr,
                        quant,
                        fixed,
                        w.and_then(|w| w.rows.as_deref()),
                        w.and_then(|w| w.cols.as_deref()),
                    )
                };
                let (k, sk) = q(&lp.k, 0)?;
                let (v, sv) = q(&lp.v, 1)?;
                Ok((LayerPatch { k, v }, (sk, sv)))
            })
            .collect::<Result<_>>()?;
        let (layers, scales) = quantised.into_iter().unzip();
        Patch::with_quant(self.layout, self.n_tokens, layers, quant, scales)
    }
    /// This patch with each factor pair's spectrum cut to the singular values it keeps (the
    /// rest is diagnostics a stored patch need not carry).
    pub fn compact_spectra(mut self) -> Patch {
        for lp in &mut self.layers {
            for lr in [&mut lp.k, &mut lp.v] {
                let r = lr.rank();
                lr.spectrum.truncate(r);
            }
        }
        self
    }
    pub fn quant(&self) -> Quant {
        self.quant
    }
    /// Per layer, the (K, V) scales (empty for a float patch).
    pub fn scales(&self) -> &[(Scales, Scales)] {
        &self.scales
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
    /// Exact storage bytes of all factors (codes and scales when quantised, and for
    /// `Int4Mixed` one byte per layer naming its matrices' scale layouts).
    pub fn bytes(&self) -> usize {
        if let Some(c) = &self.code {
            return c.bytes();
        }
        if self.quant == Quant::None {
            return self.layers.iter().map(|l| l.k.bytes() + l.v.bytes()).sum();
        }
        let q = |lr: &LowRank, s: &Scales| self.quant.factor_bytes(self.n_tokens, lr.rank(), lr.wt.cols(), s.grain);
        let flags = if self.quant == Quant::Int4Mixed {
            self.layers.len()
        } else {
            0
        };
        let factors: usize = self
            .layers
            .iter()
            .zip(&self.scales)
            .map(|(l, (sk, sv))| q(&l.k, sk) + q(&l.v, sv))
            .sum();
        factors + flags
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
    if let Some(coding) = &cfg.basis {
        if cfg.quant != Quant::None {
            return Err(invalid(
                OP,
                "patch config",
                "transform coding takes no factor quantisation",
            ));
        }
        return transform_patch(d, layout, kv_bytes, &cfg.rank, coding);
    }
    // One layer per task: the layers are independent (the same result on any thread count).
    let svds: Vec<(Svd, Svd)> = d
        .layers
        .par_iter()
        .map(|(k, v)| Ok((Svd::compute(k)?, Svd::compute(v)?)))
        .collect::<Result<_>>()?;
    patch_from_svds(&svds, d.n_tokens(), layout, kv_bytes, cfg)
}

/// As [`patch_from_deficit`], from the per-layer (K, V) SVDs of the deficit (one decomposition
/// serves every rank policy).
pub fn patch_from_svds(
    svds: &[(Svd, Svd)],
    n: usize,
    layout: &KvLayout,
    kv_bytes: usize,
    cfg: &PatchConfig,
) -> Result<Patch> {
    patch_from_weighted_svds(svds, None, n, layout, kv_bytes, cfg)
}

/// The weighted form of [`patch_from_deficit`]: each deficit matrix factored under its
/// attention weights ([`Svd::compute_weighted`]), the ranks picked from the weighted spectra,
/// and with `cfg.refit` the quantised factors refitted under the token weights.
pub fn patch_from_deficit_weighted(
    d: &Deficit,
    weights: &PatchWeights,
    layout: &KvLayout,
    kv_bytes: usize,
    cfg: &PatchConfig,
) -> Result<Patch> {
    const OP: &str = "patch_from_deficit_weighted";
    if d.layers.len() != layout.n_layers || weights.layers.len() != layout.n_layers {
        return Err(shape(
            OP,
            "deficit / weight layers",
            layout.n_layers,
            format!("{} / {}", d.layers.len(), weights.layers.len()),
        ));
    }
    let svds: Vec<(Svd, Svd)> = d
        .layers
        .par_iter()
        .zip(&weights.layers)
        .map(|((k, v), (wk, wv))| Ok((Svd::compute_weighted(k, wk)?, Svd::compute_weighted(v, wv)?)))
        .collect::<Result<_>>()?;
    patch_from_weighted_svds(&svds, Some(weights), d.n_tokens(), layout, kv_bytes, cfg)
}

/// As [`patch_from_svds`], from SVDs computed under `weights` (their token weights are what a
/// refit of quantised factors weighs by; `None`: unweighted).
pub fn patch_from_weighted_svds(
    svds: &[(Svd, Svd)],
    weights: Option<&PatchWeights>,
    n: usize,
    layout: &KvLayout,
    kv_bytes: usize,
    cfg: &PatchConfig,
) -> Result<Patch> {
    if cfg.basis.is_some() {
        return Err(invalid(
            "patch_from_svds",
            "patch config",
            "transform coding codes the dense deficit (patch_from_deficit)",
        ));
    }
    let ranks = policy_ranks(svds, n, layout, kv_bytes, cfg)?;
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
    let patch = Patch::new(*layout, n, layers)?;
    match cfg.quant {
        Quant::None => Ok(patch),
        q => patch.quantise_rows(q, cfg.grain, cfg.refit, weights),
    }
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
