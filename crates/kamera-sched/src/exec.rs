//! A reference runner: executes plans against an [`Encoder`] (the model), a [`ChunkStore`] and
//! kamera-ops, holding the window's KV per resident chunk. A real runtime can execute plans on
//! another backend; this one is the executable meaning of every [`Step`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use kamera_ops::{ChunkKv, DType, KvLayout, PatchConfig, Placement, RopeSpec};
use kamera_store::{ChunkId, ChunkStore, Key, ModelFp, Record};

use crate::cost::CostModel;
use crate::error::{Error, Result};
use crate::plan::{Plan, Step};

/// A boxed error of the model runner.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The model side of a runner: encodes and prefills a chunk's content (known by its id).
pub trait Encoder {
    fn layout(&self) -> KvLayout;
    fn rope(&self) -> &RopeSpec;
    /// KV of `chunk`'s tokens at positions `at..`, after `context` (KV of positions `0..at`);
    /// `None` with `at == 0` prefills the chunk alone (its canonical KV).
    fn prefill(&mut self, chunk: ChunkId, at: i64, context: Option<&ChunkKv>) -> Result<ChunkKv, BoxError>;
}

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

/// Work done, for reports and tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecStats {
    pub prefills: u64,
    pub prefill_tokens: u64,
    pub placed_tokens: u64,
    pub relocated_tokens: u64,
    pub patches_formed: u64,
    pub orbit_patches_formed: u64,
    pub prefill_s: f64,
    pub place_s: f64,
    pub form_s: f64,
}

