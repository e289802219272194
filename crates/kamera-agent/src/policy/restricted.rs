//! The model's probability of each candidate when its reply is restricted to the candidates:
//! the candidates' tokens form a trie, and at every node where they branch a candidate's token
//! is renormalised over the tokens the candidates sharing its prefix continue with; where they do
//! not branch, the token is forced and counts 1. This is the probability greedy decoding under
//! the candidates' token mask gives each whole reply (the distribution constrained decoding
//! samples from), taken over every path instead of greedily. Unlike the mean token
//! log-likelihood it is not raised by a long tail of easily copied tokens after the choice is
//! made (a paragraph's text quoted in a candidate), nor lowered by a long one.

/// For each candidate (its tokens with their log-probabilities after the shared prompt, as the
/// local model's `rank` reports them), its log-probability restricted to the candidates. A
/// candidate that is a whole prefix of another ends where the other goes on; its end is not a
/// branch (the model's probability of stopping there is unknown).
pub fn log_probs(cands: &[&[(u32, f32)]]) -> Vec<f32> {
    cands
        .iter()
        .map(|c| {
            // The candidates sharing c's tokens so far, narrowed at each token.
            let mut sharing: Vec<&[(u32, f32)]> = cands.to_vec();
            let mut lp = 0.0f32;
            for (i, &(tok, t)) in c.iter().enumerate() {
                sharing.retain(|o| o.len() > i);
                // The distinct tokens the sharing candidates continue with: the branch.
                let mut branch: Vec<(u32, f32)> = Vec::new();
                for o in &sharing {
                    if !branch.iter().any(|b| b.0 == o[i].0) {
                        branch.push(o[i]);
                    }
                }
                let m = branch.iter().fold(f32::NEG_INFINITY, |m, b| m.max(b.1));
                let z = m + branch.iter().map(|b| (b.1 - m).exp()).sum::<f32>().ln();
                lp += t - z;
                sharing.retain(|o| o[i].0 == tok);
            }
            lp
        })
        .collect()
}

/// The candidate with the highest restricted probability, of those `rank` scored token by
/// token (`None` when it reported no tokens: a plugged model's `rank`).
pub fn best(token_scores: &[(String, Vec<(u32, f32)>)]) -> Option<&str> {
    let cands: Vec<&[(u32, f32)]> = token_scores.iter().map(|(_, t)| t.as_slice()).collect();
    let lps = log_probs(&cands);
    lps.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| token_scores[i].0.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ln(p: f32) -> f32 {
        p.ln()
    }

    /// A shared token counts 1; at a branch a token is renormalised over the branch's tokens; a
    /// long easily copied tail after the branch does not raise a candidate.
    #[test]
    fn branches_are_renormalised_and_forced_tokens_count_one() {
        // Shared "click" (p 0.5), then "A" (0.2) or "B" (0.1), B followed by a long sure tail.
        let a = [(1, ln(0.5)), (2, ln(0.2))];
        let b = [(1, ln(0.5)), (3, ln(0.1)), (4, ln(0.99)), (5, ln(0.99)), (6, ln(0.99))];
        let lps = log_probs(&[&a, &b]);
        assert!((lps[0] - ln(0.2 / 0.3)).abs() < 1e-6, "{lps:?}");
        assert!((lps[1] - ln(0.1 / 0.3)).abs() < 1e-6, "{lps:?}");
        // The mean log-likelihood would pick B (its tail is near 0 per token); restricted picks A.
        let mean = |c: &[(u32, f32)]| c.iter().map(|t| t.1).sum::<f32>() / c.len() as f32;
        assert!(mean(&b) > mean(&a));
        let scored = vec![("a".to_string(), a.to_vec()), ("b".to_string(), b.to_vec())];
        assert_eq!(best(&scored), Some("a"));
        // The probabilities over all candidates sum to 1.
        let c = [(1, ln(0.5)), (3, ln(0.1)), (7, ln(0.3))];
        let total: f32 = log_probs(&[&a, &b, &c]).iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        assert_eq!(best(&[]), None);
    }
}
