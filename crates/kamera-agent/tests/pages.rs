//! Any page, any window, on real weights (SmolLM2-135M-Instruct, fetched once): a page of about
//! 20,000 tokens runs in a window of 2,048 as chunks of at most 512 tokens, its blocks evicting
//! each other in reading order; after another long page has evicted all of it, a question about
//! its last section brings that section's chunk back by relevance, and the model's context
//! holds it.

use std::sync::Arc;

use anyhow::Result;
use kamera_agent::{Llm, Session, SessionConfig, default_model};
use kamera_gpu::CpuBackend;
use kamera_store::MemStore;

/// A page of `lines` lines of `line(i)` under a header, then `tail`.
fn page(title: &str, path: &str, lines: usize, line: impl Fn(usize) -> String, tail: &str) -> String {
    let body: Vec<String> = (0..lines).map(line).collect();
    format!("Page \"{title}\" ({path}):\n{}\n{tail}\n\n", body.join("\n"))
}

fn shipments(i: usize) -> String {
    let section = if i % 40 == 0 {
        format!("# Dock ledger {}\n", i / 40 + 1)
    } else {
        String::new()
    };
    format!(
        "{section}Parcel P-{:05} left dock {} on route {} with {} crates of {}.",
        10_000 + i * 7,
        i % 13 + 1,
        (i * 31) % 97,
        i % 9 + 2,
        ["paper", "lamps", "chairs", "cables", "monitors", "tea"][i % 6]
    )
}

fn catalogue(i: usize) -> String {
    format!(
        "Item C-{:04}: {} model {} costs {} euros; {} in stock at the {} store.",
        i,
        ["desk lamp", "office chair", "label printer", "monitor arm"][i % 4],
        i * 3 % 50,
        20 + i % 80,
        i % 17,
        ["north", "south", "harbour"][i % 3]
    )
}

const FACT: &str = "# Vault\nThe vault code is 4417. Mira Solberg keeps the only key to the vault.";

#[test]
// Long: one long page followed through its chunks, eviction and recall.
fn a_20k_token_page_runs_in_a_2k_window_and_its_last_section_comes_back() -> Result<()> {
    let model = default_model(&kamera_model::default_home())?;
    let llm = Llm::new(model.clone());
    let cfg = SessionConfig {
        window_tokens: 2048,
        chunk_tokens_max: 512,
        // Survivors of each eviction are only re-rotated: repairing them would prefill the
        // window again after every block of the long page (the test's time, not its claim).
        repair: false,
        ..SessionConfig::default()
    };
    let mut s = Session::new(model.clone(), Arc::new(MemStore::new()), Box::new(CpuBackend), cfg);
    assert_eq!(s.page_cap(), 512);
    s.pin(&llm.prefix_text("Answer questions about the pages read."))?;

    // ~20,000 tokens: the shipments ledger, its last section the vault.
    let mut lines = 700;
    let long = loop {
        let p = page("Ledger", "/ledger", lines, shipments, FACT);
        let n = s.tokenize(&p, false)?.len();
        if n >= 20_000 {
            eprintln!("ledger: {lines} lines, {n} tokens");
            break p;
        }
        lines += 50;
    };
    let blocks = s.page_blocks(&long)?;
    assert!(blocks.len() >= 40, "{} blocks", blocks.len());
    for (k, b) in blocks.iter().enumerate() {
        let n = s.tokenize(&b.text, false)?.len();
        assert!(n <= 512, "part {} holds {n} tokens", k + 1);
    }
    let fact_block = blocks
        .iter()
        .find(|b| b.text.contains("Mira Solberg keeps"))
        .expect("a block holds the fact");
    let fact = s.chunk_id(&fact_block.text);

    let seen = s.observe_page(&long)?;
    assert_eq!(seen.chunks.len(), blocks.len());
    assert_eq!(seen.chunks.last(), Some(&fact), "the fact is in the page's last block");
    assert!(s.window().used() <= 2048 + s.pinned_tokens());
    assert!(s.window().slot(&fact).is_some(), "the page's newest block stays");
    assert!(
        s.window().is_evicted(&seen.chunks[0]),
        "its first blocks were evicted by its later ones"
    );

    // Another long page (~3,000 tokens) evicts all of the ledger.
    let other = page("Catalogue", "/catalogue", 140, catalogue, "End of the catalogue.");
    let now = s.observe_page(&other)?;
    assert!(now.chunks.len() >= 5, "{} blocks", now.chunks.len());
    assert!(
        s.window().is_evicted(&fact),
        "the catalogue must have evicted the vault section"
    );

    // The question: recall by relevance brings the vault section back, beside the current page.
    let question = "Who keeps the only key to the vault?";
    let recalled = s.recall_relevant_page(question, &now.chunks)?;
    assert!(
        s.window().slot(&fact).is_some(),
        "recall brought the vault section back: {}",
        recalled.plan
    );
    assert!(
        s.window().slot(now.chunks.last().unwrap()).is_some(),
        "the current page's last block stays"
    );
    assert!(s.window().used() <= 2048 + s.pinned_tokens());

    // The model's context holds it: the window's tokens include the vault section's.
    let fact_tokens = s.chunk_tokens(&fact).unwrap().to_vec();
    let window = s.window_tokens();
    assert!(window.windows(fact_tokens.len()).any(|w| w == fact_tokens.as_slice()));
    let end = s.window().end() as usize;
    let ctx = s.context()?;
    assert_eq!(ctx.len(), end, "the context holds the whole window");

    // The answer (each choice scored whole after the question) over the live context and over
    // a full prefill of the same tokens: the same. Which name it is, is the model's: SmolLM2-135M
    // answers "Tomas Ek" over both (and Qwen2.5-0.5B "Ada Brandt", tried 2026-12-03), so the
    // right name is not asserted.
    let choices: Vec<String> = ["Mira Solberg", "Ada Brandt", "Tomas Ek"].map(String::from).to_vec();
    let live = llm.choose(ctx, question, &choices)?;
    let mut fresh = model.empty_context();
    model.extend(&window, &mut fresh)?;
    let full = llm.choose(&mut fresh, question, &choices)?;
    eprintln!(
        "answer over the live window: {} {:?}; over a full prefill of it: {} {:?}",
        live.output, live.scores, full.output, full.scores
    );
    assert_eq!(
        live.output, full.output,
        "the live window answers as its full prefill does"
    );
    for ((c, a), (_, b)) in live.scores.iter().zip(&full.scores) {
        assert!((a - b).abs() < 1e-3, "{c}: score {a} live, {b} over a full prefill");
    }
    Ok(())
}

