//! The model side of the loop: questions and action prompts are appended to the session's live
//! window context (whose chunks the scheduler placed) and answered; what the call decoded is cut
//! off again, and on the session's context the prompt's rows stay for the next call to reuse
//! ([`Live`]). Nothing before the prompt is copied or prefilled.

use std::sync::Arc;
use std::time::Instant;

use crate::ms;

use kamera_model::{Input, Model, PrefillOptions};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, model};
use crate::live::Live;
use crate::schema::{ActionSchema, Fit, Grammar};

/// Timings of one model call, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallTimings {
    /// Bringing the window's context up to date before the call (the session's plan execution).
    pub reuse_ms: f64,
    /// Prefilling the question / instruction suffix.
    pub prefill_ms: f64,
    /// Decoding or scoring the answer.
    pub decode_ms: f64,
}

/// What the model was asked and what it said.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelCall {
    /// Tokens in the context (prefix + page chunks) the call reused.
    pub context_tokens: usize,
    /// The suffix prefilled fresh (question or instruction).
    pub prompt: String,
    pub prompt_tokens: usize,
    /// Leading prompt tokens whose rows the last call on the same window left (not prefilled).
    #[serde(default)]
    pub prompt_reused: usize,
    /// Raw output (generated text, or the chosen candidate).
    pub output: String,
    pub output_tokens: Vec<u32>,
    /// Per-choice mean log-likelihood, when choices were scored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<(String, f32)>,
    /// Per choice, its tokens and each token's log-probability (the local model's `rank`; empty
    /// for a model that gives only `scores`): what the policy needs to weigh the choices as a
    /// token trie ([`crate::Decoding::Restricted`]). Not written to traces.
    #[serde(skip)]
    pub token_scores: Vec<(String, Vec<(u32, f32)>)>,
    pub timings: CallTimings,
}

/// The embedded model plus the chat framing the agent uses.
pub struct Llm {
    model: Arc<Model>,
    /// Each token's text, for constrained decoding (built at first use).
    pieces: std::sync::OnceLock<Vec<String>>,
}

/// Tokens of `text` under `model`'s tokenizer, with BOS when `bos`.
pub(crate) fn tokenize(model: &Model, text: &str, bos: bool) -> Result<Vec<u32>> {
    let t = model.tokenizer();
    if bos { t.encode(text) } else { t.encode_raw(text) }.map_err(crate::error::model("encode"))
}

fn log_softmax_at(logits: &[f32], id: u32) -> f32 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f32 = logits.iter().map(|x| (x - m).exp()).sum();
    logits[id as usize] - m - z.ln()
}

impl Llm {
    pub fn new(model: Arc<Model>) -> Llm {
        Llm {
            model,
            pieces: std::sync::OnceLock::new(),
        }
    }

    /// Each token's text; control tokens and partial UTF-8 are empty (never chosen).
    fn pieces(&self) -> &[String] {
        self.pieces.get_or_init(|| {
            let t = self.model.tokenizer();
            (0..t.vocab_size() as u32)
                .map(|id| match t.decode(&[id], true) {
                    Ok(p) if !t.is_control(id) && !p.contains('\u{fffd}') => p,
                    _ => String::new(),
                })
                .collect()
        })
    }

