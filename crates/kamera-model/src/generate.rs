//! Decoding with a KV cache: greedy or sampled (temperature, top-k, top-p, seeded), and the
//! chat template of each family.

use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::config::Family;
use crate::error::{Error, Result};
use crate::model::Model;

/// How to pick the next token.
#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    Greedy,
    Sample {
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
    },
}

/// Index of the largest logit (first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

struct Sampler {
    sampling: Sampling,
    rng: StdRng,
}

impl Sampler {
    fn new(sampling: Sampling) -> Result<Sampler> {
        let seed = match &sampling {
            Sampling::Greedy => 0,
            Sampling::Sample {
                temperature,
                top_p,
                seed,
                ..
            } => {
                let ok = temperature.is_finite() && *temperature > 0.0 && *top_p > 0.0 && *top_p <= 1.0;
                if !ok {
                    return Err(Error::Invalid {
                        op: "sample",
                        detail: format!("need temperature > 0 and 0 < top_p <= 1, got {sampling:?}"),
                    });
                }
                *seed
            }
        };
        Ok(Sampler {
            sampling,
            rng: StdRng::seed_from_u64(seed),
        })
    }

    fn pick(&mut self, logits: &[f32]) -> u32 {
        let Sampling::Sample {
            temperature,
            top_k,
            top_p,
            ..
        } = self.sampling
        else {
            return argmax(logits);
        };
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if top_k > 0 {
            idx.truncate(top_k);
        }
        let m = logits[idx[0]];
        let mut p: Vec<f64> = idx
            .iter()
            .map(|&i| (((logits[i] - m) / temperature) as f64).exp())
            .collect();
        let z: f64 = p.iter().sum();
        let mut acc = 0.0;
        let mut keep = p.len();
        for (j, x) in p.iter_mut().enumerate() {
            *x /= z;
            acc += *x;
            if acc >= top_p as f64 {
                keep = j + 1;
                break;
            }
        }
        let total: f64 = p[..keep].iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for j in 0..keep {
            r -= p[j];
            if r <= 0.0 {
                return idx[j] as u32;
            }
        }
        idx[keep - 1] as u32
    }
}

impl Model {
    /// Generate up to `max_tokens` after `prompt` (prefilled at position 0), stopping at EOS or a
    /// token of `stop`; `on_token` sees each new token as it comes.
    pub fn generate(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        sampling: Sampling,
        stop: &[u32],
        mut on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>> {
        let mut sampler = Sampler::new(sampling)?;
        let mut ctx = self.empty_context();
        let mut out = Vec::new();
        if max_tokens == 0 {
            return Ok(out);
        }
        let mut step = self.extend(prompt, &mut ctx)?;
        let eos = self.tokenizer().eos();
        loop {
            let next = sampler.pick(&step.logits);
            if Some(next) == eos || stop.contains(&next) {
                break;
            }
            out.push(next);
            on_token(next);
            if out.len() >= max_tokens {
                break;
            }
            step = self.extend(&[next], &mut ctx)?;
        }
        Ok(out)
    }

    /// The prompt for one user turn in the family's chat template.
    pub fn chat_prompt(&self, user: &str) -> String {
        match self.config().family {
            Family::Llama => format!(
                "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
            ),
            Family::Qwen2 => format!(
                "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
            ),
            Family::Gemma3 => {
                format!("<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n")
            }
            // DeepSeek-V2-Chat's template (its BOS comes from the tokenizer, not the text).
            Family::DeepseekV2 => format!("User: {user}\n\nAssistant:"),
        }
    }

    /// End-of-turn tokens of the chat template.
    pub fn chat_stop_tokens(&self) -> Vec<u32> {
        ["<|im_end|>", "<end_of_turn>", "<|endoftext|>", "<｜end▁of▁sentence｜>"]
            .iter()
            .filter_map(|s| self.tokenizer().token_id(s))
            .collect()
    }
}
