//! Prefills in place made ahead: when the executor announces a run of them
//! ([`kamera_sched::Encoder::ahead`], e.g. a window rebuilt from its first changed slot, or the
//! survivors of an eviction repaired), the text chunks that follow one another are prefilled in
//! one model call at the first (one pass over the weights, batches as large as the run) and the
//! later ones handed out as they are asked for, in order, over the context that call left.
//! Anything else asked for, or asked over another context, drops what was made.

use std::collections::VecDeque;

use kamera_ops::ChunkKv;
use kamera_store::ChunkId;

use super::SessionEncoder;
use crate::error::{Error, Result, model};

fn ops(e: kamera_ops::Error) -> Error {
    Error::Ops {
        op: "prefill in place",
        source: Box::new(e),
    }
}

/// A prefill in place made with the one before it in one model call: valid over the context
/// that call left (`rows` rows, the chunk before it last, at the version the executor gave it).
pub(super) struct Made {
    chunk: ChunkId,
    at: i64,
    after: (ChunkId, Option<u64>),
    rows: usize,
    kv: ChunkKv,
}

/// The announced run and what was made of it.
#[derive(Default)]
pub(super) struct Ahead {
    announced: Vec<(ChunkId, i64)>,
    made: VecDeque<Made>,
}

impl Ahead {
    pub(super) fn announce(&mut self, prefills: &[(ChunkId, i64)]) {
        self.announced = prefills.to_vec();
        self.made.clear();
    }

    pub(super) fn clear(&mut self) {
        self.announced.clear();
        self.made.clear();
    }

    /// `chunk` was handed out as `version`: the next one made after it is valid after that.
    pub(super) fn handed_out(&mut self, chunk: ChunkId, version: u64) {
        if let Some(m) = self.made.front_mut()
            && m.after == (chunk, None)
        {
            m.after.1 = Some(version);
        }
    }
}

impl SessionEncoder {
    /// `chunk` prefilled in place at the live context's end (`at`): made ahead, or now with the
    /// announced text chunks that follow it in the same model call.
    pub(super) fn prefill_in_place(&mut self, chunk: ChunkId, at: i64) -> Result<ChunkKv> {
        const OP: &str = "prefill in place";
        if let Some(kv) = self.take_made(chunk, at) {
            self.ctx.push(&kv).map_err(model("context push"))?;
            self.bytes_moved += kv.kv_bytes() as u64;
            return Ok(kv);
        }
        let run = self.announced_run(chunk, at);
        if run.len() < 2 {
            return Ok(self.extend_chunk(OP, &chunk)?.chunk);
        }
        let mut tokens = Vec::new();
        let mut sizes = Vec::with_capacity(run.len());
        for c in &run {
            let t = &self.content_of(OP, c)?.tokens;
            tokens.extend_from_slice(t);
            sizes.push(t.len());
        }
        let base = self.ctx.len();
        self.prefill_calls += 1;
        let mut ctx = std::mem::replace(&mut self.ctx, self.model.empty_context());
        let out = self.model.extend(&tokens, &mut ctx).map_err(model(OP));
        self.ctx = ctx;
        let all = out?.chunk;
        // The context keeps the first chunk's rows; the others are pushed back when asked for.
        self.ctx.truncate(base + sizes[0]);
        let mut start = sizes[0];
        for (i, (c, n)) in run.iter().zip(&sizes).enumerate().skip(1) {
            let kv = all.rows(start, *n).map_err(ops)?;
            self.ahead.made.push_back(Made {
                chunk: *c,
                at: kv.offset(),
                after: (run[i - 1], None),
                rows: base + start,
                kv,
            });
            start += n;
        }
        all.rows(0, sizes[0]).map_err(ops)
    }

    /// The next chunk made ahead, if it is `chunk` at `at` over the context it was made for.
    fn take_made(&mut self, chunk: ChunkId, at: i64) -> Option<ChunkKv> {
        let m = self.ahead.made.pop_front()?;
        let last = self.ctx_chunks.last().map(|&(c, v)| (c, Some(v)));
        if m.chunk == chunk && m.at == at && self.ctx.len() == m.rows && last == Some(m.after) {
            return Some(m.kv);
        }
        self.ahead.made.clear();
        None
    }

    /// The announced prefills from `chunk` at `at` on that can go in one call: text chunks,
    /// each at the end of the one before (`chunk` alone when it was not announced).
    fn announced_run(&mut self, chunk: ChunkId, at: i64) -> Vec<ChunkId> {
        let announced = std::mem::take(&mut self.ahead.announced);
        let Some(i) = announced.iter().position(|&p| p == (chunk, at)) else {
            return vec![chunk];
        };
        let text_tokens = |c: &ChunkId| {
            self.content
                .get(c)
                .filter(|c| c.image.is_none())
                .map(|c| c.tokens.len() as i64)
        };
        let mut run = Vec::new();
        let mut end = at;
        for &(c, a) in &announced[i..] {
            match text_tokens(&c) {
                Some(n) if a == end && n > 0 => {
                    run.push(c);
                    end += n;
                }
                _ => break,
            }
        }
        if run.is_empty() {
            run.push(chunk);
        }
        run
    }
}
