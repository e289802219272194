//! Not a test: `cargo test --release -p kamera-model --test question_probe -- --ignored
//! --nocapture` times a 32-token question appended to a 4096-token context (the revisit's
//! question, `Model::extend` in place), f32 and bf16 prefill, best of 5; `PROBE_REPS=N` repeats
//! the bf16 one N times first and skips f32, for a profiler; `PROBE_MODEL=NAME` keeps one model.

mod common;

use std::time::Instant;

use anyhow::Result;
use kamera_model::{ModelName, PrefillPrecision};

#[test]
#[ignore]
fn question_over_a_long_context() -> Result<()> {
    let only = std::env::var("PROBE_MODEL").ok();
    for name in [ModelName::Smollm2_135m, ModelName::Gemma3_270m, ModelName::Qwen25_05b] {
        if only.as_ref().is_some_and(|o| *o != name.to_string()) {
            continue;
        }
        let mut m = common::load(name)?;
        let text = "The agent opened the order page and read the status of every line item. ".repeat(400);
        let mut ids = m.tokenizer().encode_raw(&text)?;
        ids.truncate(4096 + 32);
        let (context, question) = ids.split_at(4096);
        for p in [PrefillPrecision::F32, PrefillPrecision::Bf16] {
            let profiling = std::env::var("PROBE_REPS").is_ok();
            if !p.available() || (profiling && p == PrefillPrecision::F32) {
                continue;
            }
            m.set_prefill_precision(p)?;
            let mut ctx = m.empty_context();
            m.extend(context, &mut ctx)?;
            let reps = match (p, std::env::var("PROBE_REPS")) {
                (PrefillPrecision::Bf16, Ok(n)) => n.parse().unwrap_or(50),
                _ => 0,
            };
            for _ in 0..reps {
                ctx.truncate(4096);
                m.extend(question, &mut ctx)?;
            }
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                ctx.truncate(4096);
                let t = Instant::now();
                m.extend(question, &mut ctx)?;
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
            }
            println!("{name} {p}: 32 tokens after 4096: {best:.1} ms");
        }
    }
    Ok(())
}
