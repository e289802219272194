//! kamera-sched: the context window as a scheduling problem (shared/KAMERA.md, "Three cheap
//! window operations"). A [`Window`] with a token budget lays out pinned chunks, placed chunks
//! and the live tail contiguously from position 0; every operation — insert, evict, slide,
//! reorder (orbit patches), recall (rehydrate + relocate + a patch for its fixed earlier context)
//! — returns an explicit [`Plan`] of [`Step`]s for a model runner, with the [`CostModel`]'s
//! reasons. The window is synchronous and deterministic and names no tensor library;
//! [`Executor`] is the one runner of plans, over an [`Encoder`] (the model: kamera-agent's
//! session encoder on kamera-model, or kamera-ops alone in tests) and a
//! [`kamera_store::ChunkStore`].
//!
//! ```
//! use kamera_sched::{Step, Window, WindowConfig};
//! use kamera_store::{ChunkId, ModelFp};
//! let model = ModelFp::of("m");
//! let id = |s: &str| ChunkId::of(s.as_bytes(), "text", model);
//! let mut w = Window::new(WindowConfig::new(100, model));
//! w.pin(id("system"), 10)?;
//! w.insert(id("page 1"), 40)?;
//! w.insert(id("page 2"), 40)?;
//! let plan = w.insert(id("page 3"), 40)?; // evicts page 1, shifts page 2 left by 40
//! assert!(plan.steps.contains(&Step::EvictToStore { chunk: id("page 1") }));
//! assert!(plan.steps.contains(&Step::Relocate { chunk: id("page 2"), delta: -40 }));
//! assert!(w.used() <= 100);
//! let plan = w.recall(id("page 1"))?; // evicts page 2; page 1 comes back after system, page 3
//! assert_eq!(w.slot(&id("page 1")).map(|s| s.start), Some(50));
//! # Ok::<(), kamera_sched::Error>(())
//! ```

mod cost;
mod encoder;
mod error;
mod exec;
mod plan;
mod points;
mod version;
mod window;

pub use cost::{CanonicalSource, Choice, CostModel, Decision, DecisionOp, OrbitVariant, PatchPoint};
pub use encoder::{BoxError, Encoder, Part, Prior, Timings};
pub use error::{Error, Result, short};
pub use exec::{ExecConfig, ExecStats, Executor};
pub use plan::{OrbitKey, Plan, Step};
pub use points::{
    BlindKl, KNOWN_MODELS, KnownModel, default_patch_points, gemma3_patch_points, measured_blind_kl, measured_points,
    qwen25_patch_points,
};
pub use version::Resident;
pub use window::{Materialized, Order, Slot, SlotState, Visit, Window, WindowConfig, orbit_orderings};
