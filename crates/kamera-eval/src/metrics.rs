//! Distribution metrics on the answer tokens, against the full re-prefill.

/// `log_softmax` in f64.
pub fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(p ‖ q) of two logit rows.
pub fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.iter()
        .zip(&lq)
        .map(|(a, b)| if a.is_finite() { a.exp() * (a - b) } else { 0.0 })
        .sum::<f64>()
        .max(0.0)
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Per-task scores of one method's answer-token logits against the full re-prefill's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scores {
    /// Mean over answer tokens of KL(full ‖ method).
    pub kl: f64,
    /// Share of answer positions whose argmax agrees with full's.
    pub top1: f64,
    /// Whether greedy decoding reproduces the answer (argmax = answer token at every position,
    /// teacher-forced, which is the same as greedy generation matching it).
    pub exact_match: bool,
    /// Sum of log p(answer token).
    pub answer_logprob: f64,
}

/// Scores of `method` rows against `full` rows (`answer.len()` rows of `vocab` logits each).
pub fn score(full: &[f32], method: &[f32], answer: &[u32], vocab: usize) -> Scores {
    let n = answer.len().max(1);
    let (mut kl_sum, mut agree, mut exact, mut lp) = (0.0, 0usize, true, 0.0);
    for (i, &tok) in answer.iter().enumerate() {
        let (f, m) = (&full[i * vocab..(i + 1) * vocab], &method[i * vocab..(i + 1) * vocab]);
        kl_sum += kl(f, m);
        let am = argmax(m);
        agree += usize::from(am == argmax(f));
        exact &= am == tok as usize;
        lp += log_softmax(m)[tok as usize];
    }
    Scores {
        kl: kl_sum / n as f64,
        top1: agree as f64 / n as f64,
        exact_match: exact,
        answer_logprob: lp,
    }
}

/// 1 − KL_method / KL_blind (1 when blind has no gap).
pub fn gap_recovered(kl_method: f64, kl_blind: f64) -> f64 {
    if kl_blind <= 1e-12 {
        1.0
    } else {
        1.0 - kl_method / kl_blind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_is_zero_on_equal_rows_and_positive_otherwise() {
        let a = [1.0f32, 2.0, 3.0];
        assert!(kl(&a, &a).abs() < 1e-12);
        assert!(kl(&a, &[3.0, 2.0, 1.0]) > 0.1);
        let s = score(&a, &a, &[2], 3);
        assert_eq!((s.top1, s.exact_match), (1.0, true));
        assert_eq!(gap_recovered(0.25, 1.0), 0.75);
    }
}
