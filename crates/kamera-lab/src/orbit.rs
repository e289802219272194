//! Orbit patches in the harness: every sampled ordering of a task's chunk set is prefilled once
//! (its answer rows are that ordering's reference, its slices the chunks' conditioned KV), the
//! orbit variants form their patches from those deficits and are scored on every ordering.

use std::time::Instant;

use kamera_ops::{ChunkKv, Deficit, Patch, Svd, orbit_orderings};

use kamera_eval::{Scores, Task, score};

use crate::error::{ModelCtx, OpsCtx, Result, invalid};
use crate::evaluator::{Evaluator, Prepared, ms, store_kv_bytes, stored_bytes};
use crate::kv::slice;
use crate::method::{OrbitKind, PatchSpec};
use crate::task_result::{TaskMethod, finish, method_cost};

/// Everything the orbit methods of one task share.
pub(crate) struct OrbitState {
    orders: Vec<Vec<usize>>,
    /// `deficits[chunk][order]`, and the chunk's slot in that order.
    deficits: Vec<Vec<Deficit>>,
    slots: Vec<Vec<usize>>,
    ref_rows: Vec<Vec<f32>>,
    blind: Vec<Scores>,
    prefill_ms: f64,
    /// Mean deficits per chunk and their SVDs, per variant (Slot: per slot, index 0 unused).
    means: Vec<(OrbitKind, Vec<Option<MeanDeficit>>)>,
}

/// A mean deficit and its per-layer (K, V) SVDs.
type MeanDeficit = (Deficit, Vec<(Svd, Svd)>);

impl OrbitState {
    /// Orders whose deficits a variant averages, for chunk `c` at `slot` (Slot only).
    fn members(&self, kind: OrbitKind, c: usize, slot: usize) -> Vec<usize> {
        (0..self.orders.len())
            .filter(|&o| match kind {
                OrbitKind::Mean => true,
                OrbitKind::Later => self.slots[c][o] > 0,
                OrbitKind::Slot => self.slots[c][o] == slot,
                OrbitKind::Unseen => o > 0,
            })
            .collect()
    }
}

fn mean_of(ds: &[Deficit], members: &[usize]) -> Result<Option<Deficit>> {
    if members.is_empty() {
        return Ok(None);
    }
    let picked: Vec<Deficit> = members.iter().map(|&o| ds[o].clone()).collect();
    Deficit::mean(&picked).ops("orbit mean").map(Some)
}

