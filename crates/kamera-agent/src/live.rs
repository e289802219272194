//! A model call's view of the live context: the window's rows, then the rows of the last call's
//! prompt, kept so that the next call prefills only where its prompt differs (what a radix
//! prefix cache gives an engine; agent prompts share their instruction text step after step).
//! A call's decoded tokens are always cut off; on a plain [`Context`] nothing is kept.

use kamera_model::{Context, Model, Prefill};

use crate::error::{Result, model};

/// A context a model call appends its prompt to (see the module doc).
pub struct Live<'a> {
    ctx: &'a mut Context,
    /// Rows of the window: the call's prompt starts here.
    base: usize,
    tail: Tail<'a>,
}

/// The tokens of the prompt rows kept after the window.
enum Tail<'a> {
    /// A plain context: the prompt is cut off after the call.
    Dropped(Vec<u32>),
    /// The session's live context: the prompt stays for the next call.
    Kept(&'a mut Vec<u32>),
}

impl Tail<'_> {
    fn tokens(&mut self) -> &mut Vec<u32> {
        match self {
            Tail::Dropped(t) => t,
            Tail::Kept(t) => t,
        }
    }
}

impl<'a> From<&'a mut Context> for Live<'a> {
    fn from(ctx: &'a mut Context) -> Live<'a> {
        Live {
            base: ctx.len(),
            ctx,
            tail: Tail::Dropped(Vec::new()),
        }
    }
}

impl<'a> Live<'a> {
    /// The session's context whose last `tail.len()` rows are the prompt `tail` of the last call.
    pub(crate) fn kept(ctx: &'a mut Context, tail: &'a mut Vec<u32>) -> Live<'a> {
        // A context shorter than the tail holds no kept prompt: the window is all of it.
        if tail.len() > ctx.len() {
            tail.clear();
        }
        let base = ctx.len() - tail.len();
        Live {
            base,
            ctx,
            tail: Tail::Kept(tail),
        }
    }

    /// Rows of the window before the prompt.
    pub fn window_len(&self) -> usize {
        self.base
    }

    /// Prefills `prompt` after the window and returns its last token's logits: rows of the
    /// longest common prefix with the last call's prompt are reused (at least the last token is
    /// always run, for its logits). The second value is the number of prompt tokens reused.
    pub fn prompt(&mut self, m: &Model, prompt: &[u32]) -> Result<(Prefill, usize)> {
        let tail = self.tail.tokens();
        let common = tail
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        tail.truncate(common);
        self.ctx.truncate(self.base + common);
        let out = m.extend(&prompt[common..], self.ctx).map_err(model("prefill"))?;
        let tail = self.tail.tokens();
        tail.clear();
        tail.extend_from_slice(prompt);
        Ok((out, common))
    }

    /// The context after the prompt, for decoding and scoring (what is appended is cut off when
    /// the call ends).
    pub fn ctx(&mut self) -> &mut Context {
        self.ctx
    }
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        let keep = match &self.tail {
            Tail::Dropped(_) => 0,
            Tail::Kept(t) => t.len(),
        };
        self.ctx.truncate(self.base + keep);
    }
}