/// Executes plans; holds the resident KV of each chunk at its window position.
pub struct Executor<E, S> {
    enc: E,
    store: S,
    cfg: ExecConfig,
    staged: BTreeMap<ChunkId, Arc<ChunkKv>>,
    encode_us: BTreeMap<ChunkId, u64>,
    resident: BTreeMap<ChunkId, ChunkKv>,
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

impl<E: Encoder, S: ChunkStore> Executor<E, S> {
    pub fn new(enc: E, store: S, cfg: ExecConfig) -> Executor<E, S> {
        Executor {
            enc,
            store,
            cfg,
            staged: BTreeMap::new(),
            encode_us: BTreeMap::new(),
            resident: BTreeMap::new(),
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

    /// The resident KV of `chunk` (at its window position).
    pub fn resident(&self, chunk: &ChunkId) -> Option<&ChunkKv> {
        self.resident.get(chunk)
    }

    /// The resident chunks: (id, first position, tokens), by position.
    pub fn layout(&self) -> Vec<(ChunkId, i64, usize)> {
        let mut v: Vec<_> = self
            .resident
            .iter()
            .map(|(id, kv)| (*id, kv.offset(), kv.n_tokens()))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }

    /// The window's KV (positions `0..end`) as one chunk.
    pub fn window_kv(&self) -> Result<Option<ChunkKv>> {
        let end = self
            .resident
            .values()
            .map(|kv| kv.offset() + kv.n_tokens() as i64)
            .max()
            .unwrap_or(0);
        self.context(end)
    }

    /// The resident KV of positions `0..at`, which must be tiled exactly by resident chunks.
    fn context(&self, at: i64) -> Result<Option<ChunkKv>> {
        const OP: &str = "Executor::context";
        if at == 0 {
            return Ok(None);
        }
        let mut parts: Vec<&ChunkKv> = self.resident.values().filter(|kv| kv.offset() < at).collect();
        parts.sort_by_key(|kv| kv.offset());
        let mut pos = 0;
        for kv in &parts {
            if kv.offset() != pos {
                return Err(Error::Invalid {
                    op: OP,
                    detail: format!("resident KV does not tile 0..{at}: gap or overlap at {pos}"),
                });
            }
            pos += kv.n_tokens() as i64;
        }
        if pos != at {
            return Err(Error::Invalid {
                op: OP,
                detail: format!("resident KV ends at {pos}, expected {at}"),
            });
        }
        let placements: Vec<Placement<'_>> = parts.iter().map(|kv| Placement { chunk: kv, patch: None }).collect();
        let kv = kamera_ops::assemble(&placements, self.enc.rope(), 0, self.cfg.dtype).map_err(ops_err(OP))?;
        Ok(Some(kv))
    }

    fn canonical(&mut self, op: &'static str, chunk: ChunkId) -> Result<Arc<ChunkKv>> {
        if let Some(kv) = self.staged.get(&chunk) {
            return Ok(kv.clone());
        }
        let key = Key::canonical(self.cfg.model, chunk);
        let rec = self.store.lookup(&key).map_err(store_err(op))?;
        let kv = rec
            .as_ref()
            .and_then(|r| r.as_kv())
            .cloned()
            .ok_or_else(|| Error::chunk(op, &chunk, "has no usable canonical KV in the store (re-insert it)"))?;
        let kv = Arc::new(kv);
        self.staged.insert(chunk, kv.clone());
        Ok(kv)
    }

    fn prefill(&mut self, op: &'static str, chunk: ChunkId, at: i64, ctx: Option<&ChunkKv>) -> Result<ChunkKv> {
        let t = Instant::now();
        let kv = self.enc.prefill(chunk, at, ctx).map_err(runner(op))?;
        self.stats.prefills += 1;
        self.stats.prefill_tokens += kv.n_tokens() as u64;
        self.stats.prefill_s += t.elapsed().as_secs_f64();
        Ok(kv)
    }

    /// Executes every step of `plan` in order.
    pub fn run(&mut self, plan: &Plan) -> Result<()> {
        for step in &plan.steps {
            tracing::debug!(%step, "execute");
            self.step(step)?;
        }
        self.staged.clear();
        Ok(())
    }

    fn step(&mut self, step: &Step) -> Result<()> {
        let rope = self.enc.rope().clone();
        let model = self.cfg.model;
        match step {
            Step::Prefill { chunk, alone: true, .. } => {
                let t = Instant::now();
                let kv = self.prefill("prefill", *chunk, 0, None)?;
                self.encode_us.insert(*chunk, t.elapsed().as_micros() as u64);
                self.staged.insert(*chunk, Arc::new(kv));
            }
            Step::Prefill {
                chunk,
                at,
                alone: false,
            } => {
                let ctx = self.context(*at)?;
                let kv = self.prefill("prefill", *chunk, *at, ctx.as_ref())?;
                self.resident.insert(*chunk, kv);
            }
            Step::StoreCanonical { chunk } => {
                let kv = self.canonical("store", *chunk)?;
                let cost = self.encode_us.get(chunk).copied().unwrap_or(0);
                let rec = Record::kv(model, cost, (*kv).clone());
                self.store
                    .put(&Key::canonical(model, *chunk), rec)
                    .map_err(store_err("store"))?;
            }
            Step::Recall { chunk } => {
                self.staged.remove(chunk);
                self.canonical("recall", *chunk)?;
            }
            Step::FormPatch { chunk, key, at } => {
                let t = Instant::now();
                let canon = self.canonical("form-patch", *chunk)?;
                let ctx = self.context(*at)?;
                let cond = self.prefill("form-patch", *chunk, *at, ctx.as_ref())?;
                let patch =
                    kamera_ops::form_patch(&cond, &canon, &rope, &self.cfg.patch).map_err(ops_err("form-patch"))?;
                let cost = t.elapsed().as_micros() as u64;
                self.store
                    .put(key, Record::patch(model, cost, patch))
                    .map_err(store_err("form-patch"))?;
                self.stats.patches_formed += 1;
                self.stats.form_s += t.elapsed().as_secs_f64();
            }
            Step::StorePatch { chunk, key } => {
                let t = Instant::now();
                let canon = self.canonical("store-patch", *chunk)?;
                let placed = self
                    .resident
                    .get(chunk)
                    .ok_or_else(|| Error::chunk("store-patch", chunk, "is not resident"))?;
                let patch =
                    kamera_ops::form_patch(placed, &canon, &rope, &self.cfg.patch).map_err(ops_err("store-patch"))?;
                let cost = t.elapsed().as_micros() as u64;
                self.store
                    .put(key, Record::patch(model, cost, patch))
                    .map_err(store_err("store-patch"))?;
                self.stats.patches_formed += 1;
                self.stats.form_s += t.elapsed().as_secs_f64();
            }
            Step::FormOrbit {
                keys, orderings, at, ..
            } => {
                let t = Instant::now();
                let base = self.context(*at)?;
                let mut cond: BTreeMap<ChunkId, Vec<ChunkKv>> = BTreeMap::new();
                for ordering in orderings {
                    let mut ctx = base.clone();
                    let mut pos = *at;
                    for c in ordering {
                        let kv = self.prefill("form-orbit", *c, pos, ctx.as_ref())?;
                        pos += kv.n_tokens() as i64;
                        ctx = Some(match ctx {
                            None => kv.clone(),
                            Some(prev) => {
                                let parts = [
                                    Placement {
                                        chunk: &prev,
                                        patch: None,
                                    },
                                    Placement {
                                        chunk: &kv,
                                        patch: None,
                                    },
                                ];
                                kamera_ops::assemble(&parts, &rope, 0, self.cfg.dtype).map_err(ops_err("form-orbit"))?
                            }
                        });
                        cond.entry(*c).or_default().push(kv);
                    }
                }
                let cost = t.elapsed().as_micros() as u64 / keys.len().max(1) as u64;
                for k in keys {
                    let canon = self.canonical("form-orbit", k.chunk)?;
                    // cond[c][i] is c's KV under orderings[i].
                    let conds: Vec<ChunkKv> =
                        k.covered(cond.get(&k.chunk).map(Vec::as_slice).unwrap_or_default(), orderings);
                    let patch = kamera_ops::orbit_patch(&conds, &canon, &rope, &self.cfg.patch)
                        .map_err(ops_err("form-orbit"))?;
                    self.store
                        .put(&k.key, Record::patch(model, cost, patch))
                        .map_err(store_err("form-orbit"))?;
                    self.stats.orbit_patches_formed += 1;
                }
                self.stats.form_s += t.elapsed().as_secs_f64();
            }
            Step::Place { chunk, at, patch } => {
                let t = Instant::now();
                let canon = self.canonical("place", *chunk)?;
                let rec = match patch {
                    Some(key) => Some(
                        self.store
                            .lookup(key)
                            .map_err(store_err("place"))?
                            .ok_or_else(|| Error::chunk("place", chunk, format!("patch {key} is not in the store")))?,
                    ),
                    None => None,
                };
                let p = rec.as_ref().and_then(|r| r.as_patch());
                let mut dst =
                    ChunkKv::zeros(*canon.layout(), *at, canon.n_tokens(), self.cfg.dtype).map_err(ops_err("place"))?;
                kamera_ops::reuse_into(&canon, p, &rope, &mut dst, 0).map_err(ops_err("place"))?;
                self.resident.insert(*chunk, dst);
                self.stats.placed_tokens += canon.n_tokens() as u64;
                self.stats.place_s += t.elapsed().as_secs_f64();
            }
            Step::Relocate { chunk, delta } => {
                let kv = self
                    .resident
                    .get(chunk)
                    .ok_or_else(|| Error::chunk("relocate", chunk, "is not resident"))?;
                let moved = kamera_ops::relocate(kv, &rope, kv.offset() + delta).map_err(ops_err("relocate"))?;
                self.stats.relocated_tokens += moved.n_tokens() as u64;
                self.resident.insert(*chunk, moved);
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
}