impl Evaluator<'_> {
    /// Prefills every orbit ordering of the task's chunks (the task's own from `p`).
    pub(crate) fn orbit_state(&self, task: &Task, p: &Prepared) -> Result<OrbitState> {
        let n = p.chunk_toks.len();
        let mut h = self.cfg.seed ^ 0xcbf2_9ce4_8422_2325;
        for b in task.id.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        let orders = orbit_orderings(n, self.cfg.orbit_orderings, h);
        let rope = self.model.rope();
        let vocab = self.model.config().vocab;
        let t = Instant::now();
        let mut deficits: Vec<Vec<Deficit>> = vec![Vec::new(); n];
        let mut slots: Vec<Vec<usize>> = vec![Vec::new(); n];
        let (mut ref_rows, mut blind) = (Vec::new(), Vec::new());
        for (oi, o) in orders.iter().enumerate() {
            let (region, rows) = if oi == 0 {
                (p.conditioned.clone(), p.full_rows.clone())
            } else {
                let toks: Vec<u32> = o.iter().flat_map(|&i| p.chunk_toks[i].iter().copied()).collect();
                let pf = self.model.prefill(&toks, p.start, &p.sys_ctx).model("orbit prefill")?;
                let rows = self.answer_rows(p, &self.with_region(p, &pf.chunk)?)?;
                (pf.chunk, rows)
            };
            let mut at = 0;
            for (slot, &c) in o.iter().enumerate() {
                let len = p.chunk_toks[c].len();
                let cond: ChunkKv = slice(&region, at, len)?;
                deficits[c].push(kamera_ops::deficit(&cond, &p.canon[c], rope).ops("orbit deficit")?);
                slots[c].push(slot);
                at += len;
            }
            let (kv, _) = self.assemble(p, o, &vec![None; n])?;
            let b = self.answer_rows(p, &self.with_region(p, &kv)?)?;
            blind.push(score(&rows, &b, &p.answer, vocab));
            ref_rows.push(rows);
        }
        Ok(OrbitState {
            orders,
            deficits,
            slots,
            ref_rows,
            blind,
            prefill_ms: ms(t),
            means: Vec::new(),
        })
    }

    /// Mean deficits (with SVDs) of `kind` per chunk; for Slot, per (chunk, slot) at
    /// `chunk * n + slot`.
    fn orbit_means(&self, o: &mut OrbitState, kind: OrbitKind) -> Result<usize> {
        let key = kind;
        if let Some(i) = o.means.iter().position(|(k, _)| *k == key) {
            return Ok(i);
        }
        let n = o.deficits.len();
        let mut out = Vec::new();
        for c in 0..n {
            let slots: Vec<usize> = if kind == OrbitKind::Slot {
                (0..n).collect()
            } else {
                vec![0]
            };
            for s in slots {
                let members = o.members(kind, c, s);
                let d = match mean_of(&o.deficits[c], &members)? {
                    Some(d) if !(kind == OrbitKind::Slot && s == 0) => d,
                    _ => {
                        out.push(None);
                        continue;
                    }
                };
                let svds = d
                    .layers
                    .iter()
                    .map(|(k, v)| Ok((Svd::compute(k)?, Svd::compute(v)?)))
                    .collect::<kamera_ops::Result<Vec<_>>>()
                    .ops("orbit svd")?;
                out.push(Some((d, svds)));
            }
        }
        o.means.push((key, out));
        Ok(o.means.len() - 1)
    }

    /// Scores one orbit variant: its patches, every ordering it serves, its stored bytes.
    pub(crate) fn run_orbit(
        &self,
        p: &Prepared,
        o: &mut OrbitState,
        kind: OrbitKind,
        spec: &PatchSpec,
    ) -> Result<TaskMethod> {
        if kind == OrbitKind::Unseen && o.orders.len() < 2 {
            return Err(invalid("orbit-unseen needs --orbit-orderings >= 2"));
        }
        let t = Instant::now();
        let idx = self.orbit_means(o, kind)?;
        let n = o.deficits.len();
        let cfg = spec.config();
        // patches[c * width + s]
        let width = if kind == OrbitKind::Slot { n } else { 1 };
        let patches: Vec<Option<Patch>> = o.means[idx]
            .1
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let c = &p.canon[i / width];
                m.as_ref()
                    .map(|(_, svds)| {
                        kamera_ops::patch_from_svds(svds, c.n_tokens(), c.layout(), store_kv_bytes(c), &cfg)
                            .map(Patch::compact_spectra)
                    })
                    .transpose()
            })
            .collect::<kamera_ops::Result<_>>()
            .ops("orbit patch")?;
        let patch_ms = o.prefill_ms + ms(t);
        let evaluated: Vec<usize> = if kind == OrbitKind::Unseen {
            vec![0]
        } else {
            (0..o.orders.len()).collect()
        };
        let vocab = self.model.config().vocab;
        let (mut kl, mut top1, mut lp, mut blind_kl, mut asm_ms) = (0.0, 0.0, 0.0, 0.0, 0.0);
        let mut exact = true;
        for &oi in &evaluated {
            let order = &o.orders[oi];
            let chosen: Vec<Option<&Patch>> = order
                .iter()
                .enumerate()
                .map(|(slot, &c)| match kind {
                    OrbitKind::Mean | OrbitKind::Unseen => patches[c].as_ref(),
                    OrbitKind::Later if slot == 0 => None,
                    OrbitKind::Later => patches[c].as_ref(),
                    OrbitKind::Slot => patches[c * n + slot].as_ref(),
                })
                .collect();
            let (kv, a) = self.assemble(p, order, &chosen)?;
            let rows = self.answer_rows(p, &self.with_region(p, &kv)?)?;
            let s = score(&o.ref_rows[oi], &rows, &p.answer, vocab);
            kl += s.kl;
            top1 += s.top1;
            lp += s.answer_logprob;
            exact &= s.exact_match;
            blind_kl += o.blind[oi].kl;
            asm_ms += a;
        }
        let k = evaluated.len() as f64;
        let bytes = stored_bytes(patches.iter().flatten())?;
        let cost = method_cost(1.0 + bytes as f64 / p.canon_bytes as f64, asm_ms / k, patch_ms, 0.0);
        let s = Scores {
            kl: kl / k,
            top1: top1 / k,
            exact_match: exact,
            answer_logprob: lp / k,
        };
        Ok(finish(s, blind_kl / k, evaluated.len(), cost))
    }

    /// Per layer, over the chunks and orderings of the orbit, at full rank: the relative error
    /// ‖Δ − D‖²/‖Δ‖² of the mean (D = plain mean, later mean, slot mean) against each true
    /// deficit Δ of a chunk that is not first (K then V), then for a chunk that is first the
    /// energy of the plain mean it is given and of its true deficit, both over the mean energy
    /// of its deficits elsewhere (K, V). See [`crate::OrbitLayer`].
    pub(crate) fn orbit_diagnostics(&self, o: &mut OrbitState) -> Result<Vec<[f64; 10]>> {
        let ids = [
            self.orbit_means(o, OrbitKind::Mean)?,
            self.orbit_means(o, OrbitKind::Later)?,
            self.orbit_means(o, OrbitKind::Slot)?,
        ];
        let n = o.deficits.len();
        let n_layers = o.deficits.first().and_then(|d| d.first()).map_or(0, |d| d.layers.len());
        let sq = |x: &[f32]| x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>();
        let dist = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>();
        let mut out = vec![[0.0f64; 10]; n_layers];
        let mut counts = [0usize; 2];
        for c in 0..n {
            let later: Vec<usize> = o.members(OrbitKind::Later, c, 0);
            let firsts: Vec<usize> = (0..o.orders.len()).filter(|&oi| o.slots[c][oi] == 0).collect();
            counts[0] += later.len();
            counts[1] += if later.is_empty() { 0 } else { firsts.len() };
            for (l, row) in out.iter_mut().enumerate() {
                for ch in 0..2 {
                    let pick = |d: &Deficit| {
                        if ch == 0 {
                            d.layers[l].0.to_f32_vec()
                        } else {
                            d.layers[l].1.to_f32_vec()
                        }
                    };
                    let mean_d =
                        |id: usize, s: usize| -> Option<Vec<f32>> { o.means[id].1[s].as_ref().map(|(d, _)| pick(d)) };
                    let (dm, dl) = (mean_d(ids[0], c), mean_d(ids[1], c));
                    let mut e_later = 0.0;
                    for &oi in &later {
                        let t = pick(&o.deficits[c][oi]);
                        let e = sq(&t).max(1e-30);
                        e_later += e;
                        let ds = mean_d(ids[2], c * n + o.slots[c][oi]);
                        for (j, d) in [dm.as_ref(), dl.as_ref(), ds.as_ref()].into_iter().enumerate() {
                            row[3 * ch + j] += d.map_or(1.0, |d| dist(&t, d) / e);
                        }
                    }
                    if later.is_empty() {
                        continue;
                    }
                    let e_later = e_later / later.len() as f64;
                    for &oi in &firsts {
                        row[6 + ch] += dm.as_ref().map_or(0.0, |d| sq(d)) / e_later.max(1e-30);
                        row[8 + ch] += sq(&pick(&o.deficits[c][oi])) / e_later.max(1e-30);
                    }
                }
            }
        }
        for row in &mut out {
            for (j, x) in row.iter_mut().enumerate() {
                *x /= counts[usize::from(j >= 6)].max(1) as f64;
            }
        }
        Ok(out)
    }
}