    /// Greedy decoding held to `schema` after `instruction` with the reply started by
    /// [`crate::LEAD`]: at each step the most likely token that keeps the reply a prefix of one of the
    /// page's valid actions (a token mask), until the reply is a complete action. When
    /// `max_new` tokens run out first, the reply is closed by its shortest completion. The
    /// output is always a complete action of the schema.
    pub fn generate_constrained<'c>(
        &self,
        ctx: impl Into<Live<'c>>,
        instruction: &str,
        schema: &ActionSchema,
        max_new: usize,
    ) -> Result<ModelCall> {
        self.decode_constrained(ctx, instruction, schema, max_new)
    }

    /// Greedy decoding held to any [`Grammar`] (a page's actions, a JSON Schema) after
    /// `instruction`, the reply started by the grammar's lead: at each step the most likely
    /// token that keeps the reply open or complete, until it is complete; when `max_new` tokens
    /// run out first, the grammar's shortest completion closes it. The output is always a
    /// complete reply of the grammar.
    pub fn decode_constrained<'c>(
        &self,
        ctx: impl Into<Live<'c>>,
        instruction: &str,
        schema: &dyn Grammar,
        max_new: usize,
    ) -> Result<ModelCall> {
        self.constrained_on(&mut ctx.into(), instruction, schema, max_new)
    }

    fn constrained_on(
        &self,
        live: &mut Live<'_>,
        instruction: &str,
        schema: &dyn Grammar,
        max_new: usize,
    ) -> Result<ModelCall> {
        let pieces = self.pieces();
        let context_tokens = live.window_len();
        let lead = schema.lead();
        let prompt = format!("{}{lead}", self.close_turn(instruction));
        let ptoks = self.tokens(&prompt, false)?;
        let t1 = Instant::now();
        let (mut step, prompt_reused) = live.prompt(&self.model, &ptoks)?;
        let prefill_ms = ms(t1);
        let t2 = Instant::now();
        let mut reply = lead.to_string();
        let mut out = Vec::new();
        let mut order: Vec<u32> = Vec::new();
        while schema.fit(&reply) != Fit::Complete {
            if out.len() >= max_new {
                reply = schema.close(&reply).ok_or_else(|| Error::Policy {
                    tries: 1,
                    last: reply.clone(),
                })?;
                break;
            }
            // The argmax first (usually allowed), then the rest in order of likelihood.
            let best = kamera_model::argmax(&step.logits);
            let allowed = |id: u32| {
                let p = &pieces[id as usize];
                !p.is_empty() && schema.fit(&format!("{reply}{p}")) != Fit::Dead
            };
            let next = if allowed(best) {
                Some(best)
            } else {
                if order.len() != step.logits.len() {
                    order = (0..step.logits.len() as u32).collect();
                }
                let logits = &step.logits;
                order.sort_unstable_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
                order.iter().copied().find(|&id| allowed(id))
            };
            let Some(next) = next else {
                return Err(Error::Policy { tries: 1, last: reply });
            };
            reply.push_str(&pieces[next as usize]);
            out.push(next);
            if schema.fit(&reply) == Fit::Complete {
                break;
            }
            step = self.model.extend(&[next], live.ctx()).map_err(model("decode"))?;
        }
        Ok(ModelCall {
            context_tokens,
            prompt_tokens: ptoks.len(),
            prompt_reused,
            prompt,
            output: reply,
            output_tokens: out,
            scores: Vec::new(),
            token_scores: Vec::new(),
            timings: CallTimings {
                reuse_ms: 0.0,
                prefill_ms,
                decode_ms: ms(t2),
            },
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The fixed prefix chunk text: system turn and the opening of the user turn with the goal.
    pub fn prefix_text(&self, goal: &str) -> String {
        let chat = self.model.chat_prompt("\u{0}");
        let open = chat.split('\u{0}').next().unwrap_or("").to_string();
        format!("{open}Goal: {goal}\nPages seen so far:\n")
    }

    /// Tokens of a text (`bos` for the first chunk of a context; prompts and pages go without).
    pub fn tokens(&self, text: &str, bos: bool) -> Result<Vec<u32>> {
        tokenize(&self.model, text, bos)
    }

    /// Logits after prefilling `tokens` from scratch at position 0: the full re-prefill that
    /// reuse replaces (baselines, and the reference for KL).
    pub fn full_prefill(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let p = self
            .model
            .prefill(tokens, 0, &self.model.empty_context())
            .map_err(model("prefill"))?;
        Ok(p.logits)
    }

    /// `text` as the user's turn, closed, with the assistant's turn opened: what follows the
    /// window's chunks in every model call.
    pub fn close_turn(&self, text: &str) -> String {
        // "<|im_end|>\n<|im_start|>assistant\n" etc.: the tail of the chat template after the user text.
        let chat = self.model.chat_prompt("\u{0}");
        let tail = chat.split('\u{0}').nth(1).unwrap_or("\n");
        format!("{text}{tail}")
    }

    /// Picks the choice the model finds most likely after `question` (mean token log-likelihood).
    pub fn choose<'c>(&self, ctx: impl Into<Live<'c>>, question: &str, choices: &[String]) -> Result<ModelCall> {
        let prompt = self.question_prompt(question, choices);
        self.rank_after(ctx, prompt, choices)
    }

    /// The question prompt of [`Llm::choose`] (what a baseline prefills after the same window).
    pub fn question_prompt(&self, question: &str, choices: &[String]) -> String {
        self.close_turn(&format!(
            "Question: {question}\nAnswer with one of: {}.",
            choices.join(", ")
        ))
    }

    /// Picks the continuation of the reply started by `lead` after `instruction` that the model
    /// finds most likely (mean token log-likelihood); the output is `lead` + that continuation.
    /// This is how the model policy stays inside the action grammar.
    pub fn rank<'c>(
        &self,
        ctx: impl Into<Live<'c>>,
        instruction: &str,
        lead: &str,
        candidates: &[String],
    ) -> Result<ModelCall> {
        let prompt = format!("{}{lead}", self.close_turn(instruction));
        let mut call = self.rank_after(ctx, prompt, candidates)?;
        call.output = format!("{lead}{}", call.output);
        Ok(call)
    }

    /// Scores `candidates` after `prompt`, appended to `ctx`.
    fn rank_after<'c>(&self, ctx: impl Into<Live<'c>>, prompt: String, candidates: &[String]) -> Result<ModelCall> {
        self.rank_on(&mut ctx.into(), prompt, candidates)
    }

    fn rank_on(&self, live: &mut Live<'_>, prompt: String, candidates: &[String]) -> Result<ModelCall> {
        let context_tokens = live.window_len();
        let reuse_ms = 0.0;
        let ptoks = self.tokens(&prompt, false)?;
        let t1 = Instant::now();
        let (q, prompt_reused) = live.prompt(&self.model, &ptoks)?;
        let qctx = live.ctx();
        let prefill_ms = ms(t1);
        let t2 = Instant::now();
        let mut scores = Vec::new();
        let mut token_scores = Vec::new();
        for c in candidates {
            let ct = self.tokens(c, false)?;
            let Some(&first) = ct.first() else {
                continue;
            };
            let mut lp = log_softmax_at(&q.logits, first);
            let mut per_token = vec![(first, lp)];
            if ct.len() > 1 {
                let out = self
                    .model
                    .prefill_with(
                        Input::Tokens(&ct[..ct.len() - 1]),
                        qctx.end(),
                        qctx,
                        PrefillOptions { all_logits: true },
                    )
                    .map_err(model("score"))?;
                let all = out.all_logits.unwrap_or_default();
                let vocab = q.logits.len();
                for (i, &tok) in ct[1..].iter().enumerate() {
                    let t = log_softmax_at(&all[i * vocab..(i + 1) * vocab], tok);
                    per_token.push((tok, t));
                    lp += t;
                }
            }
            scores.push((c.clone(), lp / ct.len() as f32));
            token_scores.push((c.clone(), per_token));
        }
        let best = scores
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|s| s.0.clone())
            .unwrap_or_default();
        let output_tokens = self.tokens(&best, false)?;
        Ok(ModelCall {
            context_tokens,
            prompt_tokens: ptoks.len(),
            prompt_reused,
            prompt,
            output: best,
            output_tokens,
            scores,
            token_scores,
            timings: CallTimings {
                reuse_ms,
                prefill_ms,
                decode_ms: ms(t2),
            },
        })
    }

    /// Greedy generation (or seeded sampling when `seed > 0`) after `instruction`.
    pub fn generate<'c>(
        &self,
        ctx: impl Into<Live<'c>>,
        instruction: &str,
        max_new: usize,
        seed: u64,
    ) -> Result<ModelCall> {
        self.generate_after(ctx, instruction, "", max_new, seed)
    }

    /// Like [`Llm::generate`], with the assistant's reply started by `lead` (e.g. `{"action": "`
    /// to hold the model to a JSON object); the output includes `lead`.
    pub fn generate_after<'c>(
        &self,
        ctx: impl Into<Live<'c>>,
        instruction: &str,
        lead: &str,
        max_new: usize,
        seed: u64,
    ) -> Result<ModelCall> {
        self.generate_on(&mut ctx.into(), instruction, lead, max_new, seed)
    }

    fn generate_on(
        &self,
        live: &mut Live<'_>,
        instruction: &str,
        lead: &str,
        max_new: usize,
        seed: u64,
    ) -> Result<ModelCall> {
        let context_tokens = live.window_len();
        let reuse_ms = 0.0;
        let prompt = format!("{}{lead}", self.close_turn(instruction));
        let ptoks = self.tokens(&prompt, false)?;
        let t1 = Instant::now();
        let (mut step, prompt_reused) = live.prompt(&self.model, &ptoks)?;
        let prefill_ms = ms(t1);
        let t2 = Instant::now();
        let stop = self.model.chat_stop_tokens();
        let eos = self.model.tokenizer().eos();
        let mut rng = seed;
        let mut out = Vec::new();
        while out.len() < max_new {
            let next = if seed == 0 {
                kamera_model::argmax(&step.logits)
            } else {
                sample_top(&step.logits, &mut rng)
            };
            if Some(next) == eos || stop.contains(&next) {
                break;
            }
            out.push(next);
            step = self.model.extend(&[next], live.ctx()).map_err(model("decode"))?;
        }
        let output = format!(
            "{lead}{}",
            self.model.tokenizer().decode(&out, true).map_err(model("decode"))?
        );
        Ok(ModelCall {
            context_tokens,
            prompt_tokens: ptoks.len(),
            prompt_reused,
            prompt,
            output,
            output_tokens: out,
            scores: Vec::new(),
            token_scores: Vec::new(),
            timings: CallTimings {
                reuse_ms,
                prefill_ms,
                decode_ms: ms(t2),
            },
        })
    }
}

