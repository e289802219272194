//! kamera-agent: the Kamera agent runtime. A [`Session`] owns the model, the chunk store
//! (canonical KV and patches, content-addressed by kamera-store ids), one kamera-sched window and
//! the model's live context; each step the agent observes the page, the session meets its chunk
//! (hit: nothing moves; new: prefilled in place and alone; recalled or found in the store:
//! relocated + patched, never prefilled again), brings back chunks relevant to a coming question,
//! and the policy acts over the live context.
//!
//! Pages become chunks through their compact page text (the screenshot's sha256 joins the id).
//!
//! ```
//! use kamera_agent::{Scenario, Step};
//! let s = Scenario::parse(r#"
//!     name = "demo"
//!     goal = "Open the orders page"
//!     [site]
//!     seed = 7
//!     [[steps]]
//!     click = "text:Orders"
//! "#, "demo.toml".as_ref()).unwrap();
//! assert_eq!(s.steps, [Step::Click { target: "text:Orders".into() }]);
//! assert!(Scenario::parse("name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n[[steps]]\nback = false\n", "x.toml".as_ref()).is_err());
//! ```

mod agent;
mod app;
mod error;
mod llm;
pub mod miniwob;
mod policy;
pub mod report;
mod run;
mod runtime;
mod scenario;
mod schema;
pub mod site;
mod trace;

/// Milliseconds since `t`.
pub(crate) fn ms(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

pub use agent::{Env, OnStep, Parts, RunOptions, RunSummary, chunk_text, run_episode};
pub use app::{Agent, AgentBuilder, History};
pub use error::{Error, Result};
pub use llm::{CallTimings, Llm, ModelCall, parse_action};
pub use policy::{
    ACTION_GRAMMAR, Decision, Decoding, Mind, ModelPolicy, Policy, ScriptedPolicy, resolve_target, valid,
};
pub use run::{ReplayReport, RunConfig, Served, default_model, policy_for, replay, run_scenario, serve, session_for};
pub use runtime::{Applied, ApplyTimings, Relevance, Session, SessionConfig, SessionStats};
pub use scenario::{Budget, DEFAULT_WAIT_MS, MiniWobSpec, PolicyKind, Scenario, SiteSpec, Step, Success, resolve};
pub use schema::{ActionSchema, Fit, LEAD, Template};
pub use trace::{
    EndRecord, Header, Line, ObsRecord, StepRecord, StepResult, StepTimings, TRACE_VERSION, Trace, TraceWriter,
    devtools_recorder, sha256_hex,
};
