//! The runtime's reuse quality on real weights (SmolLM2-135M), no browser: a chunk evicted and
//! recalled comes back exact (re-prefilled in place; its patch formed from that KV later); evicted
//! and recalled again after the same context, it is its canonical KV relocated + that patch, with
//! no model call, and the answer over the window is closer to a full re-prefill of the same
//! tokens than blind relocation.

use std::sync::Arc;

use kamera_agent::{Llm, Session, SessionConfig};
use kamera_gpu::CpuBackend;
use kamera_model::Model;
use kamera_ops::{DType, PatchConfig};
use kamera_sched::{Step, Visit};
use kamera_store::MemStore;
use kamera_tests::model;

const PAGES: [&str; 4] = [
    "Page \"Vault\" (/vault):\nThe vault code is 4417. Mira Solberg keeps the only key; she works in Billing on the third floor.\n\n",
    "Page \"Catalogue\" (/catalogue):\nDesk lamp P-200, office chair P-201, label printer P-202, monitor arm P-203, paper shredder P-204.\n\n",
    "Page \"Directory\" (/people):\nAda Brandt (Logistics), Tomas Ek (Support), Jon Halloran (Platform), Ines Vidal (Billing), Kai Mercer.\n\n",
    "Page \"Cart\" (/cart):\nP-200 quantity 2; P-203 quantity 1; P-206 quantity 4. Delivery by Harbor Line in three days.\n\n",
];

/// KL to the full re-prefill of the window + question after visiting every page, evicting the
/// vault page, visiting it again, evicting it and visiting it again, with patches of `rank` (0:
/// blind relocation), in a window of `window` tokens; and the plan of the last visit.
fn kl_after_recall(model: Arc<Model>, rank: usize, window: usize) -> anyhow::Result<(f64, Vec<Step>)> {
    let llm = Llm::new(model.clone());
    let cfg = SessionConfig {
        window_tokens: window,
        patch: PatchConfig::fixed(rank, DType::F32),
        ..SessionConfig::default()
    };
    let mut s = session_after_every_page(&model, &llm, cfg)?;
    let vault = s.chunk_id(PAGES[0]);
    assert!(
        s.window().is_evicted(&vault),
        "the window of {window} tokens must have evicted the vault page"
    );
    let first = s.observe(PAGES[0])?;
    assert_eq!(first.visit, Some(Visit::Recall));
    // Re-prefilled in place (exact), its patch formed from that KV in the background (after
    // the survivors of the eviction that made room, prefilled again first).
    let all = || first.plan.steps.iter().chain(&first.plan.background);
    let prefilled = all()
        .filter(|st| matches!(st, Step::Prefill { chunk, .. } if *chunk == vault))
        .count();
    let patched = all()
        .filter(|st| matches!(st, Step::StorePatch { chunk, .. } if *chunk == vault))
        .count();
    assert_eq!((prefilled, patched), (1, 1), "{}", first.plan);
    eprintln!(
        "rank {rank}: KL after the first recall (placed exact) {:.3e}",
        kl_now(&mut s, &llm)?
    );
    s.evict(&vault)?;
    s.context()?;
    let back = s.observe(PAGES[0])?;
    assert_eq!(back.visit, Some(Visit::Recall));
    assert_eq!(
        back.prefill_tokens, 0,
        "served from the patch formed on the first recall: {}",
        back.plan
    );
    Ok((kl_now(&mut s, &llm)?, back.plan.steps))
}

/// A session under `cfg` that pinned the vault goal and read every page, each read by the model
/// before the next (as an agent step does: the session holds its plans until a read,
/// [`SessionConfig::lazy`]).
fn session_after_every_page(model: &Arc<Model>, llm: &Llm, cfg: SessionConfig) -> anyhow::Result<Session> {
    let mut s = Session::new(model.clone(), Arc::new(MemStore::new()), Box::new(CpuBackend), cfg);
    s.pin(&llm.prefix_text("Find who keeps the vault key and the code."))?;
    for p in PAGES {
        s.observe(p)?;
        s.context()?;
    }
    Ok(s)
}

