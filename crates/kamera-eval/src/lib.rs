//! kamera-eval: what the runtime, the benches and the experiments share. The answer-token
//! metrics (KL, top-1, exact match, log-prob, share of the blind gap recovered), the task format
//! (JSONL) and its deterministic generator, and the per-model deficit basis file the runtime
//! codes `/klt` patches in. The experiments themselves (every reuse method side by side on real
//! weights, `kamera eval`) live in kamera-lab.

mod basis;
mod error;
mod generate;
mod metrics;
mod task;

pub use basis::{BasisHeader, DeficitBasis, eigenbasis};
pub use error::{Error, Result};
pub use generate::{GenConfig, Rng, filler_text, generate};
pub use metrics::{Scores, gap_recovered, kl, log_softmax, score};
pub use task::{Task, load_tasks, parse_tasks, save_tasks, tasks_to_jsonl};
