//! How a method's chunk KV is formed from a prepared task: the deficits' spectra, each patch
//! spec's patches, the assembled (relocated, patched) region, and the oracle and selective
//! recompute baselines.

use std::time::Instant;

use kamera_model::{Context, Selection};
use kamera_ops::{ChunkKv, DType, Deficit, Patch, PatchWeights, Placement, Svd, assemble};

use crate::deficit::ChunkDeficit;
use crate::error::{ModelCtx, OpsCtx, Result, invalid};
use crate::evaluator::{Evaluator, Formed, Prepared, Spectra, ms, store_kv_bytes, stored_bytes};
use crate::klt::klt_patch;
use crate::kv::{splice, token_deviation, top_k};
use crate::method::PatchSpec;
use crate::mixed::{mixed_patch, widest};
use crate::qcal::domain_patch;
use crate::tail::tail_patch;
use crate::task_result::{TaskMethod, method_cost};

impl Evaluator<'_> {
    pub(crate) fn spectra(&self, p: &Prepared, conditioned: &[Vec<ChunkKv>]) -> Result<Spectra> {
        let t = Instant::now();
        let rope = self.model.rope();
        let mut deficits = Vec::new();
        let mut svds = Vec::new();
        for (conds, canon) in conditioned.iter().zip(&p.canon) {
            let ds = conds
                .iter()
                .map(|c| kamera_ops::deficit(c, canon, rope))
                .collect::<kamera_ops::Result<Vec<_>>>()
                .ops("deficit")?;
            let d = Deficit::mean(&ds).ops("deficit mean")?;
            let s = d
                .layers
                .iter()
                .map(|(k, v)| Ok((Svd::compute(k)?, Svd::compute(v)?)))
                .collect::<kamera_ops::Result<Vec<_>>>()
                .ops("deficit svd")?;
            deficits.push(d);
            svds.push(s);
        }
        Ok(Spectra {
            svds,
            deficits,
            ms: ms(t),
        })
    }

    /// One patch per chunk under `spec`, from per-chunk deficit SVDs, with the time it took.
    pub(crate) fn spec_patches(
        &self,
        p: &Prepared,
        svds: &[Vec<(Svd, Svd)>],
        weights: Option<&[PatchWeights]>,
        rank_svds: Option<&[Vec<(Svd, Svd)>]>,
        spec: &PatchSpec,
    ) -> Result<(Vec<Formed>, f64)> {
        let t = Instant::now();
        let cfg = spec.config();
        let klt_basis = match (spec.klt, self.cfg.deficit_basis.as_deref()) {
            (false, _) => None,
            (true, Some(b)) => Some(b),
            (true, None) => {
                return Err(invalid(
                    "klt codes the deficit in the per-model basis of --deficit-basis",
                ));
            }
        };
        let patches = svds
            .iter()
            .zip(&p.canon)
            .enumerate()
            .map(|(i, (s, c))| {
                let w = weights.map(|w| &w[i]);
                let (n, kv) = (c.n_tokens(), store_kv_bytes(c));
                // Layer gains from the spectra the ranks come from.
                let rank_from = rank_svds.map_or(s, |r| &r[i]);
                let cfg = kamera_ops::PatchConfig {
                    rank: spec.alloc.policy(
                        &cfg.rank,
                        c,
                        rank_from,
                        &self.model.config().local_layers,
                        &self.cfg.layer_sensitivity,
                    )?,
                    ..cfg.clone()
                };
                // Ranks from other spectra (the plain ones) than the factors' own.
                let cfg = match rank_svds {
                    Some(r) => kamera_ops::PatchConfig {
                        rank: kamera_ops::RankPolicy::PerLayerKv(
                            kamera_ops::policy_ranks(&r[i], n, c.layout(), kv, &cfg).ops("patch ranks")?,
                        ),
                        drop_below: 0.0,
                        ..cfg
                    },
                    None => cfg,
                };
                if spec.weighting.k_cols_cal && !spec.weighting.cal_raw && cfg.quant != kamera_ops::Quant::None {
                    if spec.tail.is_some() {
                        return Err(invalid(
                            "wq=cal with quantised factors stores them weighted; no mixed-bit tails",
                        ));
                    }
                    let w = w.ok_or_else(|| invalid("wq=cal needs its weights"))?;
                    let (patch, bytes) = domain_patch(s, w, n, c.layout(), kv, &cfg)?;
                    return Ok((patch, Some(bytes)));
                }
                let deficit = ChunkDeficit {
                    svds: s,
                    weights: w,
                    n,
                    layout: c.layout(),
                    kv_bytes: kv,
                };
                if let Some(basis) = klt_basis {
                    return Ok((klt_patch(&deficit, &cfg, basis, spec.klt_entropy)?, None));
                }
                if let Some((form, count)) = spec.mixed {
                    let sens = &self.cfg.layer_sensitivity;
                    if sens.is_empty() && !form.auto() {
                        return Err(invalid("m8, d8 and d4 pick their matrices from --layer-sensitivity"));
                    }
                    // da4's budget picks its own matrices.
                    let chosen = if form.auto() {
                        vec![(false, false); s.len()]
                    } else {
                        widest(sens, count)
                    };
                    let (patch, bytes) = mixed_patch(&deficit, &cfg, (form, &chosen))?;
                    return Ok((patch, Some(bytes)));
                }
                if let Some(tail) = spec.tail {
                    let (patch, bytes) = tail_patch(&deficit, &cfg, tail)?;
                    return Ok((patch, Some(bytes)));
                }
                kamera_ops::patch_from_weighted_svds(s, w, n, c.layout(), kv, &cfg)
                    .map(Patch::compact_spectra)
                    .map(|p| (p, None))
                    .ops("patch formation")
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((patches, ms(t)))
    }

    /// Assembles the chunks in `order` (indices into the task's chunks), each with its patch,
    /// returning the region and the time it took.
    pub(crate) fn assemble(&self, p: &Prepared, order: &[usize], patches: &[Option<&Patch>]) -> Result<(ChunkKv, f64)> {
        let t = Instant::now();
        let parts: Vec<Placement<'_>> = order
            .iter()
            .zip(patches)
            .map(|(&c, pt)| Placement {
                chunk: &p.canon[c],
                patch: *pt,
            })
            .collect();
        let kv = assemble(&parts, self.model.rope(), p.start, DType::F32).ops("assemble")?;
        Ok((kv, ms(t)))
    }

    /// The context with each chunk's patch (none where `None`); a patch's record bytes are its
    /// kamera-store encoding unless given (a simulated type the codec does not have).
    pub(crate) fn patched(
        &self,
        p: &Prepared,
        patches: &[Option<&Formed>],
        patch_ms: f64,
    ) -> Result<(Context, TaskMethod)> {
        let order: Vec<usize> = (0..p.canon.len()).collect();
        let refs: Vec<Option<&Patch>> = patches.iter().map(|x| x.map(|(x, _)| x)).collect();
        let (kv, t) = self.assemble(p, &order, &refs)?;
        let each = patches
            .iter()
            .map(|x| match x {
                None => Ok(0),
                Some((x, b)) => b.map_or_else(|| stored_bytes([x]), Ok),
            })
            .collect::<Result<Vec<_>>>()?;
        let bytes: usize = each.iter().sum();
        let mut cost = method_cost(1.0 + bytes as f64 / p.canon_bytes as f64, t, patch_ms, 0.0);
        for ((patch, &canon), &b) in patches.iter().zip(&p.chunk_bytes).zip(&each) {
            if patch.is_some_and(|(x, _)| x.ranks().iter().any(|&(k, v)| k + v > 0)) {
                let r = b as f64 / canon as f64;
                cost.chunk_bytes_max = cost.chunk_bytes_max.max(r);
            }
        }
        Ok((self.with_region(p, &kv)?, cost))
    }

    /// Oracle token selection: the `fraction` most-deviating tokens of each chunk.
    pub(crate) fn oracle_region(&self, p: &Prepared, fraction: f64) -> Result<ChunkKv> {
        let dev = token_deviation(&p.conditioned, &p.blind);
        let mut take = Vec::new();
        for (c, &o) in p.chunk_toks.iter().zip(&p.offs) {
            let k = (fraction * c.len() as f64).ceil() as usize;
            take.extend(top_k(&dev[o..o + c.len()], k).into_iter().map(|i| i + o));
        }
        splice(&p.blind, &p.conditioned, &take)
    }

    pub(crate) fn selective(&self, p: &Prepared, sel: Selection) -> Result<(Context, TaskMethod)> {
        let toks: Vec<u32> = p.chunk_toks.concat();
        let t = Instant::now();
        let out = self
            .model
            .selective_recompute(&toks, &p.sys_ctx, &p.blind, &sel)
            .model("selective recompute")?;
        let t = ms(t) + p.blind_ms;
        let share = out.selected.len() as f64 / toks.len() as f64;
        Ok((self.with_region(p, &out.chunk)?, method_cost(1.0, t, 0.0, share)))
    }
}