/// KL of the question's next-token distribution over the session's window to a full re-prefill
/// of the same tokens.
fn kl_now(s: &mut Session, llm: &Llm) -> anyhow::Result<f64> {
    let question = llm.question_prompt(
        "Who keeps the vault key?",
        &["Mira Solberg".into(), "Ada Brandt".into()],
    );
    let q = llm.tokens(&question, false)?;
    let mut full = s.window_tokens();
    full.extend(&q);
    let reference = llm.full_prefill(&full)?;
    let model = s.model().clone();
    let ctx = s.context()?;
    let base = ctx.len();
    let got = model.extend(&q, ctx)?.logits;
    ctx.truncate(base);
    Ok(kamera_eval::kl(&reference, &got))
}

#[test]
fn recalled_chunk_with_its_patch_answers_closer_to_full_than_blind() -> anyhow::Result<()> {
    let (patched, steps) = kl_after_recall(model(), 16, 100)?;
    let (blind, _) = kl_after_recall(model(), 0, 100)?;
    eprintln!("KL to full re-prefill: rank-16 patch {patched:.3e}, blind relocation {blind:.3e}");
    assert!(
        steps.iter().any(|s| matches!(s, Step::Place { patch: Some(_), .. })),
        "the recall placed the canonical KV with a patch: {steps:#?}"
    );
    assert!(
        !steps.iter().any(|s| matches!(s, Step::Prefill { alone: true, .. })),
        "a recalled chunk is never encoded again: {steps:#?}"
    );
    assert!(patched < blind, "patched {patched} vs blind {blind}");
    assert!(patched < 0.02, "KL {patched} with a rank-16 patch");
    Ok(())
}

/// The same on an MLA model (the tiny seeded DeepSeek-V2 of kamera-model's goldens, random
/// weights, a byte tokenizer): the Session stores its chunks as c_KV + k_rope, recalls the vault
/// page from the store with no model call (k_rope relocated, the latent reused, both patched), and
/// the patched recall is closer to the full re-prefill than blind relocation.
#[test]
fn an_mla_models_recall_with_its_patch_is_closer_to_full_than_blind() -> anyhow::Result<()> {
    let dir = kamera_tests::root().join("crates/kamera-model/tests/golden/deepseekv2-tiny");
    let mla = Arc::new(Model::load(&dir)?);
    assert!(
        matches!(mla.layout().attention, kamera_ops::Attention::Mla { .. }),
        "the tiny DeepSeek-V2 holds MLA KV: {:?}",
        mla.layout()
    );
    let (patched, steps) = kl_after_recall(mla.clone(), 16, 300)?;
    let (blind, _) = kl_after_recall(mla, 0, 300)?;
    eprintln!("MLA, KL to full re-prefill: rank-16 patch {patched:.3e}, blind relocation {blind:.3e}");
    assert!(
        steps.iter().any(|s| matches!(s, Step::Place { patch: Some(_), .. })),
        "the recall placed the canonical KV with a patch: {steps:#?}"
    );
    assert!(patched < 0.5 * blind, "patched {patched} vs blind {blind}");
    Ok(())
}

/// A session with room for every page (window 400) holding the pinned goal and the vault page;
/// the model, its `Llm`, the session and the window's length.
fn vault_session() -> anyhow::Result<(Arc<Model>, Llm, Session, usize)> {
    let model = model();
    let llm = Llm::new(model.clone());
    let cfg = SessionConfig {
        window_tokens: 400,
        ..SessionConfig::default()
    };
    let mut s = Session::new(model.clone(), Arc::new(MemStore::new()), Box::new(CpuBackend), cfg);
    s.pin(&llm.prefix_text("Find who keeps the vault key."))?;
    s.observe(PAGES[0])?;
    let window = s.context()?.len();
    Ok((model, llm, s, window))
}

