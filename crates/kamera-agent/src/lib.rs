//! kamera-agent: the Kamera agent runtime. Each step observes the page (screenshot + compact
//! page text with element ids), turns it into a content-addressed chunk, lets the context window
//! plan (hit, relocate, recall, miss, evict), asks the policy (and through it the model) for the
//! next action, acts, and records a trace line.
//!
//! There is no vision encoder yet: a page becomes a chunk through its compact page text,
//! tokenized and prefilled once to canonical KV at positions 0..n. The screenshot PNG is stored
//! in the trace by sha256 and hashed into the chunk id, so a page that looks different is a
//! different chunk. When a chunk recurs it is not prefilled again: it is relocated to its new
//! slot by exact RoPE re-rotation (`kamera_ops::assemble`).
//!
//! The embedding API is [`run_episode`]: bring a [`kamera_browser::Browser`], a [`Policy`], an
//! [`Llm`] and a [`ChunkCache`].
//!
//! ```
//! use kamera_agent::{Scenario, Window, Op};
//! let s = Scenario::parse(r#"
//!     name = "demo"
//!     goal = "Open the orders page"
//!     [site]
//!     seed = 7
//!     [[steps]]
//!     click = "text:Orders"
//! "#, "demo.toml".as_ref()).unwrap();
//! assert_eq!(s.steps.len(), 1);
//! let mut w = Window::new(1024, 32);
//! assert_eq!(w.observe("page-a", 100, false)[0].op, Op::Miss);
//! ```

mod agent;
mod cache;
mod error;
mod llm;
pub mod miniwob;
mod policy;
pub mod report;
mod scenario;
mod session;
pub mod site;
mod store_cache;
mod trace;

pub use agent::{CacheStats, Env, OnStep, RunOptions, RunSummary, chunk_text, run_episode};
pub use cache::{ChunkCache, MemoryCache, Op, PlanOp, Window, chunk_id};
pub use error::{Error, Result};
pub use llm::{CallTimings, Llm, ModelCall, Part, parse_action};
pub use policy::{ACTION_GRAMMAR, Decision, Mind, ModelPolicy, Policy, ScriptedPolicy, resolve_target};
pub use scenario::{Budget, MiniWobSpec, PolicyKind, Scenario, SiteSpec, Step, Success, resolve};
pub use session::{ReplayReport, RunConfig, Served, default_model, policy_for, replay, run_scenario, serve};
pub use store_cache::StoreCache;
pub use trace::{
    EndRecord, Header, Line, ObsRecord, StepRecord, StepTimings, TRACE_VERSION, Trace, TraceWriter, devtools_recorder,
    sha256_hex,
};
