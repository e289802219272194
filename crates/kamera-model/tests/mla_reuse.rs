//! The Kamera operator on MLA KV (KAMERA.md, "Attention families": relocate only the decoupled
//! k_rope, reuse the latent c_KV byte for byte, patch both channels) with the tiny DeepSeek-V2
//! checkpoints of scripts/deepseek_v2_golden.py (random weights: these tests measure exactness
//! and the operator's algebra, not a trained model's recall).

use std::path::Path;

use anyhow::{Result, ensure};
use kamera_model::mla::MlaModel;
use kamera_model::{Context, Placement, PrefillOptions};
use kamera_ops::{DType, PatchConfig, deficit, form_patch, relocate};

const VARIANTS: [&str; 2] = ["deepseekv2-tiny", "deepseekv2-tiny-noq"];
/// Relocated k_rope against a prefill at the new offset (the README's figure).
const MAX_K_ROPE_REL: f32 = 1e-5;

fn load(variant: &str) -> Result<MlaModel> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(variant);
    Ok(MlaModel::load(&dir)?)
}

/// `n` token ids from a seeded LCG.
fn ids(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Largest |a - b| relative to the largest |b|.
fn rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn bits(m: &kamera_ops::Mat) -> Vec<u32> {
    m.to_f32_vec().iter().map(|x| x.to_bits()).collect()
}

fn kl(p: &[f32], q: &[f32]) -> f64 {
    let ls = |r: &[f32]| -> Vec<f64> {
        let m = r.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let lse = r.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
        r.iter().map(|&x| x as f64 - lse).collect()
    };
    let (lp, lq) = (ls(p), ls(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

/// Mean KL over the rows of two `n x vocab` logit blocks.
fn mean_kl(p: &[f32], q: &[f32], vocab: usize) -> f64 {
    let rows = p.len() / vocab;
    p.chunks(vocab).zip(q.chunks(vocab)).map(|(a, b)| kl(a, b)).sum::<f64>() / rows as f64
}

#[test]
fn relocated_chunk_equals_prefill_at_offset_and_keeps_the_latent() -> Result<()> {
    for variant in VARIANTS {
        let m = load(variant)?;
        let b = ids(7, 12, m.config().vocab);
        let canonical = m.prefill(&b, 0, &m.empty_context())?.chunk;
        for p in [37i64, 1000] {
            let at_p = m.prefill(&b, p, &m.empty_context())?.chunk;
            let moved = relocate(&canonical, m.rope(), p)?;
            ensure!(moved.offset() == p);
            let mut worst = 0f32;
            for (l, ((mv, at), can)) in moved
                .layers()
                .iter()
                .zip(at_p.layers())
                .zip(canonical.layers())
                .enumerate()
            {
                let k = rel(&mv.k.to_f32_vec(), &at.k.to_f32_vec());
                worst = worst.max(k);
                ensure!(k <= MAX_K_ROPE_REL, "{variant} P={p} layer {l}: k_rope rel {k:e}");
                // Relocation never touches the latent: byte for byte the canonical one.
                ensure!(
                    bits(&mv.v) == bits(&can.v),
                    "{variant} layer {l}: relocation changed c_KV"
                );
                // A prefill at P computes the same latent up to rounding (exactly in layer 0,
                // where nothing positional has reached it yet).
                let lat = rel(&at.v.to_f32_vec(), &can.v.to_f32_vec());
                ensure!(lat <= MAX_K_ROPE_REL, "{variant} P={p} layer {l}: latent rel {lat:e}");
                ensure!(
                    l > 0 || bits(&at.v) == bits(&can.v),
                    "{variant}: layer 0 latent moved with P"
                );
            }
            eprintln!("{variant}: relocate 0 -> {p}: k_rope max rel diff {worst:.2e}, c_KV identical");
        }
    }
    Ok(())
}

/// A question after the chunk placed at P from its canonical KV reads what it reads after the
/// chunk prefilled at P; the context's latent rows are the canonical bytes.
#[test]
fn placed_chunk_serves_a_question_like_a_prefill_at_offset() -> Result<()> {
    for variant in VARIANTS {
        let m = load(variant)?;
        let vocab = m.config().vocab;
        let (b, q) = (ids(11, 12, vocab), ids(13, 5, vocab));
        let p = 29i64;
        let canonical = m.prefill(&b, 0, &m.empty_context())?.chunk;
        let placed = Context::from_chunks(
            &[Placement {
                chunk: &canonical,
                patch: None,
            }],
            m.rope(),
            p,
        )?;
        for (l, (c, can)) in placed.to_chunk()?.layers().iter().zip(canonical.layers()).enumerate() {
            ensure!(bits(&c.v) == bits(&can.v), "{variant} layer {l}: placing changed c_KV");
        }
        let at_p = Context::from_chunk(&m.prefill(&b, p, &m.empty_context())?.chunk)?;
        let opts = PrefillOptions { all_logits: true };
        let want = m
            .prefill_with(&q, placed.end(), &at_p, opts)?
            .all_logits
            .unwrap_or_default();
        let got = m
            .prefill_with(&q, placed.end(), &placed, opts)?
            .all_logits
            .unwrap_or_default();
        let d = mean_kl(&want, &got, vocab);
        eprintln!("{variant}: question after the placed chunk vs after a prefill at {p}: mean KL {d:.2e}");
        ensure!(d <= 1e-9, "{variant}: KL {d:e}");
    }
    Ok(())
}

/// Recall of B after A: from B's canonical KV alone (blind), with a rank-m patch of the deficit on
/// both channels (k_rope and c_KV), with a full-rank patch; mean KL of the question's logits to
/// the full prefill of A, B, question.
fn recall_kls(m: &MlaModel, ranks: &[usize]) -> Result<(f64, Vec<f64>)> {
    let vocab = m.config().vocab;
    let (a, b, q) = (ids(3, 16, vocab), ids(5, 12, vocab), ids(9, 6, vocab));
    let na = a.len() as i64;
    let a_kv = m.prefill(&a, 0, &m.empty_context())?.chunk;
    let b_alone = m.prefill(&b, 0, &m.empty_context())?.chunk;
    let b_cond = m.prefill(&b, na, &Context::from_chunk(&a_kv)?)?.chunk;
    let opts = PrefillOptions { all_logits: true };
    let full: Vec<u32> = a.iter().chain(&b).chain(&q).copied().collect();
    let full = m
        .prefill_with(&full, 0, &m.empty_context(), opts)?
        .all_logits
        .unwrap_or_default();
    let want = &full[(a.len() + b.len()) * vocab..];
    let run = |patch: Option<&kamera_ops::Patch>| -> Result<f64> {
        let parts = [
            Placement {
                chunk: &a_kv,
                patch: None,
            },
            Placement { chunk: &b_alone, patch },
        ];
        let ctx = Context::from_chunks(&parts, m.rope(), 0)?;
        let got = m
            .prefill_with(&q, ctx.end(), &ctx, opts)?
            .all_logits
            .unwrap_or_default();
        Ok(mean_kl(want, &got, vocab))
    };
    let d = deficit(&b_cond, &b_alone, m.rope())?;
    for (l, (k, v)) in d.layers.iter().enumerate() {
        let e = |x: &kamera_ops::Mat| x.to_f32_vec().iter().map(|v| v * v).sum::<f32>().sqrt();
        eprintln!("  layer {l}: deficit |ΔK_rope| {:.3e}, |Δc_KV| {:.3e}", e(k), e(v));
    }
    let mut patched = Vec::with_capacity(ranks.len());
    for &r in ranks {
        let patch = form_patch(&b_cond, &b_alone, m.rope(), &PatchConfig::fixed(r, DType::F32))?;
        eprintln!(
            "  rank {r}: patch bytes {:.1}% of the chunk's KV",
            100.0 * patch.bytes_ratio(&b_alone)
        );
        patched.push(run(Some(&patch))?);
    }
    Ok((run(None)?, patched))
}

#[test]
fn patched_recall_beats_blind_reuse() -> Result<()> {
    let ranks = [1usize, 2, 4, usize::MAX];
    for variant in VARIANTS {
        let m = load(variant)?;
        eprintln!("{variant}:");
        let (blind, patched) = recall_kls(&m, &ranks)?;
        let shown: Vec<String> = patched.iter().map(|k| format!("{k:.3e}")).collect();
        eprintln!("{variant}: recall mean KL to the full prefill: blind {blind:.3e}, rank 1/2/4/full {shown:?}");
        ensure!(
            blind > 1e-4,
            "{variant}: blind reuse should lose conditioning ({blind:e})"
        );
        // Every rank beats blind reuse, each rank more (measured: rank 4 at 7% / 10% of blind).
        let mut prev = blind;
        for (r, k) in ranks.iter().zip(&patched) {
            ensure!(*k < prev, "{variant}: rank {r} patch KL {k:e} not below {prev:e}");
            prev = *k;
        }
        ensure!(
            patched[2] <= 0.2 * blind,
            "{variant}: rank 4 KL {:e} vs blind {blind:e}",
            patched[2]
        );
        let full = patched[ranks.len() - 1];
        ensure!(full <= 1e-9, "{variant}: full-rank patch KL {full:e}");
    }
    Ok(())
}

/// Reorder on MLA: B and C (10 tokens each) after a prefix A, in either order, each reused from
/// its canonical KV with one orbit patch (the deficit averaged over both orders, both channels)
/// serving both orders. Question KL to the full prefill of each order, blind vs orbit.
#[test]
fn orbit_patch_serves_both_orders_better_than_blind() -> Result<()> {
    for variant in VARIANTS {
        let m = load(variant)?;
        let vocab = m.config().vocab;
        let (a, q) = (ids(21, 8, vocab), ids(23, 5, vocab));
        let set = [ids(25, 10, vocab), ids(27, 10, vocab)];
        let a_kv = m.prefill(&a, 0, &m.empty_context())?.chunk;
        let canonical = set
            .iter()
            .map(|x| Ok(m.prefill(x, 0, &m.empty_context())?.chunk))
            .collect::<Result<Vec<_>>>()?;
        let orders = [[0usize, 1], [1, 0]];
        // Per order: each member's KV conditioned on the prefix and the members before it.
        let mut conditioned: Vec<Vec<kamera_ops::ChunkKv>> = vec![Vec::new(), Vec::new()];
        for order in orders {
            let mut ctx = Context::from_chunk(&a_kv)?;
            for &i in &order {
                conditioned[i].push(m.extend(&set[i], &mut ctx)?.chunk);
            }
        }
        let cfg = PatchConfig::fixed(usize::MAX, DType::F32);
        let patches = (0..2)
            .map(|i| Ok(kamera_ops::orbit_patch(&conditioned[i], &canonical[i], m.rope(), &cfg)?))
            .collect::<Result<Vec<_>>>()?;
        for order in orders {
            let full: Vec<u32> = a
                .iter()
                .chain(&set[order[0]])
                .chain(&set[order[1]])
                .chain(&q)
                .copied()
                .collect();
            let want = m.prefill(&full, 0, &m.empty_context())?.logits;
            let run = |patched: bool| -> Result<f64> {
                let mut parts = vec![Placement {
                    chunk: &a_kv,
                    patch: None,
                }];
                parts.extend(order.iter().map(|&i| Placement {
                    chunk: &canonical[i],
                    patch: patched.then_some(&patches[i]),
                }));
                let ctx = Context::from_chunks(&parts, m.rope(), 0)?;
                Ok(kl(&want, &m.prefill(&q, ctx.end(), &ctx)?.logits))
            };
            let (blind, orbit) = (run(false)?, run(true)?);
            eprintln!("{variant} order {order:?}: next-token KL blind {blind:.3e}, orbit patch {orbit:.3e}");
            // Measured: 0.07-0.20x blind.
            ensure!(
                orbit <= 0.3 * blind,
                "{variant} {order:?}: orbit {orbit:e} vs blind {blind:e}"
            );
        }
    }
    Ok(())
}