/// The live context keeps the last model call's prompt rows while the window is unchanged: a
/// second call whose prompt shares its start prefills only the rest, with the logits of a full
/// prefill of the same tokens; the decoded tokens are cut off; a change to the window drops the
/// kept prompt; [`Session::context`] always gives the window alone.
#[test]
fn the_next_prompt_reuses_the_last_prompts_rows() -> anyhow::Result<()> {
    let (model, llm, mut s, window) = vault_session()?;
    let choices = ["Mira Solberg".to_string(), "Ada Brandt".to_string()];
    let first = llm.choose(s.live()?, "Who keeps the vault key?", &choices)?;
    assert_eq!((first.context_tokens, first.prompt_reused), (window, 0));
    let other = ["Mira Solberg".to_string(), "Kai Mercer".to_string()];
    let second = llm.choose(s.live()?, "Who keeps the vault key?", &other)?;
    assert!(
        second.prompt_reused >= 10 && second.prompt_reused < second.prompt_tokens,
        "the second prompt shares all but its last choice with the first: {} of {} tokens reused",
        second.prompt_reused,
        second.prompt_tokens
    );
    // The kept rows are the second prompt's, and reading them gives a full prefill's logits.
    let q = llm.tokens(&second.prompt, false)?;
    let mut full = s.window_tokens();
    full.extend(&q);
    let reference = llm.full_prefill(&full)?;
    let mut live = s.live()?;
    assert_eq!(live.window_len(), window, "decoded tokens were cut off");
    let (got, reused) = live.prompt(&model, &q)?;
    assert_eq!(reused, q.len() - 1, "everything but the last token is reused");
    drop(live);
    let ctx = s.context()?;
    assert_eq!(ctx.len(), window, "context() is the window alone");
    let fresh = model.extend(&q, ctx)?.logits;
    ctx.truncate(window);
    let (kl, kl_fresh) = (
        kamera_eval::kl(&reference, &got.logits),
        kamera_eval::kl(&reference, &fresh),
    );
    let kl_pair = kamera_eval::kl(&fresh, &got.logits);
    eprintln!("KL to a full prefill: reused prompt {kl:.3e}, prompt prefilled {kl_fresh:.3e}; between {kl_pair:.3e}");
    // Rows of the same tokens computed in batches of other shapes differ by kernel rounding
    // (the window itself is ~1e-4 from the full prefill); a misplaced row would be far above.
    assert!(
        kl_pair < 1e-4,
        "reusing the prompt's rows moved the logits: KL {kl_pair:.3e}"
    );
    assert!(kl < kl_fresh + 1e-4, "reused {kl:.3e} vs prefilled {kl_fresh:.3e}");
    // A new page changes the window: nothing of the old prompt is reused.
    s.observe(PAGES[1])?;
    let third = llm.choose(s.live()?, "Who keeps the vault key?", &choices)?;
    assert_eq!(third.prompt_reused, 0);
    assert!(third.context_tokens > window);
    Ok(())
}

/// A window layout that comes back (here: a page observed, then evicted again) gets the rows of
/// the prompt last run over it back: the next call reuses all but its last token, and its logits
/// are those of the prompt prefilled over that window.
#[test]
fn a_layout_that_comes_back_gets_its_prompts_rows_back() -> anyhow::Result<()> {
    let (model, llm, mut s, window) = vault_session()?;
    let choices = ["Mira Solberg".to_string(), "Ada Brandt".to_string()];
    let first = llm.choose(s.live()?, "Who keeps the vault key?", &choices)?;
    assert_eq!(first.prompt_reused, 0);
    s.observe(PAGES[1])?;
    let other = llm.choose(s.live()?, "Who keeps the vault key?", &choices)?;
    assert_eq!(other.prompt_reused, 0, "a new window: nothing to reuse");
    s.evict(&s.chunk_id(PAGES[1]))?;
    let q = llm.tokens(&first.prompt, false)?;
    let mut live = s.live()?;
    assert_eq!(live.window_len(), window, "the first window is back");
    let (got, reused) = live.prompt(&model, &q)?;
    assert_eq!(reused, q.len() - 1, "the first prompt's rows came back with its window");
    drop(live);
    let ctx = s.context()?;
    assert_eq!(ctx.len(), window);
    let fresh = model.extend(&q, ctx)?.logits;
    ctx.truncate(window);
    let kl = kamera_eval::kl(&fresh, &got.logits);
    eprintln!("KL between the prompt's rows brought back and prefilled again: {kl:.3e}");
    // With the bf16 prefill precision the rows brought back were prefilled on the bf16 tiles
    // (8+ tokens) and the last token reads them in f32 (one row: decode's product), while the
    // fresh prefill runs the whole prompt on the tiles: 2.2e-4 measured on Zen 4. A misplaced
    // or missing row moves the logits by far more.
    assert!(kl < 1e-3, "rows brought back moved the logits: KL {kl:.3e}");
    // Another layout (page 1 again, now placed from the store) does not get them.
    s.observe(PAGES[1])?;
    let (_, reused) = s.live()?.prompt(&model, &q)?;
    assert_eq!(reused, 0);
    Ok(())
}

