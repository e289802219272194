//! The executor: the one runner of plans. It holds the window's KV per resident chunk (each with
//! a version), stages canonical KV read from the store, runs every [`Step`] through an
//! [`Encoder`] (the model) and a [`ChunkStore`], and queues the plan's background steps until
//! [`Executor::settle`]. It makes no decision of its own: the window plans, the cost model
//! prices, this runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use kamera_ops::{ChunkKv, DType, PatchConfig};
use kamera_store::{Body, ChunkId, ChunkStore, Key, ModelFp, Record};

use crate::cost::CostModel;
use crate::encoder::{BoxError, Encoder, Part, Prior, Timings};
use crate::error::{Error, Result};
use crate::plan::{OrbitKey, Plan, Step};
use crate::version::{Resident, Versions};

/// Executor settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecConfig {
    pub model: ModelFp,
    /// Rank policy and factor dtype of patches formed.
    pub patch: PatchConfig,
    /// Storage dtype of the window's KV.
    pub dtype: DType,
}

impl ExecConfig {
    /// Patches as the cost model chooses them ([`CostModel::patch_config`]).
    pub fn new(model: ModelFp, cost: &CostModel, dtype: DType) -> ExecConfig {
        ExecConfig {
            model,
            patch: cost.patch_config(),
            dtype,
        }
    }
}

/// Work done since the executor was made, for reports and tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecStats {
    pub prefills: u64,
    pub prefill_tokens: u64,
    /// Of those, tokens of background steps (canonical KV alone, repairs).
    pub background_prefill_tokens: u64,
    pub placed_tokens: u64,
    pub relocated_tokens: u64,
    pub patches_formed: u64,
    pub patches_applied: u64,
    pub orbit_patches_formed: u64,
    /// Canonical records kept from resident KV (no forward pass).
    pub kept: u64,
    /// KV bytes written into resident chunks (prefills, placements, relocations).
    pub bytes_moved: u64,
    /// Time by kind of work, foreground and background together.
    pub time: Timings,
    /// Of that, the background steps' own time,
    pub background_ms: f64,
    /// and by kind of work (repairs and canonical KV alone as prefill, SVDs as patch).
    pub background: Timings,
}

/// A chunk's canonical KV as staged: the store's record itself (shared, not copied out of it) or
/// a prefill's output wrapped as one.
#[derive(Debug, Clone)]
struct Canonical(Arc<Record>);

impl Canonical {
    fn new(rec: Arc<Record>) -> Option<Canonical> {
        matches!(rec.body, Body::Kv(_)).then_some(Canonical(rec))
    }
}

impl std::ops::Deref for Canonical {
    type Target = ChunkKv;
    fn deref(&self) -> &ChunkKv {
        match &self.0.body {
            Body::Kv(kv) => kv,
            Body::Patch(_) => unreachable!("Canonical::new admits KV records only"),
        }
    }
}

/// Executes plans; holds the resident KV of each chunk at its window position.
pub struct Executor<E, S> {
    enc: E,
    store: S,
    cfg: ExecConfig,
    staged: BTreeMap<ChunkId, Canonical>,
    encode_us: BTreeMap<ChunkId, u64>,
    /// Conditioned KV a `FormPatch` computed, exact where it was computed: the `Place` after it
    /// uses it instead of canonical + the patch that approximates it.
    exact: BTreeMap<ChunkId, Resident>,
    resident: BTreeMap<ChunkId, Resident>,
    queued: Vec<Step>,
    /// The resident KV a queued `StorePatch` reads, as it was when its plan ran (later plans may
    /// move or evict the chunk before the background step runs).
    snapshots: BTreeMap<Key, ChunkKv>,
    versions: Versions,
    pub stats: ExecStats,
}

