//! Executing a kamera-sched [`Plan`] on the session's model, store and backend: every [`Step`] as
//! kamera-sched's reference `Executor` defines it, but on the live model context, which is only
//! rewritten from the first chunk that changed ([`Session::sync_to`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::ms;

use kamera_ops::ChunkKv;
use kamera_sched::{OrbitKey, Plan, Step};
use kamera_store::{ChunkId, Key, Record};

use crate::error::{Error, Result, model};
use crate::runtime::session::{ApplyTimings, Resident, Session};

fn invalid(op: &'static str, detail: String) -> Error {
    Error::Runtime { op, detail }
}

impl Session {
    /// Runs every step of `plan`, then brings the model context up to the window's end.
    /// With [`SessionConfig::defer`](crate::SessionConfig), the work a new chunk's first
    /// answer does not need (its canonical KV alone, storing it, its difference patch) is kept for
    /// [`Session::settle`].
    pub(crate) fn execute(&mut self, plan: &Plan) -> Result<ApplyTimings> {
        let mut t = ApplyTimings::default();
        let in_place: Vec<ChunkId> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Prefill {
                    chunk, alone: false, ..
                } => Some(*chunk),
                _ => None,
            })
            .collect();
        let deferrable = |s: &Step| match s {
            Step::Prefill { chunk, alone: true, .. }
            | Step::StoreCanonical { chunk }
            | Step::StorePatch { chunk, .. } => in_place.contains(chunk),
            _ => false,
        };
        let mut result = Ok(());
        for s in &plan.steps {
            if self.cfg.defer && deferrable(s) {
                self.deferred.push(s.clone());
                continue;
            }
            tracing::debug!(step = %s, "execute");
            result = self.step(s, &mut t);
            if result.is_err() {
                break;
            }
        }
        self.staged.clear();
        self.exact.clear();
        result?;
        self.sync_end(&mut t)?;
        Ok(t)
    }

    /// Brings the model context up to the window's end, timed.
    fn sync_end(&mut self, t: &mut ApplyTimings) -> Result<()> {
        let t0 = Instant::now();
        self.sync_to(self.window.end())?;
        t.sync_ms += ms(t0);
        Ok(())
    }

    /// Runs the deferred work of earlier plans, off the path to the first token and before the
    /// next plan: canonical KV of new chunks, their storage and difference patches, then the
    /// repair of survivors of evictions (see `survivors.rs`).
    pub fn settle(&mut self) -> Result<ApplyTimings> {
        if !self.cfg.reuse {
            return Ok(ApplyTimings::default()); // runtime/no_reuse.rs: nothing deferred, no KV kept
        }
        let mut t = ApplyTimings::default();
        let mut steps = std::mem::take(&mut self.deferred);
        let repair = self.repair_steps();
        for s in &repair {
            if let Step::Prefill { chunk, .. } = s {
                let n = self.content.get(chunk).map_or(0, |c| c.tokens.len());
                self.stats.repair_tokens += n;
                self.stats.prefill_tokens += n;
            }
        }
        steps.extend(repair);
        let t0 = Instant::now();
        let result = steps.iter().try_for_each(|s| self.step(s, &mut t));
        self.staged.clear();
        result?;
        self.sync_end(&mut t)?;
        self.stats.deferred_ms += ms(t0);
        Ok(t)
    }

    /// The canonical KV of `chunk`: staged by this plan, else read from the store.
    fn canonical(&mut self, op: &'static str, chunk: ChunkId) -> Result<Arc<Record>> {
        if let Some(r) = self.staged.get(&chunk) {
            return Ok(r.clone());
        }
        let rec = self
            .store
            .lookup(&Key::canonical(self.fp, chunk))?
            .filter(|r| r.as_kv().is_some())
            .ok_or_else(|| invalid(op, format!("chunk {chunk} has no usable canonical KV in the store")))?;
        self.staged.insert(chunk, rec.clone());
        Ok(rec)
    }

    fn set_resident(&mut self, chunk: ChunkId, kv: ChunkKv) {
        self.version += 1;
        self.stats.bytes_moved += kv.kv_bytes() as u64;
        self.resident.insert(
            chunk,
            Resident {
                kv,
                version: self.version,
            },
        );
    }

    fn step(&mut self, step: &Step, t: &mut ApplyTimings) -> Result<()> {
        let m = self.model.clone();
        let rope = m.rope();
        let fp = self.fp;
        match step {
            Step::Prefill { chunk, alone: true, .. } => {
                let t0 = Instant::now();
                let p = self.prefill_chunk("prefill alone", chunk, 0, None)?;
                let cost = t0.elapsed().as_micros() as u64;
                self.staged.insert(*chunk, Arc::new(Record::kv(fp, cost, p.chunk)));
                t.prefill_ms += ms(t0);
            }
            Step::Prefill {
                chunk,
                at,
                alone: false,
            } => {
                let t0 = Instant::now();
                self.sync_to(*at)?;
                t.sync_ms += ms(t0);
                let t0 = Instant::now();
                let p = self.extend_chunk("prefill in place", chunk)?;
                self.set_resident(*chunk, p.chunk);
                let v = self.version;
                self.ctx_chunks.push((*chunk, v));
                t.prefill_ms += ms(t0);
            }
            Step::StoreCanonical { chunk } => {
                let rec = self.canonical("store", *chunk)?;
                self.store.put(&Key::canonical(fp, *chunk), (*rec).clone())?;
            }
            Step::Recall { chunk } => {
                let t0 = Instant::now();
                self.staged.remove(chunk);
                self.canonical("recall", *chunk)?;
                t.place_ms += ms(t0);
            }
            Step::FormPatch { chunk, key, at } => {
                let t0 = Instant::now();
                self.sync_to(*at)?;
                let canon = self.canonical("form-patch", *chunk)?;
                let cond = self.prefill_chunk("conditioned prefill", chunk, *at, Some(&self.ctx))?;
                let patch = self.patch_of(&cond.chunk, &canon)?;
                self.put_patch(key, patch, t0.elapsed().as_micros() as u64)?;
                // The conditioned KV is exact for this placement: the Place that follows uses it
                // instead of canonical + the patch that approximates it.
                self.exact.insert(*chunk, cond.chunk);
                t.patch_ms += ms(t0);
            }
            Step::StorePatch { chunk, key } => {
                let t0 = Instant::now();
                let canon = self.canonical("store-patch", *chunk)?;
                let placed = self
                    .resident
                    .get(chunk)
                    .ok_or_else(|| invalid("store-patch", format!("chunk {chunk} is not resident")))?;
                let patch = self.patch_of(&placed.kv, &canon)?;
                self.put_patch(key, patch, t0.elapsed().as_micros() as u64)?;
                t.patch_ms += ms(t0);
            }
            Step::FormOrbit {
                keys, orderings, at, ..
            } => {
                let t0 = Instant::now();
                self.form_orbit(keys, orderings, *at)?;
                t.patch_ms += ms(t0);
            }
            Step::Place { chunk, at, patch } => {
                let t0 = Instant::now();
                if let Some(kv) = self.exact.remove(chunk).filter(|kv| kv.offset() == *at) {
                    self.stats.placed_tokens += kv.n_tokens();
                    self.set_resident(*chunk, kv);
                    t.place_ms += ms(t0);
                    return Ok(());
                }
                let canon = self.canonical("place", *chunk)?;
                let rec = match patch {
                    Some(key) => Some(
                        self.store
                            .lookup(key)?
                            .filter(|r| r.as_patch().is_some())
                            .ok_or_else(|| invalid("place", format!("patch {key} is not in the store")))?,
                    ),
                    None => None,
                };
                let kv = canon.as_kv().expect("canonical() checks the body");
                let placed = self
                    .backend
                    .reuse(kv, rec.as_ref().and_then(|r| r.as_patch()), rope, *at)?;
                self.stats.placed_tokens += placed.n_tokens();
                self.stats.patches_applied += usize::from(rec.is_some());
                self.set_resident(*chunk, placed);
                t.place_ms += ms(t0);
            }
            Step::Relocate { chunk, delta } => {
                let t0 = Instant::now();
                let r = self
                    .resident
                    .get(chunk)
                    .ok_or_else(|| invalid("relocate", format!("chunk {chunk} is not resident")))?;
                let moved = self.backend.reuse(&r.kv, None, rope, r.kv.offset() + delta)?;
                self.set_resident(*chunk, moved);
                t.place_ms += ms(t0);
            }
            Step::EvictToStore { chunk } => {
                if self.resident.remove(chunk).is_none() {
                    return Err(invalid("evict", format!("chunk {chunk} is not resident")));
                }
            }
            Step::DropTail { .. } => {}
        }
        Ok(())
    }

    /// The patch taking `canon`'s canonical KV to `cond` (a chunk's KV after some context).
    fn patch_of(&self, cond: &ChunkKv, canon: &Record) -> Result<kamera_ops::Patch> {
        let kv = canon.as_kv().expect("canonical() checks the body");
        Ok(kamera_ops::form_patch(cond, kv, self.model.rope(), &self.cfg.patch)?)
    }

    /// Stores a patch that took `cost_us` to form (for the store's eviction order).
    fn put_patch(&mut self, key: &Key, patch: kamera_ops::Patch, cost_us: u64) -> Result<()> {
        self.store.put(key, Record::patch(self.fp, cost_us, patch))?;
        self.stats.patches_formed += 1;
        Ok(())
    }

    /// The orbit patches `keys` of a set: the set prefilled after the context `0..at` under each
    /// ordering (appended to the live context, then truncated back), each key's deficits (every
    /// ordering, or those putting its chunk at its slot) averaged.
    fn form_orbit(&mut self, keys: &[OrbitKey], orderings: &[Vec<ChunkId>], at: i64) -> Result<()> {
        let t0 = Instant::now();
        self.sync_to(at)?;
        let base = self.ctx.len();
        let mut cond: BTreeMap<ChunkId, Vec<ChunkKv>> = BTreeMap::new();
        for ordering in orderings {
            for c in ordering {
                let p = match self.extend_chunk("orbit prefill", c) {
                    Ok(p) => p,
                    Err(e) => {
                        self.ctx.truncate(base);
                        return Err(e);
                    }
                };
                cond.entry(*c).or_default().push(p.chunk);
            }
            self.ctx.truncate(base);
        }
        let cost = t0.elapsed().as_micros() as u64 / keys.len().max(1) as u64;
        for k in keys {
            let canon = self.canonical("form-orbit", k.chunk)?;
            let kv = canon.as_kv().expect("canonical() checks the body");
            // cond[c][i] is c's KV under orderings[i].
            let conds: Vec<ChunkKv> = k.covered(cond.get(&k.chunk).map(Vec::as_slice).unwrap_or_default(), orderings);
            let patch = kamera_ops::orbit_patch(&conds, kv, self.model.rope(), &self.cfg.patch)?;
            self.put_patch(&k.key, patch, cost)?;
        }
        Ok(())
    }

    /// Makes the model context hold exactly the resident chunks of positions `0..at`, in order:
    /// rows of the longest unchanged run of chunks from position 0 stay; the context is cut
    /// there and the rest is written again.
    pub(crate) fn sync_to(&mut self, at: i64) -> Result<()> {
        let mut want: Vec<(ChunkId, i64, usize, u64)> = self
            .resident
            .iter()
            .filter(|(_, r)| r.kv.offset() < at)
            .map(|(id, r)| (*id, r.kv.offset(), r.kv.n_tokens(), r.version))
            .collect();
        want.sort_by_key(|w| w.1);
        let spans: Vec<i64> = want.iter().map(|w| self.span_of(&w.0, w.2)).collect();
        let mut pos = 0i64;
        for (w, span) in want.iter().zip(&spans) {
            if w.1 != pos {
                return Err(invalid(
                    "sync",
                    format!(
                        "resident KV does not tile 0..{at}: chunk {} starts at {} not {pos}",
                        w.0, w.1
                    ),
                ));
            }
            pos += span;
        }
        if pos != at {
            return Err(invalid("sync", format!("resident KV ends at {pos}, expected {at}")));
        }
        let keep = self
            .ctx_chunks
            .iter()
            .zip(&want)
            .take_while(|(have, w)| have.0 == w.0 && have.1 == w.3)
            .count();
        let rows: usize = want[..keep].iter().map(|w| w.2).sum();
        self.ctx.truncate(rows);
        self.ctx_chunks.truncate(keep);
        for (w, &span) in want[keep..].iter().zip(&spans[keep..]) {
            let r = &self.resident[&w.0];
            self.ctx.push_spanned(&r.kv, span).map_err(model("context push"))?;
            self.stats.bytes_moved += r.kv.kv_bytes() as u64;
            self.ctx_chunks.push((w.0, w.3));
        }
        Ok(())
    }
}