/// Two prompts alternating over one window (an action prompt and a question, as an agent step
/// asks both) each get their own rows back: the window keeps both branches, as a radix cache
/// does, and a prompt swapped back in gives the logits of the same prompt over its kept rows.
#[test]
fn two_prompts_over_one_window_keep_both_branches() -> anyhow::Result<()> {
    let (model, llm, mut s, window) = vault_session()?;
    let a = llm.tokens("Question: who keeps the vault key? Answer:", false)?;
    let b = llm.tokens("Question: what is the vault code? Answer:", false)?;
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(
        shared > 0 && shared < a.len() - 1,
        "the prompts share a start and then differ"
    );
    let (first, reused) = s.live()?.prompt(&model, &a)?;
    assert_eq!(reused, 0);
    // The same prompt again over its own kept rows (the last token run alone): the reference
    // for a branch swapped back in.
    let (again, reused) = s.live()?.prompt(&model, &a)?;
    assert_eq!(reused, a.len() - 1);
    assert_eq!(s.live()?.prompt(&model, &b)?.1, shared, "b reuses the shared start");
    let (got, reused) = s.live()?.prompt(&model, &a)?;
    assert_eq!(reused, a.len() - 1, "a's branch came back whole");
    assert_eq!(s.live()?.prompt(&model, &b)?.1, b.len() - 1, "and then b's");
    let swap = kamera_eval::kl(&again.logits, &got.logits);
    assert!(swap < 1e-9, "a swapped-in branch is not the kept one: KL {swap:.3e}");
    // Against the whole prompt prefilled in one batch: the split itself (all but the last token,
    // then the last) moves SmolLM2's logits by KL ~5e-4 in f32, swapped or not.
    let split = kamera_eval::kl(&first.logits, &got.logits);
    eprintln!("KL of the branch swapped back in to the prompt prefilled whole: {split:.3e}");
    assert!(split < 1e-3, "KL {split:.3e}");
    let ctx = s.context()?;
    assert_eq!(ctx.len(), window, "the window alone, the prompts aside");
    Ok(())
}

/// Three prompts over one window, as an agent's steps ask them (pages A and C share a start, O
/// shares nothing): C takes A's kept rows as its start and cuts them where it diverges, and A
/// still comes back whole after it; a radix cache keeps all three branches too.
#[test]
fn a_branch_taken_as_anothers_start_is_not_lost() -> anyhow::Result<()> {
    let (model, llm, mut s, _) = vault_session()?;
    let a = llm.tokens("Current page: /orders/A-1040. What should the agent do next?", false)?;
    let o = llm.tokens("Question: who keeps the vault key? Answer:", false)?;
    let c = llm.tokens("Current page: /orders/A-1041. What should the agent do next?", false)?;
    let shared = a.iter().zip(&c).take_while(|(x, y)| x == y).count();
    let with_o = o.iter().zip(&c).take_while(|(x, y)| x == y).count();
    assert!(
        shared > with_o && shared < a.len() - 1,
        "A and C share more than O and C"
    );
    assert_eq!(s.live()?.prompt(&model, &a)?.1, 0);
    assert_eq!(s.live()?.prompt(&model, &o)?.1, 0);
    assert_eq!(s.live()?.prompt(&model, &c)?.1, shared, "C starts on A's rows");
    assert_eq!(
        s.live()?.prompt(&model, &a)?.1,
        a.len() - 1,
        "A's branch came back whole"
    );
    assert_eq!(s.live()?.prompt(&model, &c)?.1, c.len() - 1, "and C's");
    assert_eq!(s.live()?.prompt(&model, &o)?.1, o.len() - 1, "and O's");
    Ok(())
}

