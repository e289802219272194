//! The model a policy asks, as a trait: [`crate::Llm`] (a local kamera-model model over the
//! session's live KV context) implements it, and a caller may plug another one (a remote model)
//! with [`crate::AgentBuilder::language_model`].

use kamera_model::Context;

use crate::error::{Error, Result, model};
use crate::live::Live;
use crate::llm::{Llm, ModelCall};
use crate::runtime::Session;
use crate::schema::{ActionSchema, Fit, Grammar, LEAD};

/// What a model call reads: the context window as the session placed it. The KV is brought up
/// to date on first use ([`View::kv`]): a policy that reads no model (a scripted step) runs none
/// of the session's held plans.
pub struct View<'a> {
    session: &'a mut Session,
    /// The same window as text (the prefix and the page chunks in window order, control tokens
    /// left out): what a model that cannot read the KV is given instead.
    pub text: &'a str,
    /// Milliseconds [`View::kv`] spent bringing the context up to date.
    pub(crate) context_ms: f64,
}

impl<'a> View<'a> {
    /// A view of `session`'s window, `text` being the window as text ([`window_text`]).
    pub fn new(session: &'a mut Session, text: &'a str) -> View<'a> {
        View {
            session,
            text,
            context_ms: 0.0,
        }
    }

    /// The session's live KV context (pinned prefix, then the page chunks), brought up to date
    /// now ([`Session::context`]). A local model appends its prompt to it and cuts it off again;
    /// nothing before the prompt is prefilled.
    pub fn kv(&mut self) -> Result<&mut Context> {
        let t = std::time::Instant::now();
        let ctx = self.session.context()?;
        self.context_ms += crate::ms(t);
        Ok(ctx)
    }

    /// [`View::kv`] with the last call's prompt rows kept after the window ([`Live`]), so that
    /// a prompt that shares its start with the last one prefills only the rest.
    pub fn live(&mut self) -> Result<Live<'_>> {
        let t = std::time::Instant::now();
        let live = self.session.live()?;
        self.context_ms += crate::ms(t);
        Ok(live)
    }
}

/// What the model policy (and scripted questions) need of a model. Required: free generation
/// after an instruction and ranking continuations by likelihood; constrained decoding has a
/// default (a free reply checked against the schema, else the ranked choice) for a model that
/// takes no token mask. Implementations must not keep anything they append to [`View::kv`].
pub trait LanguageModel: Send + Sync {
    /// Greedy text (seeded sampling when `seed > 0`) after `instruction`, the reply started by
    /// `lead` (e.g. `{"action": "`); the output includes `lead`.
    fn generate_after(
        &self,
        view: &mut View<'_>,
        instruction: &str,
        lead: &str,
        max_new: usize,
        seed: u64,
    ) -> Result<ModelCall>;