/// Recall by relevance brings back a page that names the question's identifier, not one that
/// shares only the goal's common words: with [`SessionConfig::recall_share`] at 0.6 the list
/// naming A-1041 comes back and the home page does not; at 0 (the absolute floor alone) the home
/// page comes back too, evicting a page the window held.
#[test]
fn a_question_recalls_the_page_naming_its_identifier_not_one_sharing_common_words() -> Result<()> {
    let model = default_model(&kamera_model::default_home())?;
    let llm = Llm::new(model.clone());
    let goal = "Answer questions about orders and their shipments.";
    let pages = [
        "Home\nWelcome back. Your orders and shipping status are one click away.",
        "Orders\nA-1040 shipped. A-1041 awaiting pickup. A-1042 delivered.",
        "Order A-1040\nShipping status: shipped. Tracking TRK-51613 with Harbor Line.",
        "Order A-1042\nShipping status: delivered. Tracking TRK-57111 with Harbor Line.",
        "Order A-1041\nShipping status: awaiting pickup. Tracking TRK-59894 with Harbor Line.",
    ];
    let question = format!("{goal}\nWhat is the shipping status of order A-1041?");
    let run = |share: f64| -> Result<(bool, bool)> {
        // Room for the last three pages: the home page and the list are evicted by them.
        let mut window = 0;
        for p in &pages[2..] {
            window += llm.tokens(p, false)?.len();
        }
        let cfg = SessionConfig {
            window_tokens: window + 2,
            recall_share: share,
            repair: false,
            ..SessionConfig::default()
        };
        let mut s = Session::new(model.clone(), Arc::new(MemStore::new()), Box::new(CpuBackend), cfg);
        s.pin(&llm.prefix_text(goal))?;
        let mut seen = Vec::new();
        for p in pages {
            seen.push(s.observe_page(p)?);
        }
        let (home, list) = (seen[0].chunks[0], seen[1].chunks[0]);
        assert!(
            s.window().is_evicted(&home) && s.window().is_evicted(&list),
            "share {share}"
        );
        let recalled = s.recall_relevant_page(&question, &seen[4].chunks)?;
        eprintln!("share {share}: {}", recalled.plan);
        assert!(s.window().slot(&seen[4].chunks[0]).is_some(), "the current page stays");
        Ok((s.window().slot(&list).is_some(), s.window().slot(&home).is_some()))
    };
    assert_eq!(run(0.6)?, (true, false), "share 0.6: (list back, home back)");
    assert_eq!(run(0.0)?, (true, true), "share 0: (list back, home back)");
    Ok(())
}
