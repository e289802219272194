//! The runtime's case: a page's patch is formed at a first visit, in a context A, and used at a
//! later recall into another context B (the task's own ordering), on top of its canonical KV
//! relocated there (KAMERA.md, "Recall"). Every other patch method scores a patch formed from
//! the very context it is scored in.
//!
//! Context A of the page at slot s ≥ 2 of the task (`Visit`): `recall:` the task's other pages in
//! the reverse of their order in the task (the same pages, rearranged, as after evictions and
//! recalls in one session); `recall-foreign:` the first s − 1 pages of another task of the run
//! (the page first met in another session). The deficit conditioned-in-A − canonical, taken in
//! the canonical frame (kamera-ops `deficit` un-rotates it), is factored as SPEC says; the page
//! at slot 1 (after the system prefix alone, where its canonical KV is exact) gets no patch.

use std::time::Instant;

use kamera_model::Context;
use kamera_ops::ChunkKv;

use kamera_eval::Task;

use crate::error::{Error, ModelCtx, Result};
use crate::evaluator::{Evaluator, Formed, Prepared, ms};
use crate::kv::slice;
use crate::method::{PatchSpec, Visit};
use crate::task_result::TaskMethod;

impl Evaluator<'_> {
    /// The context of `recall:SPEC` / `recall-foreign:SPEC` on one task (`other`: the task whose
    /// pages precede the page at its first visit, for `Visit::Foreign`).
    pub(crate) fn recall(
        &self,
        task: &Task,
        p: &Prepared,
        visit: Visit,
        other: Option<&Task>,
        spec: &PatchSpec,
    ) -> Result<(Context, TaskMethod)> {
        let t = Instant::now();
        let foreign = match (visit, other) {
            (Visit::Reordered, _) => Vec::new(),
            (Visit::Foreign, Some(o)) => o
                .chunks
                .iter()
                .map(|c| self.encode(&o.id, "chunk", c))
                .collect::<Result<Vec<_>>>()?,
            (Visit::Foreign, None) => {
                return Err(Error::Task {
                    id: task.id.clone(),
                    detail: "recall-foreign forms its patches after another task's pages: run at least 2 tasks".into(),
                });
            }
        };
        let n = p.canon.len();
        let mut conds: Vec<Vec<ChunkKv>> = Vec::with_capacity(n);
        for (i, own) in p.chunk_toks.iter().enumerate() {
            if i == 0 {
                conds.push(vec![p.cond[0].clone()]);
                continue;
            }
            let before: Vec<&[u32]> = match visit {
                Visit::Reordered => (0..n).rev().filter(|&j| j != i).map(|j| &p.chunk_toks[j][..]).collect(),
                Visit::Foreign => foreign.iter().take(i).map(|c| &c[..]).collect(),
            };
            let mut toks = before.concat();
            let at = toks.len();
            toks.extend(own);
            let pf = self
                .model
                .prefill(&toks, p.start, &p.sys_ctx)
                .model("first-visit prefill")?;
            conds.push(vec![slice(&pf.chunk, at, own.len())?]);
        }
        let s = self.spectra(p, &conds)?;
        let (formed, _) = self.spec_patches(p, &s.svds, None, None, spec)?;
        let used: Vec<Option<&Formed>> = formed.iter().enumerate().map(|(i, f)| (i > 0).then_some(f)).collect();
        self.patched(p, &used, ms(t))
    }
}
