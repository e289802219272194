//! The executor announces each run of two or more prefills in place to the encoder before the
//! first of them ([`kamera_sched::Encoder::ahead`]: it may make them in one model call), in the
//! order it then asks for them; a prefill alone in place, or one separated from the next by
//! another step, is not announced. Plans run now, background steps, and plans held until one
//! read and run back to back ([`kamera_sched::Executor::run_all`]) alike.

mod common;

use common::{Synth, executor, max_diff};
use kamera_sched::{Plan, Step};

#[test]
fn runs_of_prefills_in_place_are_announced_in_the_order_they_run() {
    let mut synth = Synth::new();
    let (a, b, c, d) = (
        synth.chunk(1, 5),
        synth.chunk(2, 3),
        synth.chunk(3, 4),
        synth.chunk(4, 6),
    );
    let full = synth.full(&[a, b, c, d]);
    let mut ex = executor(synth);
    let prefill = |chunk, at| Step::Prefill {
        chunk,
        at,
        alone: false,
    };
    let plan = Plan {
        steps: vec![prefill(a, 0), prefill(b, 5), prefill(c, 8)],
        background: vec![Step::Prefill {
            chunk: d,
            at: 0,
            alone: true,
        }],
        decisions: Vec::new(),
    };
    ex.run_now(&plan).unwrap();
    assert_eq!(ex.encoder().announced, vec![vec![(a, 0), (b, 5), (c, 8)]]);
    // What was announced is what ran: each chunk's KV after the ones before it.
    let whole = [a, b, c].map(|id| ex.resident(&id).unwrap().clone());
    let mut at = 0;
    for kv in &whole {
        assert_eq!(kv.offset(), at);
        at += kv.n_tokens() as i64;
    }
    let prefix = full.rows(0, 12).unwrap();
    let got = common::concat(
        &common::concat(&whole[0], &whole[1], &ex.encoder().rope),
        &whole[2],
        &ex.encoder().rope,
    );
    assert!(max_diff(&got, &prefix) < 1e-6);

    // A lone prefill in place, then a run in the background (a repair): only the run.
    ex.encoder_mut().announced.clear();
    let plan = Plan {
        steps: vec![prefill(d, 12)],
        background: vec![prefill(b, 5), prefill(c, 8)],
        decisions: Vec::new(),
    };
    ex.run_now(&plan).unwrap();
    assert_eq!(ex.encoder().announced, vec![vec![(b, 5), (c, 8)]]);

    // Plans held until one read and run back to back: a run across them is one announcement.
    ex.encoder_mut().announced.clear();
    let one = |step| Plan {
        steps: vec![step],
        background: Vec::new(),
        decisions: Vec::new(),
    };
    ex.run_all(&[one(prefill(a, 0)), one(prefill(b, 5)), one(prefill(c, 8))])
        .unwrap();
    assert_eq!(ex.encoder().announced, vec![vec![(a, 0), (b, 5), (c, 8)]]);
}
