//! The test and benchmark harness (the `kamera` binary, the workspace tests, `kamera bench`):
//! the local test site, MiniWoB++, the scenario runner, replay and the HTML report. Not part of
//! the supported API: apps embed [`crate::Agent`].

pub mod miniwob;
pub mod report;
mod run;
pub mod site;

pub use run::{ReplayReport, RunConfig, Served, default_model, policy_for, replay, run_scenario, serve, session_for};
