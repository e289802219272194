//! A model call's view of the live context: the window's rows, then the rows of the last call's
//! prompt, kept so that the next call prefills only where its prompt differs (what a radix
//! prefix cache gives an engine; agent prompts share their instruction text step after step).
//! The session also keeps earlier prompts' rows per window layout: a call whose prompt shares
//! more with one of them than with the last call's swaps them first (a radix cache's branches).
//! A call's decoded tokens are always cut off; on a plain [`Context`] nothing is kept.

use kamera_model::{Context, Model, Prefill};

use crate::error::{Result, model};
use crate::runtime::prompt_rows::{PromptRows, common_prefix};

/// A context a model call appends its prompt to (see the module doc).
pub struct Live<'a> {
    ctx: &'a mut Context,
    /// Rows of the window: the call's prompt starts here.
    base: usize,
    tail: Tail<'a>,
    /// Other prompts kept over this window's layout (the session's), and the layout.
    others: Option<(&'a mut PromptRows, u64)>,
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
            others: None,
        }
    }
}

impl<'a> Live<'a> {
    /// The session's context whose last `tail.len()` rows are the prompt `tail` of the last call;
    /// `others`: the prompts kept for the window's layout.
    pub(crate) fn kept(
        ctx: &'a mut Context,
        tail: &'a mut Vec<u32>,
        others: Option<(&'a mut PromptRows, u64)>,
    ) -> Live<'a> {
        // A context shorter than the tail holds no kept prompt: the window is all of it.
        if tail.len() > ctx.len() {
            tail.clear();
        }
        let base = ctx.len() - tail.len();
        Live {
            base,
            ctx,
            tail: Tail::Kept(tail),
            others,
        }
    }

    /// Rows of the window before the prompt.
    pub fn window_len(&self) -> usize {
        self.base
    }

    /// Prefills `prompt` after the window and returns its last token's logits: rows of the
    /// longest common prefix with the last call's prompt, or with a kept prompt of this layout
    /// when that shares more, are reused (at least the last token is always run, for its
    /// logits). The second value is the number of prompt tokens reused.
    pub fn prompt(&mut self, m: &Model, prompt: &[u32]) -> Result<(Prefill, usize)> {
        self.switch_branch(prompt)?;
        let tail = self.tail.tokens();
        let common = common_prefix(tail, prompt).min(prompt.len().saturating_sub(1));
        tail.truncate(common);
        self.ctx.truncate(self.base + common);
        let out = m.extend(&prompt[common..], self.ctx).map_err(model("prefill"))?;
        let tail = self.tail.tokens();
        tail.clear();
        tail.extend_from_slice(prompt);
        Ok((out, common))
    }

    /// Before `prompt` replaces the last call's: a kept prompt of this layout that shares more
    /// with it comes in (the last call's is kept in its place), and a last or incoming prompt
    /// about to be cut where `prompt` diverges is kept whole, so no branch is lost.
    fn switch_branch(&mut self, prompt: &[u32]) -> Result<()> {
        let (Tail::Kept(tail), Some((rows, layout))) = (&mut self.tail, &mut self.others) else {
            return Ok(());
        };
        let now = common_prefix(tail, prompt);
        let incoming = rows.take_best(*layout, prompt, now);
        if incoming.is_none() && now >= tail.len() {
            return Ok(());
        }
        if !tail.is_empty() {
            let kv = self
                .ctx
                .rows_chunk(self.base, tail.len())
                .map_err(model("keep the prompt's rows"))?;
            rows.keep(*layout, std::mem::take(*tail), kv);
        }
        if let Some((tokens, kv)) = incoming {
            // A kept branch that `prompt` shares only in part stays kept whole: the call cuts it
            // where they diverge (three prompts over one window: the third takes the first's
            // rows as its start, and the first still comes back whole after it).
            let partial = common_prefix(&tokens, prompt) < tokens.len();
            self.ctx.truncate(self.base);
            if kv.offset() == self.ctx.rotary_end() {
                self.ctx.push(&kv).map_err(model("prompt rows back"))?;
                **tail = tokens.clone();
            }
            if partial {
                rows.keep(*layout, tokens, kv);
            }
        } else {
            // The kept copy is the branch; the context's rows up to the shared start stay.
            **tail = prompt[..now].to_vec();
        }
        Ok(())
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
