//! kamera-agent: the Kamera agent runtime. Apps embed it through [`Agent::builder`]: an
//! [`Agent`] keeps its browser, model, chunk store and context window across tasks, runs a task
//! to a typed [`History`], or takes one step (`act`, `observe`, `extract`). Underneath, a
//! [`Session`] owns the model, the chunk store (canonical KV and patches, content-addressed by
//! kamera-store ids), one kamera-sched window and the model's live context; each step the agent
//! observes the page, the session meets its chunk (hit: nothing moves; new: prefilled in place
//! and alone; recalled or found in the store: relocated + patched, never prefilled again), and
//! the policy acts over the live context. The model policy decodes under the page's
//! [`ActionSchema`], so its reply is always an action the page can take; it asks its model
//! through [`LanguageModel`] ([`Llm`], the local model, by default; another can be plugged with
//! [`AgentBuilder::language_model`]). The test and benchmark harness (serving a scenario's site
//! or MiniWoB++, the scenario runner, the report) is the kamera-harness crate and the demo site
//! is kamera-site, both `publish = false`: neither is part of this crate's API.
//!
//! ```
//! use kamera_agent::{ActionSchema, Fit, LEAD, Scenario, ScriptStep};
//! use kamera_browser::{Action, Observation};
//! // A page with a button and a text field: the actions it allows, as the model's JSON reply.
//! let page: Observation = serde_json::from_value(serde_json::json!({
//!     "url": "http://127.0.0.1/", "title": "t", "text": "",
//!     "elements": [{"id": 1, "tag": "button", "text": "Go", "x": 5, "y": 5},
//!                  {"id": 2, "tag": "input", "text": "", "editable": true, "x": 5, "y": 20}]
//! })).unwrap();
//! let schema = ActionSchema::for_page(&page);
//! assert_eq!(schema.fit(&format!("{LEAD}click\", \"id\": 1}}")), Fit::Complete);
//! assert_eq!(schema.fit(&format!("{LEAD}click\", \"id\": 7")), Fit::Dead); // no element 7
//! assert_eq!(schema.fit(&format!("{LEAD}type\", \"id\": 1")), Fit::Dead); // a button takes no text
//! assert_eq!(
//!     schema.action(&format!("{LEAD}type\", \"id\": 2, \"text\": \"hi\"}}")),
//!     Some(Action::Type { id: Some(2), text: "hi".into() })
//! );
//!
//! // Scenario files are checked into typed steps.
//! let s = Scenario::parse(r##"
//!     name = "demo"
//!     goal = "Choose Bob"
//!     [site]
//!     seed = 7
//!     [[steps]]
//!     select = "#who"
//!     option = "Bob"
//! "##, "demo.toml".as_ref()).unwrap();
//! assert_eq!(s.steps, [ScriptStep::Select { target: "#who".into(), option: "Bob".into() }]);
//! assert!(Scenario::parse("name = \"x\"\ngoal = \"g\"\n[site]\nseed = 1\n[[steps]]\nback = false\n", "x.toml".as_ref()).is_err());
//! ```

mod agent;
mod app;
mod assemble;
mod cache;
mod calibration;
mod error;
mod json_schema;
mod language_model;
mod live;
mod llm;
mod policy;
mod runtime;
mod scenario;
mod schema;
mod trace;

/// Milliseconds since `t`.
pub(crate) fn ms(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

pub use agent::{Env, OnStep, Parts, RunOptions, RunSummary, chunk_text, run_episode};
pub use app::{Agent, AgentBuilder, History, default_model};
pub use assemble::{
    BasisSource, CalibrationSource, MEMORY_TIER_BYTES, ModelSource, RuntimeConfig, StoreSource, cost_model,
    installed_basis_path, load_model, open_runtime, open_store, session_config,
};
pub use cache::{ACTION_CACHE_VERSION, ActionCache, CacheStats, PageSig, Target, Use, structure_hash, url_key};
pub use calibration::Calibration;
pub use error::{Error, Result};
pub use json_schema::JsonGrammar;
pub use language_model::{LanguageModel, View};
pub use live::Live;
pub use llm::{CallTimings, Llm, ModelCall, parse_action};
pub use policy::{
    ACTION_GRAMMAR, Decoding, Mind, ModelPolicy, NextAction, Policy, ScriptedPolicy, Words, resolve_target, valid,
};
pub use runtime::{
    Applied, ApplyTimings, Block, CHUNK_TOKENS_MAX, ObservedPage, PROMPT_ROWS_TOKENS, Reencoded, Relevance, Session,
    SessionConfig, SessionStats, TOWER_CACHE_BYTES, TowerCache, split_page,
};
pub use scenario::{
    Budget, DEFAULT_WAIT_MS, Episode, Observe, PolicyKind, Scenario, ScriptStep, SiteSpec, Success, resolve,
    upload_file,
};
pub use schema::{ActionSchema, Fit, Grammar, LEAD, Template};
pub use trace::{
    EndRecord, Header, Line, ObsRecord, StepRecord, StepResult, StepTimings, TRACE_VERSION, Trace, TraceWriter,
    devtools_recorder, sha256_hex,
};
