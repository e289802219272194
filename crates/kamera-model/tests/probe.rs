//! The probed prefill (query and attention statistics for attention-aware patches) on a real
//! model: the same K/V as the plain prefill, attention that sums to one per query, and group sums
//! that count every query from the group's start on.

mod common;

use anyhow::Result;
use kamera_model::{Context, ModelName};

#[test]
fn probe_matches_prefill_and_its_statistics_add_up_smollm2() -> Result<()> {
    let m = common::load(ModelName::Smollm2_135m)?;
    let tok = |s: &str| m.tokenizer().encode_raw(s);
    let sys = tok("You are a web agent. ")?;
    let toks = tok("Alice keeps her bicycle in the blue shed behind the library. She lent it to Bob.")?;
    let sys_kv = m.prefill(&sys, 0, &m.empty_context())?.chunk;
    let ctx = Context::from_chunk(&sys_kv)?;
    let start = sys.len() as i64;
    let plain = m.prefill(&toks, start, &ctx)?.chunk;
    let n = toks.len();
    let from = [0, n / 2, n];
    let (chunk, probe) = m.prefill_probe(&toks, start, &ctx, &from)?;
    for (a, b) in plain.layers().iter().zip(chunk.layers()) {
        assert!(common::max_abs(&a.k.to_f32_vec(), &b.k.to_f32_vec()) < 1e-4);
        assert!(common::max_abs(&a.v.to_f32_vec(), &b.v.to_f32_vec()) < 1e-4);
    }
    let cfg = m.config();
    assert_eq!(probe.queries, vec![n, n - n / 2, 0]);
    assert_eq!(probe.layers.len(), cfg.n_layers);
    for lp in &probe.layers {
        // Every query's attention sums to 1 over the prefix and the new tokens, so the new
        // tokens receive at most (queries x query heads); the last group has no queries.
        for (g, &q) in probe.queries.iter().enumerate() {
            let total: f32 = lp.mass[g].iter().sum();
            assert!(
                total >= 0.0 && total <= (q * cfg.heads) as f32 * (1.0 + 1e-4),
                "group {g}: {total}"
            );
            assert!(lp.mass_sq[g].iter().zip(&lp.mass[g]).all(|(s, a)| *s <= *a + 1e-5));
        }
        assert!(lp.mass[2].iter().all(|&a| a == 0.0) && lp.q_sq[2].iter().all(|&x| x == 0.0));
        // Group 0 holds group 1's queries and more.
        assert!(lp.q_sq[0].iter().zip(&lp.q_sq[1]).all(|(a, b)| a >= b));
        assert_eq!(lp.q_sq[0].len(), cfg.heads * cfg.head_dim);
        assert_eq!(lp.mass[0].len(), n * cfg.kv_heads);
        assert_eq!(lp.wo_sq.len(), cfg.heads * cfg.head_dim);
        assert!(lp.wo_sq.iter().all(|x| x.is_finite() && *x >= 0.0));
    }
    // Without a prefix every query's attention falls on the new tokens: exactly one per query head.
    let (_, bare) = m.prefill_probe(&toks, 0, &m.empty_context(), &[0])?;
    for lp in &bare.layers {
        let total: f32 = lp.mass[0].iter().sum();
        let want = (n * cfg.heads) as f32;
        assert!((total - want).abs() < 1e-3 * want, "{total} vs {want}");
    }
    assert!(m.prefill_probe(&toks, start, &ctx, &[3, 1]).is_err());
    assert!(m.prefill_probe(&toks, start, &ctx, &[n + 1]).is_err());
    Ok(())
}