/// Pages observed before the model reads the window are prefilled at that read in one model
/// call: the executor announces the run of prefills in place and the encoder makes them at once,
/// handing each chunk its rows. What it makes is what the chunk-by-chunk prefills make (a session
/// that runs each plan's background work between plans prefills each page alone): the same KV
/// to 1e-5, the same KL of the question to the full re-prefill.
#[test]
fn pages_read_at_once_are_prefilled_in_one_call() -> anyhow::Result<()> {
    let model = model();
    let llm = Llm::new(model.clone());
    let read_pages = |defer: bool| -> anyhow::Result<(Session, kamera_agent::SessionStats)> {
        let cfg = SessionConfig {
            window_tokens: 1024,
            defer,
            ..SessionConfig::default()
        };
        let mut s = Session::new(model.clone(), Arc::new(MemStore::new()), Box::new(CpuBackend), cfg);
        s.pin(&llm.prefix_text("Find who keeps the vault key and the code."))?;
        for p in PAGES {
            s.observe(p)?;
        }
        let before = s.stats().clone();
        s.context()?;
        let read = s.stats().since(&before);
        Ok((s, read))
    };
    let (mut one, read) = read_pages(true)?;
    let (mut each, read_each) = read_pages(false)?;
    let page_tokens: usize = PAGES.iter().map(|p| llm.tokens(p, false).unwrap().len()).sum();
    assert!(read.prefill_tokens >= page_tokens, "{read:?}");
    assert_eq!(read.prefill_calls, 1, "the window's prefills in one call: {read:?}");
    assert!(read_each.prefill_calls > PAGES.len(), "chunk by chunk: {read_each:?}");
    let (a, b) = (one.context()?.to_chunk()?, each.context()?.to_chunk()?);
    let diff = a.max_abs_diff(&b).expect("the same window");
    assert!(diff < 1e-5, "one call against chunk by chunk: max |dKV| {diff}");
    let (kl_one, kl_each) = (kl_now(&mut one, &llm)?, kl_now(&mut each, &llm)?);
    eprintln!("KL to the full re-prefill: one call {kl_one:.3e}, chunk by chunk {kl_each:.3e}");
    assert!((kl_one - kl_each).abs() < 1e-6, "{kl_one} against {kl_each}");
    // Each page is its own chunk in the window, as met.
    for p in PAGES {
        assert!(one.window().slot(&one.chunk_id(p)).is_some(), "{p:?} in the window");
    }
    Ok(())
}

/// Before a question, every resident chunk placed blind is prefilled again where a read of blind
/// KV is predicted over the KL budget, not only the question's page: the answer reads the whole
/// window. Two pages recalled blind (recall and survivors priced blind, a read priced at 0.1 over
/// the 0.01 budget), the question asked on the second: both are prefilled again, and the
/// answer's KL to a full re-prefill of the window is that of exact KV.
#[test]
fn a_question_prefills_again_every_page_placed_blind_not_only_its_own() -> anyhow::Result<()> {
    let model = model();
    let llm = Llm::new(model.clone());
    let mut sizes = Vec::new();
    for p in PAGES {
        sizes.push(llm.tokens(p, false)?.len());
    }
    sizes.sort_unstable();
    let cfg = SessionConfig {
        // Any two pages fit (the two largest); that three do not is asserted below.
        window_tokens: sizes[2] + sizes[3] + 1,
        cost: kamera_sched::CostModel {
            recall_blind_kl: 0.0,
            survivor_blind_kl: 0.0,
            read_blind_kl: 0.1,
            ..kamera_sched::CostModel::default()
        },
        lazy: false,
        ..SessionConfig::default()
    };
    let mut s = session_after_every_page(&model, &llm, cfg)?;
    let (vault, catalogue) = (s.chunk_id(PAGES[0]), s.chunk_id(PAGES[1]));
    assert!(s.window().is_evicted(&vault) && s.window().is_evicted(&catalogue));
    // The catalogue back after the cart (a new context: placed blind), then the vault after the
    // catalogue, which the cart's eviction has shifted.
    for p in [PAGES[1], PAGES[0]] {
        let back = s.observe(p)?;
        assert_eq!(
            (back.visit, back.prefill_tokens),
            (Some(Visit::Recall), 0),
            "placed blind: {}",
            back.plan
        );
        s.context()?;
    }
    assert!(s.window().slot(&vault).is_some() && s.window().slot(&catalogue).is_some());
    let read = s.recall_relevant_page("Who keeps the vault key?", &[vault])?;
    let prefilled: Vec<_> = read
        .plan
        .steps
        .iter()
        .filter_map(|st| match st {
            Step::Prefill { chunk, .. } => Some(*chunk),
            _ => None,
        })
        .collect();
    assert!(
        prefilled.contains(&vault) && prefilled.contains(&catalogue),
        "the question's page and the page placed blind before it: {}",
        read.plan
    );
    let kl = kl_now(&mut s, &llm)?;
    eprintln!("KL of the answer after the read's repair: {kl:.3e}");
    assert!(kl < 1e-3, "KL {kl:.3e}: the window read exact");
    Ok(())
}
