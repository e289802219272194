//! The CLI's jobs as MCP tools: `run_scenario` (as `kamera run`: the scenario's own site and
//! browser, the server's model and chunk store) and `replay` (as `kamera replay`: no browser),
//! each answering with the table the CLI prints.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use kamera_agent::StoreSource;
use kamera_harness::RunConfig;
use kamera_model::Model;
use kamera_store::ChunkStore;
use tokio_util::sync::CancellationToken;

use crate::run::{ModelArg, StoreArgs, replay_text, runtime_config, summary_text};

/// What the jobs run with: the server's model, its model options and its chunk store.
pub struct Jobs {
    pub model: Arc<Model>,
    pub model_arg: ModelArg,
    pub store: Arc<dyn ChunkStore>,
    pub cancel: CancellationToken,
}

impl Jobs {
    /// Runs the scenario at `path` (or named so): its summary table and its success check.
    pub async fn run_scenario(&self, path: &str) -> Result<(String, Option<bool>)> {
        let file = kamera_agent::resolve(path);
        let scenario =
            kamera_harness::load_scenario(&file).with_context(|| format!("loading the scenario {}", file.display()))?;
        crate::run::ensure_chromium()?;
        let mut runtime = runtime_config(self.model.clone(), &self.model_arg, &StoreArgs::none(), true);
        // The server's store: a page the session met is not prefilled again by the job.
        runtime.store = StoreSource::Given(self.store.clone());
        let home = kamera_model::default_home();
        let summary = kamera_harness::run_scenario(
            &scenario,
            self.model.clone(),
            &home,
            RunConfig {
                trace_dir: None,
                cancel: self.cancel.child_token(),
                on_step: None,
                runtime,
                baseline: false,
                action_cache: None,
                browser: Default::default(),
            },
        )
        .await?;
        Ok((summary_text(&summary, true), summary.end.success))
    }

    /// Replays the trace folder `trace`: the table and whether every action matched.
    pub async fn replay(&self, trace: &str) -> Result<(String, bool)> {
        let dir = PathBuf::from(trace);
        if !dir.join("trace.ndjson").exists() {
            bail!(
                "no trace at {} (a folder with trace.ndjson, written by `kamera record`)",
                dir.display()
            );
        }
        let runtime = runtime_config(self.model.clone(), &self.model_arg, &StoreArgs::none(), true);
        let report = kamera_harness::replay_with(&dir, self.model.clone(), runtime).await?;
        Ok((replay_text(&report), report.matches()))
    }
}
