//! A synthetic encoder with a known, low-rank cross-chunk deficit: a chunk prefilled after a
//! context gets K/V = canonical + u·vᵀ per layer, where u depends on the chunk and v on the
//! context's values; keys are then rotated to their positions. Its patches are exact at rank 1.
#![allow(dead_code)]

use std::collections::BTreeMap;

use kamera_ops::{Buf, ChunkKv, DType, KvLayout, LayerKv, Mat, PairLayout, PatchConfig, RopeSpec};
use kamera_sched::{BoxError, Encoder, ExecConfig, Executor, Plan, Prior, Step, Window};
use kamera_store::{ChunkId, MemStore, ModelFp};

pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

pub struct Synth {
    pub layout: KvLayout,
    pub rope: RopeSpec,
    pub chunks: BTreeMap<ChunkId, (usize, u64)>,
    pub calls: usize,
    /// The runs of prefills in place the executor announced ([`Encoder::ahead`]), in order.
    pub announced: Vec<Vec<(ChunkId, i64)>>,
}

pub fn model() -> ModelFp {
    ModelFp::of("synthetic")
}

impl Synth {
    pub fn new() -> Synth {
        Synth {
            layout: KvLayout::gqa(2, 4, 2, 8),
            rope: RopeSpec::new(8, 10_000.0, PairLayout::HalfSplit),
            chunks: BTreeMap::new(),
            calls: 0,
            announced: Vec::new(),
        }
    }
    /// Registers chunk `seed` of `n` tokens; returns its id.
    pub fn chunk(&mut self, seed: u64, n: usize) -> ChunkId {
        let id = ChunkId::of(&seed.to_le_bytes(), "synth", model());
        self.chunks.insert(id, (n, seed));
        id
    }

    /// The chunk's KV after `ctx` (exact model), at `at`.
    pub fn kv(&self, id: ChunkId, at: i64, ctx: Option<&ChunkKv>) -> ChunkKv {
        let (n, seed) = self.chunks[&id];
        let f = self.layout.k_features();
        let layers = (0..self.layout.n_layers)
            .map(|l| {
                let s = seed * 100 + l as u64 * 10;
                let mut k = values(s, n * f);
                let mut v = values(s + 1, n * f);
                if let Some(c) = ctx {
                    let cv = c.layers()[l].v.to_f32_vec();
                    let rows = c.n_tokens().max(1) as f32;
                    let mean: Vec<f32> = (0..f)
                        .map(|j| cv.iter().skip(j).step_by(f).sum::<f32>() / rows)
                        .collect();
                    let u = values(s + 2, n);
                    for t in 0..n {
                        for j in 0..f {
                            k[t * f + j] += 0.5 * u[t] * mean[j];
                            v[t * f + j] += 0.3 * u[t] * mean[(j + 1) % f];
                        }
                    }
                }
                LayerKv {
                    k: Mat::new(n, f, Buf::F32(k)).unwrap(),
                    v: Mat::new(n, f, Buf::F32(v)).unwrap(),
                }
            })
            .collect();
        let canon = ChunkKv::new(self.layout, 0, layers).unwrap();
        kamera_ops::relocate(&canon, &self.rope, at).unwrap()
    }

    /// A full prefill of `seq` from 0: each chunk after the exact KV of everything before it.
    pub fn full(&self, seq: &[ChunkId]) -> ChunkKv {
        let mut ctx: Option<ChunkKv> = None;
        let mut pos = 0;
        for id in seq {
            let kv = self.kv(*id, pos, ctx.as_ref());
            pos += kv.n_tokens() as i64;
            ctx = Some(match ctx {
                None => kv,
                Some(prev) => concat(&prev, &kv, &self.rope),
            });
        }
        ctx.expect("non-empty sequence")
    }
}

pub fn concat(a: &ChunkKv, b: &ChunkKv, rope: &RopeSpec) -> ChunkKv {
    let parts = [
        kamera_ops::Placement { chunk: a, patch: None },
        kamera_ops::Placement { chunk: b, patch: None },
    ];
    kamera_ops::assemble(&parts, rope, a.offset(), DType::F32).unwrap()
}

impl Encoder for Synth {
    fn layout(&self) -> KvLayout {
        self.layout
    }
    fn rope(&self) -> &RopeSpec {
        &self.rope
    }
    fn prefill_alone(&mut self, chunk: ChunkId) -> Result<ChunkKv, BoxError> {
        self.prefill(chunk, 0, None)
    }
    fn prefill_after(&mut self, chunk: ChunkId, at: i64, prior: &Prior<'_>, _: u64) -> Result<ChunkKv, BoxError> {
        let ctx = prior.assemble(&self.rope, DType::F32)?;
        self.prefill(chunk, at, ctx.as_ref())
    }
    fn ahead(&mut self, prefills: &[(ChunkId, i64)]) {
        self.announced.push(prefills.to_vec());
    }
}

impl Synth {
    fn prefill(&mut self, chunk: ChunkId, at: i64, context: Option<&ChunkKv>) -> Result<ChunkKv, BoxError> {
        self.calls += 1;
        if !self.chunks.contains_key(&chunk) {
            return Err(format!("unknown chunk {chunk}").into());
        }
        Ok(self.kv(chunk, at, context))
    }
}

pub fn max_diff(a: &ChunkKv, b: &ChunkKv) -> f32 {
    a.max_abs_diff(b).expect("chunks of the same shape")
}

/// `cost` with the paper's canonical KV (prefilled alone) and no blind placement allowed: every
/// recall and survivor exact or patched, as the tests of patch formation need.
pub fn exact(cost: kamera_sched::CostModel) -> kamera_sched::CostModel {
    kamera_sched::CostModel {
        canonical: kamera_sched::CanonicalSource::Alone,
        recall_blind_kl: f64::INFINITY,
        survivor_blind_kl: f64::INFINITY,
        ..cost
    }
}

/// The reference executor over `synth` and a memory store, forming rank-2 f32 patches.
pub fn executor(synth: Synth) -> Executor<Synth, MemStore> {
    let cfg = ExecConfig {
        model: model(),
        patch: PatchConfig::fixed(2, DType::F32),
        dtype: DType::F32,
    };
    Executor::new(synth, MemStore::new(), cfg)
}

/// Per slot of `w`, in order: its resident KV in `ex`, and the KV a prefill in place after the
/// resident KV before it gives (what an exact slot must hold).
pub fn resident_and_in_place(w: &Window, ex: &Executor<Synth, MemStore>) -> Vec<(ChunkKv, ChunkKv)> {
    let mut ctx: Option<ChunkKv> = None;
    let mut out = Vec::new();
    for s in w.slots() {
        let got = ex.resident(&s.chunk).expect("resident").clone();
        let want = ex.encoder().kv(s.chunk, s.start, ctx.as_ref());
        ctx = Some(match ctx {
            None => got.clone(),
            Some(prev) => concat(&prev, &got, &ex.encoder().rope),
        });
        out.push((got, want));
    }
    out
}

/// The chunks `plan` prefills in place, in order (its steps, then its background steps).
pub fn prefilled_in_place(plan: &Plan) -> Vec<ChunkId> {
    plan.steps
        .iter()
        .chain(&plan.background)
        .filter_map(|s| match s {
            Step::Prefill {
                chunk, alone: false, ..
            } => Some(*chunk),
            _ => None,
        })
        .collect()
}
