//! kamera-harness: the test and benchmark harness of the `kamera` binary and the workspace tests
//! (`publish = false`). It serves what a scenario file names on loopback (the demo site of
//! kamera-site, or MiniWoB++ fetched and checked by sha256: a scenario file's `[miniwob]` task,
//! read by [`load_scenario`]), runs a scenario end to end on
//! Chromium ([`run_scenario`]), replays a trace without a browser ([`replay`]) and writes a run's
//! HTML report ([`report::write_html`]). Apps do not need it: they embed
//! `kamera_agent::Agent::builder()`.
//!
//! ```
//! use kamera_agent::Scenario;
//! let s = Scenario::parse(r#"
//!     name = "x"
//!     goal = "Open the orders"
//!     start = "/orders"
//!     [site]
//!     seed = 7
//!     [[steps]]
//!     click = "text:View A-1043"
//! "#, "x.toml".as_ref()).unwrap();
//! // The demo site of seed 7 on loopback; the run starts at its /orders page.
//! let rt = tokio::runtime::Runtime::new().unwrap();
//! let served = rt.block_on(kamera_harness::serve(&s, std::env::temp_dir().as_ref())).unwrap();
//! assert_eq!(served.env.start_url, format!("{}/orders", served.env.origin));
//! let _policy = kamera_harness::policy_for(&s, &served.env.origin); // scripted: the steps
//! assert_eq!(kamera_harness::miniwob::task_path("click-test"), "/miniwob/click-test.html");
//! ```

pub mod miniwob;
pub mod parallel;
pub mod queue;
pub mod report;
mod run;
mod scenario_file;

pub use parallel::{Job, Outcome, check_browser, run_parallel};
pub use run::{
    ReplayReport, RunConfig, Served, policy_for, replay, replay_with, run_scenario, serve, session_for, session_with,
};
pub use scenario_file::{load_scenario, parse_scenario};

use std::path::PathBuf;

use kamera_agent::Error;

/// An I/O error naming the operation and the path.
pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}