    /// The candidate continuation of `lead` after `instruction` the model finds most likely
    /// (with its per-candidate `scores`); the output is `lead` + that candidate.
    fn rank(&self, view: &mut View<'_>, instruction: &str, lead: &str, candidates: &[String]) -> Result<ModelCall>;

    /// The choice the model finds most likely as the answer to `question`.
    fn choose(&self, view: &mut View<'_>, question: &str, choices: &[String]) -> Result<ModelCall> {
        let instruction = format!("Question: {question}\nAnswer with one of: {}.", choices.join(", "));
        self.rank(view, &instruction, "", choices)
    }

    /// A reply that is a complete action of `schema` (starting with [`LEAD`]). The local model
    /// decodes under a token mask; this default asks for free JSON and, when that is not an
    /// action of the schema, ranks the schema's actions.
    fn generate_constrained(
        &self,
        view: &mut View<'_>,
        instruction: &str,
        schema: &ActionSchema,
        max_new: usize,
    ) -> Result<ModelCall> {
        let call = self.generate_after(view, instruction, LEAD, max_new, 0)?;
        let end = call.output.find('}').map_or(call.output.len(), |i| i + 1);
        if schema.action(&call.output[..end]).is_some() {
            return Ok(ModelCall {
                output: call.output[..end].to_string(),
                ..call
            });
        }
        let heads: Vec<String> = schema
            .templates
            .iter()
            .filter(|t| t.ranked && t.tail.is_none())
            .map(|t| t.head[LEAD.len()..].to_string())
            .collect();
        if heads.is_empty() {
            return Err(Error::Policy {
                tries: 1,
                last: call.output,
            });
        }
        self.rank(view, instruction, LEAD, &heads)
    }

    /// Greedy text after `instruction` held to `grammar` (a complete reply of it, starting with
    /// its lead). The local model decodes under a token mask; this default generates freely and
    /// takes the shortest complete prefix of the output, or closes its longest open one.
    fn decode(
        &self,
        view: &mut View<'_>,
        instruction: &str,
        grammar: &dyn Grammar,
        max_new: usize,
    ) -> Result<ModelCall> {
        let mut call = self.generate_after(view, instruction, grammar.lead(), max_new, 0)?;
        call.output = held_to(grammar, &call.output).ok_or_else(|| Error::Policy {
            tries: 1,
            last: call.output.clone(),
        })?;
        Ok(call)
    }

    /// Greedy text (seeded sampling when `seed > 0`) after `instruction`.
    fn generate(&self, view: &mut View<'_>, instruction: &str, max_new: usize, seed: u64) -> Result<ModelCall> {
        self.generate_after(view, instruction, "", max_new, seed)
    }
}

impl LanguageModel for Llm {
    fn generate_after(
        &self,
        view: &mut View<'_>,
        instruction: &str,
        lead: &str,
        max_new: usize,
        seed: u64,
    ) -> Result<ModelCall> {
        Llm::generate_after(self, view.live()?, instruction, lead, max_new, seed)
    }

    fn rank(&self, view: &mut View<'_>, instruction: &str, lead: &str, candidates: &[String]) -> Result<ModelCall> {
        Llm::rank(self, view.live()?, instruction, lead, candidates)
    }

    fn choose(&self, view: &mut View<'_>, question: &str, choices: &[String]) -> Result<ModelCall> {
        Llm::choose(self, view.live()?, question, choices)
    }

    fn generate_constrained(
        &self,
        view: &mut View<'_>,
        instruction: &str,
        schema: &ActionSchema,
        max_new: usize,
    ) -> Result<ModelCall> {
        Llm::generate_constrained(self, view.live()?, instruction, schema, max_new)
    }

    fn decode(
        &self,
        view: &mut View<'_>,
        instruction: &str,
        grammar: &dyn Grammar,
        max_new: usize,
    ) -> Result<ModelCall> {
        Llm::decode_constrained(self, view.live()?, instruction, grammar, max_new)
    }
}

/// A free `output` held to `grammar`: its shortest complete prefix, else its longest open prefix
/// closed by the grammar; `None` when no prefix is even open.
fn held_to(grammar: &dyn Grammar, output: &str) -> Option<String> {
    let ends: Vec<usize> = output.char_indices().map(|(i, c)| i + c.len_utf8()).collect();
    match ends.iter().find(|&&e| grammar.fit(&output[..e]) == Fit::Complete) {
        Some(&e) => Some(output[..e].to_string()),
        None => ends
            .iter()
            .rev()
            .find(|&&e| grammar.fit(&output[..e]) == Fit::Open)
            .and_then(|&e| grammar.close(&output[..e])),
    }
}

/// The session's window as text: its tokens decoded, control tokens left out.
pub(crate) fn window_text(session: &crate::runtime::Session) -> Result<String> {
    session
        .model()
        .tokenizer()
        .decode(&session.window_tokens(), true)
        .map_err(model("decode"))
}

#[cfg(test)]
mod tests {
    use super::held_to;
    use crate::schema::QuotedText;

    /// A plugged model's free reply is cut after its first complete reply, closed when it stops
    /// open, and refused when it leaves the grammar at once.
    #[test]
    fn free_replies_are_held_to_the_grammar() {
        let g = QuotedText {
            lead: "Next: say \"",
            within: None,
        };
        assert_eq!(
            held_to(&g, "Next: say \"hi\" and more").as_deref(),
            Some("Next: say \"hi\"")
        );
        assert_eq!(
            held_to(&g, "Next: say \"unfinished").as_deref(),
            Some("Next: say \"unfinished\"")
        );
        assert_eq!(held_to(&g, "Something else"), None);
    }
}
