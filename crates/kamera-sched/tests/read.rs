//! A question's read (`Window::repair_read`, `CostModel::read`): a page placed blind is
//! prefilled again in place before the answer where the model's read KL is over the budget, run
//! by the reference executor on a synthetic model.

mod common;

use common::{Synth, executor, model};
use kamera_sched::{Choice, CostModel, DecisionOp, Step, Window, WindowConfig};

/// A question about a page recalled blind: where a read of blind KV is predicted over the KL
/// budget, the page is prefilled again in place before the answer (its KV then that of the full
/// prefill of the window) and its patch for this context kept; within the budget, nothing.
#[test]
fn a_questions_page_placed_blind_is_prefilled_again_before_the_answer() {
    let run = |read_blind_kl: f64| {
        let mut synth = Synth::new();
        let (a, b, c) = (synth.chunk(1, 5), synth.chunk(2, 6), synth.chunk(3, 7));
        let mut ex = executor(synth);
        let mut cfg = WindowConfig::new(100, model());
        cfg.cost = CostModel {
            recall_blind_kl: 0.0,
            survivor_blind_kl: 0.0,
            read_blind_kl,
            ..CostModel::default()
        };
        let mut w = Window::new(cfg);
        for (id, n) in [(a, 5), (b, 6), (c, 7)] {
            ex.run_now(&w.insert(id, n).unwrap()).unwrap();
        }
        // c and b leave (no survivors to re-rotate), then b comes back blind after a.
        ex.run_now(&w.evict(&c).unwrap()).unwrap();
        ex.run_now(&w.evict(&b).unwrap()).unwrap();
        let recall = w.recall(b).unwrap();
        assert_eq!(recall.decisions[0].choice, Choice::Blind, "{recall}");
        ex.run_now(&recall).unwrap();
        let read = w.repair_read(&[b]);
        ex.run_now(&read).unwrap();
        (read, ex, [a, b])
    };
    let (read, ex, order) = run(0.1);
    assert_eq!(read.decisions[0].op, DecisionOp::Read);
    assert_eq!(read.decisions[0].choice, Choice::PrefillKeepPatch, "{read}");
    assert_eq!(
        read.steps,
        vec![Step::Prefill {
            chunk: order[1],
            at: 5,
            alone: false
        }],
        "only the question's page, on the path to the answer"
    );
    assert!(
        matches!(read.background[..], [Step::StorePatch { chunk, .. }] if chunk == order[1]),
        "its patch for this context kept after the answer: {read}"
    );
    let got = ex.window_kv().unwrap().unwrap();
    let want = ex.encoder().full(&order);
    let tail = |kv: &kamera_ops::ChunkKv| kv.layers()[1].k.to_f32_vec()[5 * 16..].to_vec();
    let diff = tail(&got)
        .iter()
        .zip(tail(&want))
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff < 1e-5, "the page's KV is the full prefill's: {diff}");
    let (within, _, _) = run(0.0);
    assert_eq!(within.decisions[0].choice, Choice::Blind, "{within}");
    assert!(within.steps.is_empty());
}