fn runner(op: &'static str) -> impl FnOnce(BoxError) -> Error {
    move |source| Error::Runner { op, source }
}
fn store_err(op: &'static str) -> impl FnOnce(kamera_store::Error) -> Error {
    move |source| Error::Store { op, source }
}
fn ops_err(op: &'static str) -> impl FnOnce(kamera_ops::Error) -> Error {
    move |source| Error::Ops { op, source }
}
fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl<E: Encoder, S: ChunkStore> Executor<E, S> {
    pub fn new(enc: E, store: S, cfg: ExecConfig) -> Executor<E, S> {
        Executor {
            enc,
            store,
            cfg,
            staged: BTreeMap::new(),
            encode_us: BTreeMap::new(),
            exact: BTreeMap::new(),
            resident: BTreeMap::new(),
            queued: Vec::new(),
            snapshots: BTreeMap::new(),
            versions: Versions::default(),
            stats: ExecStats::default(),
        }
    }
    pub fn encoder(&self) -> &E {
        &self.enc
    }
    pub fn encoder_mut(&mut self) -> &mut E {
        &mut self.enc
    }
    pub fn store(&self) -> &S {
        &self.store
    }
    pub fn config(&self) -> &ExecConfig {
        &self.cfg
    }
    /// Background steps waiting for [`Executor::settle`].
    pub fn queued(&self) -> &[Step] {
        &self.queued
    }

    /// The resident KV of `chunk` (at its window position).
    pub fn resident(&self, chunk: &ChunkId) -> Option<&ChunkKv> {
        self.resident.get(chunk).map(|r| &r.kv)
    }

    /// The resident chunks: (id, first position, tokens), by position.
    pub fn layout(&self) -> Vec<(ChunkId, i64, usize)> {
        let mut v: Vec<_> = self
            .resident
            .iter()
            .map(|(id, r)| (*id, r.kv.offset(), r.kv.n_tokens()))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }

    /// Where the resident KV ends (positions).
    pub fn end(&self) -> i64 {
        self.resident
            .iter()
            .map(|(id, r)| r.kv.offset() + self.enc.span(id, r.kv.n_tokens()))
            .max()
            .unwrap_or(0)
    }

    /// The window's KV (positions `0..end`) as one chunk.
    pub fn window_kv(&self) -> Result<Option<ChunkKv>> {
        self.prior("Executor::window_kv", self.end())?
            .assemble(self.enc.rope(), self.cfg.dtype)
            .map_err(ops_err("Executor::window_kv"))
    }

    fn prior(&self, op: &'static str, at: i64) -> Result<Prior<'_>> {
        prior_of(&self.resident, &self.enc, op, at)
    }

    /// Makes the encoder's live context hold the window's KV of positions `0..at` (before a
    /// model call on the window), timed.
    pub fn sync(&mut self, at: i64) -> Result<f64> {
        let t = Instant::now();
        let prior = prior_of(&self.resident, &self.enc, "sync", at)?;
        self.enc.sync(&prior).map_err(runner("sync"))?;
        let dt = ms(t);
        self.stats.time.sync_ms += dt;
        Ok(dt)
    }

    fn set_resident(&mut self, chunk: ChunkId, r: Resident) {
        self.stats.bytes_moved += r.kv.kv_bytes() as u64;
        self.resident.insert(chunk, r);
    }

    fn canonical(&mut self, op: &'static str, chunk: ChunkId) -> Result<Canonical> {
        if let Some(kv) = self.staged.get(&chunk) {
            return Ok(kv.clone());
        }
        let key = Key::canonical(self.cfg.model, chunk);
        let rec = self.store.lookup(&key).map_err(store_err(op))?;
        let kv = rec
            .and_then(Canonical::new)
            .ok_or_else(|| Error::chunk(op, &chunk, "has no usable canonical KV in the store (re-insert it)"))?;
        self.staged.insert(chunk, kv.clone());
        Ok(kv)
    }

    /// Tells the encoder of the run of prefills in place that starts at `steps[i]`, when two or
    /// more follow one another there ([`Encoder::ahead`]: it may make them in one model call).
    fn announce(&mut self, steps: &[Step], i: usize) {
        let in_place = |s: &Step| match s {
            Step::Prefill {
                chunk,
                at,
                alone: false,
            } => Some((*chunk, *at)),
            _ => None,
        };
        if i > 0 && in_place(&steps[i - 1]).is_some() {
            return;
        }
        let run: Vec<(ChunkId, i64)> = steps[i..].iter().map_while(in_place).collect();
        if run.len() >= 2 {
            self.enc.ahead(&run);
        }
    }

    /// `chunk` prefilled at `at` after the resident KV of `0..at`.
    fn prefill_after(&mut self, op: &'static str, chunk: ChunkId, at: i64) -> Result<Resident> {
        let prior = prior_of(&self.resident, &self.enc, op, at)?;
        let version = self.versions.prefilled(chunk, at, &prior);
        let kv = self.enc.prefill_after(chunk, at, &prior, version).map_err(runner(op))?;
        self.count_prefill(&kv);
        Ok(Resident::made(kv, version))
    }

    fn count_prefill(&mut self, kv: &ChunkKv) {
        self.stats.prefills += 1;
        self.stats.prefill_tokens += kv.n_tokens() as u64;
    }

    /// Executes `plan`'s steps in order and queues its background steps for
    /// [`Executor::settle`]. The time by kind of work is returned (and added to the stats).
    pub fn run(&mut self, plan: &Plan) -> Result<Timings> {
        self.run_in(plan, &plan.steps, 0)
    }

    /// [`Executor::run`] of each plan in order, with nothing run between them (plans held until
    /// one model read): a run of prefills in place that goes on from one plan into the next is
    /// announced whole ([`Encoder::ahead`]).
    pub fn run_all(&mut self, plans: &[Plan]) -> Result<Timings> {
        let steps: Vec<Step> = plans.iter().flat_map(|p| p.steps.iter().cloned()).collect();
        let mut t = Timings::default();
        let mut first = 0;
        for plan in plans {
            t.add(&self.run_in(plan, &steps, first)?);
            first += plan.steps.len();
        }
        Ok(t)
    }

    /// [`Executor::run`] of `plan`, whose steps are `steps[first..]` (what follows them there
    /// runs next: announced runs of prefills may go on into it).
    fn run_in(&mut self, plan: &Plan, steps: &[Step], first: usize) -> Result<Timings> {
        let mut t = Timings::default();
        let result = plan.steps.iter().enumerate().try_for_each(|(i, s)| {
            tracing::debug!(step = %s, "execute");
            self.announce(steps, first + i);
            self.step(s, &mut t)
        });
        self.staged.clear();
        self.exact.clear();
        self.stats.time.add(&t);
        result?;
        // A StorePatch reads the chunk's KV as this plan left it, unless a background prefill
        // in place before it (a repair) makes that KV first: then it reads the resident KV when
        // it runs, after that prefill.
        for (i, s) in plan.background.iter().enumerate() {
            let remade = |c: &ChunkId| {
                plan.background[..i]
                    .iter()
                    .any(|p| matches!(p, Step::Prefill { chunk, alone: false, .. } if chunk == c))
            };
            if let Step::StorePatch { chunk, key } = s
                && !remade(chunk)
                && let Some(r) = self.resident.get(chunk)
            {
                self.snapshots.insert(*key, r.kv.clone());
            }
        }
        self.queued.extend(plan.background.iter().cloned());
        Ok(t)
    }

    /// Runs `plan` and then everything queued, its background steps included: for a caller with
    /// nothing to overlap them with (tools, tests).
    pub fn run_now(&mut self, plan: &Plan) -> Result<Timings> {
        let mut t = self.run(plan)?;
        t.add(&self.settle()?);
        Ok(t)
    }

    /// Runs the queued background steps (in the order the plans queued them).
    pub fn settle(&mut self) -> Result<Timings> {
        self.settle_until(&|| false)
    }

    /// Runs the queued background steps in order until `stop` says so at a point where what is
    /// left may wait for a later settle: patches formed from a snapshot of the KV they read
    /// ([`Step::StorePatch`], an SVD that no later plan's layout changes). Those stay queued; a
    /// placement that needs one of them runs it first. Everything else (repairs, canonical KV
    /// formed alone) runs to its end. A worker with a budget of its own, or one cancelled when
    /// the browser is done, passes its `stop`.
    pub fn settle_until(&mut self, stop: &dyn Fn() -> bool) -> Result<Timings> {
        let mut t = Timings::default();
        let steps = std::mem::take(&mut self.queued);
        let t0 = Instant::now();
        let prefilled = self.stats.prefill_tokens;
        let mut done = 0;
        let mut result = Ok(());
        for (i, s) in steps.iter().enumerate() {
            if stop() && steps[done..].iter().all(|s| self.may_wait(s)) {
                break;
            }
            tracing::debug!(step = %s, "execute later");
            self.announce(&steps, i);
            result = self.step(s, &mut t);
            done += 1;
            if result.is_err() {
                break;
            }
        }
        let left = &steps[done..];
        if result.is_ok() && !left.is_empty() {
            tracing::debug!(steps = left.len(), "background steps left for a later settle");
            self.queued = left.to_vec();
        } else {
            self.snapshots.clear();
        }
        self.staged.clear();
        self.exact.clear();
        self.stats.background_prefill_tokens += self.stats.prefill_tokens - prefilled;
        self.stats.background_ms += ms(t0);
        self.stats.background.add(&t);
        self.stats.time.add(&t);
        result?;
        Ok(t)
    }

    /// Whether every queued step may wait past the next plans (none reads the current layout):
    /// then the window may be rebuilt under them ([`crate::Window::materialize`]).
    pub fn queue_may_wait(&self) -> bool {
        self.queued.iter().all(|s| self.may_wait(s))
    }

    /// Whether a queued step may wait past the next plans: a patch formed from its snapshot.
    fn may_wait(&self, s: &Step) -> bool {
        matches!(s, Step::StorePatch { key, .. } if self.snapshots.contains_key(key))
    }

    /// Runs the queued step that forms `key` now, if one is queued (a placement needs it).
    fn form_queued(&mut self, key: &Key, t: &mut Timings) -> Result<()> {
        let Some(i) = self
            .queued
            .iter()
            .position(|s| matches!(s, Step::StorePatch { key: k, .. } if k == key))
        else {
            return Ok(());
        };
        let s = self.queued.remove(i);
        let t0 = Instant::now();
        let mut own = Timings::default();
        self.step(&s, &mut own)?;
        self.stats.background_ms += ms(t0);
        self.stats.background.add(&own);
        t.add(&own);
        Ok(())
    }

    // Long: one match arm per plan step (the executor's whole instruction set).
    fn step(&mut self, step: &Step, t: &mut Timings) -> Result<()> {
        let model = self.cfg.model;
        let t0 = Instant::now();
        match step {
            Step::Prefill { chunk, alone: true, .. } => {
                let kv = self.enc.prefill_alone(*chunk).map_err(runner("prefill alone"))?;
                self.count_prefill(&kv);
                self.encode_us.insert(*chunk, t0.elapsed().as_micros() as u64);
                let rec = Record::kv(self.cfg.model, 0, kv);
                self.staged.insert(*chunk, Canonical(Arc::new(rec)));
                self.versions.new_canonical(*chunk);
                t.prefill_ms += ms(t0);
            }
            Step::Prefill {
                chunk,
                at,
                alone: false,
            } => {
                let r = self.prefill_after("prefill in place", *chunk, *at)?;
                self.set_resident(*chunk, r);
                t.prefill_ms += ms(t0);
            }
            Step::StoreCanonical { chunk } => {
                let kv = self.canonical("store", *chunk)?;
                let cost = self.encode_us.get(chunk).copied().unwrap_or(0);
                let rec = Record::kv(model, cost, (*kv).clone());
                self.store
                    .put(&Key::canonical(model, *chunk), rec)
                    .map_err(store_err("store"))?;
                t.place_ms += ms(t0);
            }
            Step::KeepCanonical { chunk, exact } => {
                self.keep_canonical(*chunk, exact.as_ref())?;
                t.place_ms += ms(t0);
            }
            Step::Recall { chunk } => {
                self.staged.remove(chunk);
                self.canonical("recall", *chunk)?;
                t.place_ms += ms(t0);
            }
            Step::FormPatch { chunk, key, at } => {
                let canon = self.canonical("form-patch", *chunk)?;
                let cond = self.prefill_after("conditioned prefill", *chunk, *at)?;
                self.put_patch("form-patch", key, &cond.kv, &canon, t0)?;
                self.exact.insert(*chunk, cond);
                t.patch_ms += ms(t0);
            }
            Step::StorePatch { chunk, key } => {
                let canon = self.canonical("store-patch", *chunk)?;
                let placed = match self.snapshots.remove(key) {
                    Some(kv) => kv,
                    None => self
                        .resident
                        .get(chunk)
                        .ok_or_else(|| Error::chunk("store-patch", chunk, "is not resident"))?
                        .kv
                        .clone(),
                };
                self.put_patch("store-patch", key, &placed, &canon, t0)?;
                t.patch_ms += ms(t0);
            }
            Step::FormOrbit {
                keys, orderings, at, ..
            } => {
                self.form_orbit(keys, orderings, *at)?;
                t.patch_ms += ms(t0);
            }
            Step::Place { chunk, at, patch } => {
                if let Some(r) = self.exact.remove(chunk).filter(|r| r.kv.offset() == *at) {
                    self.stats.placed_tokens += r.kv.n_tokens() as u64;
                    self.set_resident(*chunk, r);
                    t.place_ms += ms(t0);
                    return Ok(());
                }
                if let Some(key) = patch {
                    self.form_queued(key, t)?;
                }
                let canon = self.canonical("place", *chunk)?;
                let rec = match patch {
                    Some(key) => Some(
                        self.store
                            .lookup(key)
                            .map_err(store_err("place"))?
                            .filter(|r| r.as_patch().is_some())
                            .ok_or_else(|| Error::chunk("place", chunk, format!("patch {key} is not in the store")))?,
                    ),
                    None => None,
                };
                let p = rec.as_ref().and_then(|r| r.as_patch());
                let placed = self
                    .enc
                    .reuse(&canon, p, *at, self.cfg.dtype)
                    .map_err(runner("place"))?;
                self.stats.placed_tokens += placed.n_tokens() as u64;
                self.stats.patches_applied += u64::from(p.is_some());
                let v = self.versions.placed(*chunk, *at, patch.as_ref());
                self.set_resident(*chunk, Resident::made(placed, v));
                t.place_ms += ms(t0);
            }
            Step::Relocate { chunk, delta } => {
                let r = self
                    .resident
                    .get(chunk)
                    .ok_or_else(|| Error::chunk("relocate", chunk, "is not resident"))?;
                let moved = self
                    .enc
                    .reuse(&r.kv, None, r.kv.offset() + delta, r.kv.dtype())
                    .map_err(runner("relocate"))?;
                self.stats.relocated_tokens += moved.n_tokens() as u64;
                let moved = r.moved(moved);
                self.set_resident(*chunk, moved);
                t.place_ms += ms(t0);
            }
            Step::EvictToStore { chunk } => {
                if self.resident.remove(chunk).is_none() {
                    return Err(Error::chunk("evict", chunk, "is not resident"));
                }
            }
            Step::DropTail { .. } => {}
        }
        Ok(())
    }

    /// Stores the resident KV of `chunk`, relocated to 0, as its canonical record, unless the
    /// store holds one (a record already there is never replaced: patches are formed against it).
    /// Where `exact` names the context the resident KV is exact in, a rank-0 patch is stored
    /// under it too (only when the record is written here: it is exact for this record alone).
    fn keep_canonical(&mut self, chunk: ChunkId, exact: Option<&Key>) -> Result<()> {
        const OP: &str = "keep";
        let key = Key::canonical(self.cfg.model, chunk);
        if self.store.contains(&key).map_err(store_err(OP))? {
            return Ok(());
        }
        let kv = &self
            .resident
            .get(&chunk)
            .ok_or_else(|| Error::chunk(OP, &chunk, "is not resident"))?
            .kv;
        let t = Instant::now();
        let at0 = self.enc.reuse(kv, None, 0, kv.dtype()).map_err(runner(OP))?;
        let cost = t.elapsed().as_micros() as u64;
        let (layout, n) = (*at0.layout(), at0.n_tokens());
        self.store
            .put(&key, Record::kv(self.cfg.model, cost, at0))
            .map_err(store_err(OP))?;
        self.versions.new_canonical(chunk);
        if let Some(k) = exact {
            let zero = kamera_ops::Patch::zero(layout, n);
            self.store
                .put(k, Record::patch(self.cfg.model, cost, zero))
                .map_err(store_err(OP))?;
        }
        self.stats.kept += 1;
        Ok(())
    }

    /// Forms the patch taking `canon` to `cond` and stores it under `key`.
    fn put_patch(&mut self, op: &'static str, key: &Key, cond: &ChunkKv, canon: &ChunkKv, t0: Instant) -> Result<()> {
        let patch = kamera_ops::form_patch(cond, canon, self.enc.rope(), &self.cfg.patch).map_err(ops_err(op))?;
        let cost = t0.elapsed().as_micros() as u64;
        self.store
            .put(key, Record::patch(self.cfg.model, cost, patch))
            .map_err(store_err(op))?;
        self.stats.patches_formed += 1;
        Ok(())
    }

    /// The orbit patches `keys` of a set: the set prefilled after the resident KV of `0..at`
    /// under each ordering (as temporary chunks), each key's deficits (every ordering, or those
    /// putting its chunk at its slot) averaged.
    fn form_orbit(&mut self, keys: &[OrbitKey], orderings: &[Vec<ChunkId>], at: i64) -> Result<()> {
        const OP: &str = "form-orbit";
        let t0 = Instant::now();
        let mut cond: BTreeMap<ChunkId, Vec<ChunkKv>> = BTreeMap::new();
        for ordering in orderings {
            let mut temps: Vec<(ChunkId, Resident)> = Vec::new();
            let mut pos = at;
            for c in ordering {
                let (kv, version) = {
                    let mut prior = prior_of(&self.resident, &self.enc, OP, at)?;
                    prior.parts.extend(temps.iter().map(|(id, r)| Part {
                        chunk: *id,
                        version: r.version,
                        kv: &r.kv,
                    }));
                    prior.end = pos;
                    let version = self.versions.prefilled(*c, pos, &prior);
                    let kv = self.enc.prefill_after(*c, pos, &prior, version).map_err(runner(OP))?;
                    (kv, version)
                };
                self.count_prefill(&kv);
                pos += self.enc.span(c, kv.n_tokens());
                cond.entry(*c).or_default().push(kv.clone());
                temps.push((*c, Resident::made(kv, version)));
            }
        }
        let cost = t0.elapsed().as_micros() as u64 / keys.len().max(1) as u64;
        for k in keys {
            let canon = self.canonical(OP, k.chunk)?;
            // cond[c][i] is c's KV under orderings[i].
            let conds: Vec<ChunkKv> = k.covered(cond.get(&k.chunk).map(Vec::as_slice).unwrap_or_default(), orderings);
            let patch =
                kamera_ops::orbit_patch(&conds, &canon, self.enc.rope(), &self.cfg.patch).map_err(ops_err(OP))?;
            self.store
                .put(&k.key, Record::patch(self.cfg.model, cost, patch))
                .map_err(store_err(OP))?;
            self.stats.orbit_patches_formed += 1;
        }
        Ok(())
    }
}

/// The resident KV of positions `0..at`, which must be tiled exactly by resident chunks.
fn prior_of<'a, E: Encoder>(
    resident: &'a BTreeMap<ChunkId, Resident>,
    enc: &E,
    op: &'static str,
    at: i64,
) -> Result<Prior<'a>> {
    let mut parts: Vec<Part<'a>> = resident
        .iter()
        .filter(|(_, r)| r.kv.offset() < at)
        .map(|(id, r)| Part {
            chunk: *id,
            version: r.version,
            kv: &r.kv,
        })
        .collect();
    parts.sort_by_key(|p| p.kv.offset());
    let mut pos = 0;
    for p in &parts {
        if p.kv.offset() != pos {
            return Err(Error::Invalid {
                op,
                detail: format!("resident KV does not tile 0..{at}: gap or overlap at {pos}"),
            });
        }
        pos += enc.span(&p.chunk, p.kv.n_tokens());
    }
    if pos != at {
        return Err(Error::Invalid {
            op,
            detail: format!("resident KV ends at {pos}, expected {at}"),
        });
    }
    Ok(Prior { parts, end: at })
}