/// Deterministic top-8 sampling with a splitmix64 state (for bounded retries of the model policy).
fn sample_top(logits: &[f32], state: &mut u64) -> u32 {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    idx.truncate(8);
    let m = logits[idx[0]];
    let p: Vec<f64> = idx.iter().map(|&i| ((logits[i] - m) as f64 / 0.8).exp()).collect();
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let u = ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64;
    let mut r = u * p.iter().sum::<f64>();
    for (j, x) in p.iter().enumerate() {
        r -= x;
        if r <= 0.0 {
            return idx[j] as u32;
        }
    }
    idx[0] as u32
}

/// Strict JSON action parsing for the model policy: the first `{...}` object in `text`.
pub fn parse_action(text: &str) -> std::result::Result<kamera_browser::Action, String> {
    let start = text.find('{').ok_or("no JSON object")?;
    let mut depth = 0;
    let mut end = None;
    for (i, ch) in text[start..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(start + i + 1);
                    break;
                }
            }
            _ => {}
        }
    }
    let end = end.ok_or("unterminated JSON object")?;
    let action: kamera_browser::Action = serde_json::from_str(&text[start..end]).map_err(|e| e.to_string())?;
    // A model never picks a file to send: a page could talk it into sending any file it can
    // read. Uploads are scenario steps, from a folder the scenario allows.
    if matches!(action, kamera_browser::Action::Upload { .. }) {
        return Err("upload is not a model action (a scenario's `upload` step names the file)".into());
    }
    Ok(action)
}

impl From<kamera_ops::Error> for Error {
    fn from(source: kamera_ops::Error) -> Self {
        Error::Ops {
            op: "kv",
            source: Box::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    /// A model's reply never uploads a file, even when it writes a well-formed upload action.
    #[test]
    fn a_model_cannot_upload() {
        let e = super::parse_action(r#"{"action": "upload", "id": 1, "path": "/etc/passwd"}"#).unwrap_err();
        assert!(e.contains("not a model action"), "{e}");
        assert!(super::parse_action(r#"{"action": "click", "id": 1}"#).is_ok());
    }
}
