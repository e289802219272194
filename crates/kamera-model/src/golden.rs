//! Reference logits from an independent implementation (HF transformers + torch in f32 on the
//! same GGUF, `scripts/golden_logits.py`): per prompt its token ids and, at every position, the
//! reference's top-K logits and the row's log-sum-exp; and a model's KL to them (the parity tests
//! and `kamera bench model --against llama.cpp`, which scores both engines on the same prompts).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::{Input, Model, ModelName, PrefillOptions};

const OP: &str = "golden";

/// A model's reference logits (`tests/golden/<model>.json`).
#[derive(Debug, Deserialize)]
pub struct Golden {
    /// What made them (library versions, precision).
    pub source: String,
    pub cases: Vec<GoldenCase>,
}

/// One prompt of a [`Golden`].
#[derive(Debug, Deserialize)]
pub struct GoldenCase {
    pub prompt: String,
    /// The reference tokenizer's ids.
    pub ids: Vec<u32>,
    /// Per position: the log-sum-exp of the full logit row.
    pub lse: Vec<f64>,
    /// Per position: the top-K token ids, highest first.
    pub top_ids: Vec<Vec<usize>>,
    /// Per position: their logits.
    pub top_logits: Vec<Vec<f64>>,
}

/// How close a model's logits are to a [`Golden`]'s over every position of its prompts.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, Deserialize)]
pub struct GoldenScore {
    /// Mean of [`bucketed_kl`] over the positions (nats).
    pub mean_kl: f64,
    pub max_kl: f64,
    /// Positions whose top token is the reference's.
    pub top1_equal: usize,
    pub positions: usize,
    /// Whether every prompt's last position has the reference's top token.
    pub last_top1_equal: bool,
}

impl Golden {
    /// The committed reference of a built-in model (in this crate's `tests/golden`).
    pub fn path(name: ModelName) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(format!("{}.json", name.as_str()))
    }

    pub fn read(path: &Path) -> Result<Golden> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            op: OP,
            path: path.to_path_buf(),
            source,
        })?;
        let golden: Golden = serde_json::from_str(&text).map_err(|e| Error::Invalid {
            op: OP,
            detail: format!("{}: not a golden logits file: {e}", path.display()),
        })?;
        for c in &golden.cases {
            let n = c.ids.len();
            if c.lse.len() != n || c.top_ids.len() != n || c.top_logits.len() != n {
                return Err(Error::Invalid {
                    op: OP,
                    detail: format!(
                        "{}: prompt {:?} has {n} ids but {} lse, {} top-id and {} top-logit rows",
                        path.display(),
                        c.prompt,
                        c.lse.len(),
                        c.top_ids.len(),
                        c.top_logits.len()
                    ),
                });
            }
        }
        Ok(golden)
    }

    /// `model`'s logits at every position of every prompt (the reference's token ids, from an
    /// empty context) against the reference's.
    pub fn score(&self, model: &Model) -> Result<GoldenScore> {
        let vocab = model.config().vocab;
        let (mut sum, mut max, mut top1, mut n, mut last) = (0.0, 0f64, 0, 0, true);
        for case in &self.cases {
            let out = model.prefill_with(
                Input::Tokens(&case.ids),
                0,
                &model.empty_context(),
                PrefillOptions { all_logits: true },
            )?;
            let all = out.all_logits.ok_or_else(|| Error::Invalid {
                op: OP,
                detail: "the prefill returned no logits per position".into(),
            })?;
            for (t, row) in all.chunks_exact(vocab).enumerate() {
                let kl = bucketed_kl(case.lse[t], &case.top_ids[t], &case.top_logits[t], row);
                sum += kl;
                max = max.max(kl);
                let equal = crate::argmax(row) as usize == case.top_ids[t][0];
                top1 += equal as usize;
                n += 1;
                if t + 1 == case.ids.len() {
                    last &= equal;
                }
            }
        }
        Ok(GoldenScore {
            mean_kl: sum / n.max(1) as f64,
            max_kl: max,
            top1_equal: top1,
            positions: n,
            last_top1_equal: last,
        })
    }
}

/// KL(reference ‖ ours) over the reference's top-K tokens plus one bucket for the rest of the
/// vocabulary: a lower bound of the full KL, tight when the top-K holds nearly all the mass.
/// `lse`, `ids` and `logits` are the reference row's; `ours` is a full logit row.
pub fn bucketed_kl(lse: f64, ids: &[usize], logits: &[f64], ours: &[f32]) -> f64 {
    let m = ours.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let ours_lse = m + ours.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    let (mut kl, mut pm, mut qm) = (0.0, 0.0, 0.0);
    for (&i, &l) in ids.iter().zip(logits) {
        let (lp, lq) = (l - lse, ours[i] as f64 - ours_lse);
        kl += lp.exp() * (lp - lq);
        pm += lp.exp();
        qm += lq.exp();
    }
    let (pt, qt) = ((1.0 - pm).max(1e-30), (1.0 - qm).max(1e-30));
    (kl + pt * (pt / qt).ln()).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equal rows score 0; the bucketed KL never exceeds the full KL (it is a coarsening) and
    /// equals it when K is the whole vocabulary.
    #[test]
    fn bucketed_kl_is_a_lower_bound_and_exact_over_the_whole_vocabulary() {
        let p: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.4 - 2.0).collect();
        let q: Vec<f32> = (0..50).map(|i| ((i * 53) % 13) as f32 * 0.3 - 1.5).collect();
        let lse = |x: &[f32]| x.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
        let full: f64 = p
            .iter()
            .zip(&q)
            .map(|(&a, &b)| {
                let (la, lb) = (a as f64 - lse(&p), b as f64 - lse(&q));
                la.exp() * (la - lb)
            })
            .sum();
        let mut ids: Vec<usize> = (0..50).collect();
        ids.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let top = |k: usize| {
            let logits: Vec<f64> = ids[..k].iter().map(|&i| p[i] as f64).collect();
            bucketed_kl(lse(&p), &ids[..k], &logits, &q)
        };
        assert!((top(50) - full).abs() < 1e-9, "{} vs {full}", top(50));
        for k in [1, 5, 20] {
            assert!(top(k) <= full + 1e-12, "k {k}: {} > {full}", top(k));
        }
        let same: Vec<f64> = ids[..5].iter().map(|&i| p[i] as f64).collect();
        assert!(bucketed_kl(lse(&p), &ids[..5], &same, &p) < 1e-12);
    }
}
