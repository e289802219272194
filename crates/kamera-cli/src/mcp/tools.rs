//! The MCP tools over one [`Agent`]: `navigate`, `observe`, `act`, `extract`, `run_scenario`,
//! `replay`. Every call shares the agent (one browser, one Session: window, live context,
//! store); a refused navigation, an unknown target, a bad schema or a failed job is a tool
//! error (`isError`) whose text says why, never a protocol error or a crash.

use std::sync::Arc;

use base64::Engine;
use kamera_agent::{Agent, Observe, StepResult, chunk_text};
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::schemars::{self, JsonSchema};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use serde::Deserialize;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use super::act::ActArgs;
use super::jobs::Jobs;

/// What every MCP session of this process shares.
pub struct Shared {
    /// `None` once the server is shutting down (the browser closed).
    pub agent: Mutex<Option<Agent>>,
    /// What `observe` returns when the call names no mode (`--observe`).
    pub observe: Observe,
    pub jobs: Jobs,
}

/// The server: the shared agent and the tool router (cloned per MCP session).
#[derive(Clone)]
pub struct KameraMcp {
    shared: Arc<Shared>,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct NavigateArgs {
    /// An absolute URL on one of the allowed origins (`kamera mcp --allow ORIGIN`).
    pub url: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ObserveArgs {
    /// text (the page as the agent reads it: title, URL, text, elements as `[id] tag "text"`),
    /// screenshot (a PNG) or both; default: the server's `--observe`.
    pub mode: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExtractArgs {
    /// What to read off the current page.
    pub instruction: String,
    /// A JSON Schema (an object or array at the top; properties of type string, number,
    /// integer, boolean, array, object, or string enums); the reply is decoded under it.
    pub schema: serde_json::Value,
    /// Most tokens of the reply (default 256); a reply cut short is closed validly.
    pub max_tokens: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunScenarioArgs {
    /// A scenario file (scenarios/*.toml) or a bare scenario name, as `kamera run` takes it.
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReplayArgs {
    /// A trace folder written by `kamera record` (or `kamera run --trace`).
    pub trace: String,
}

impl Shared {
    /// The agent, held until the guard drops (one call at a time), or the tool error saying the
    /// server is shutting down.
    async fn agent(&self) -> Result<MappedMutexGuard<'_, Agent>, CallToolResult> {
        MutexGuard::try_map(self.agent.lock().await, Option::as_mut)
            .map_err(|_| tool_error("the server is shutting down; the browser is closed"))
    }

    /// Closes the browser (at shutdown); later calls are tool errors.
    pub async fn close(&self) {
        if let Some(agent) = self.agent.lock().await.take()
            && let Err(e) = agent.close().await
        {
            tracing::warn!(error = %e, "closing the browser");
        }
    }
}

fn tool_error(text: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn mode_of(name: Option<&str>, default: Observe) -> Result<Observe, String> {
    match name.map(|m| m.trim().to_lowercase()) {
        None => Ok(default),
        Some(m) => match m.as_str() {
            "text" => Ok(Observe::Text),
            "screenshot" => Ok(Observe::Screenshot),
            "both" => Ok(Observe::Both),
            _ => Err(format!("unknown observe mode {m:?}: text, screenshot or both")),
        },
    }
}

#[tool_router]
impl KameraMcp {
    pub fn new(shared: Arc<Shared>) -> KameraMcp {
        KameraMcp {
            shared,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Load a URL in the agent's browser. URLs off the allowed origins are refused.")]
    async fn navigate(&self, Parameters(a): Parameters<NavigateArgs>) -> CallToolResult {
        if !a.url.contains("://") {
            return tool_error(format!("navigate needs an absolute URL (http://...), got {:?}", a.url));
        }
        let mut agent = match self.shared.agent().await {
            Ok(a) => a,
            Err(e) => return e,
        };
        match agent.navigate(&a.url).await {
            Ok(()) => CallToolResult::success(vec![ContentBlock::text(format!("loaded {}", a.url))]),
            Err(e) => tool_error(format!("navigate {}: {e}", a.url)),
        }
    }

    #[tool(
        description = "The current page as the agent sees it: its text with interactive elements as `[id] tag \"text\"` (ids are act targets as `[id]`), and for mode screenshot/both the PNG. The page also enters the agent's context window."
    )]
    async fn observe(&self, Parameters(a): Parameters<ObserveArgs>) -> CallToolResult {
        let mode = match mode_of(a.mode.as_deref(), self.shared.observe) {
            Ok(m) => m,
            Err(e) => return tool_error(e),
        };
        let mut agent = match self.shared.agent().await {
            Ok(a) => a,
            Err(e) => return e,
        };
        let obs = match agent.observe().await {
            Ok(o) => o,
            Err(e) => return tool_error(format!("observe: {e}")),
        };
        let mut content = Vec::new();
        if mode.text() {
            content.push(ContentBlock::text(chunk_text(&obs, "").trim_end().to_string()));
        }
        if mode.screenshot() {
            let png = base64::engine::general_purpose::STANDARD.encode(&obs.screenshot_png);
            content.push(ContentBlock::image(png, "image/png"));
        }
        CallToolResult::success(content)
    }

    #[tool(
        description = "One action on the current page: click, type, select, check, uncheck, hover, drag, key, scroll, scroll_to, back, switch_tab, wait_for. Targets: `#html-id`, `text:Visible text` or `[id]` from observe."
    )]
    async fn act(&self, Parameters(a): Parameters<ActArgs>) -> CallToolResult {
        let step = match a.step() {
            Ok(s) => s,
            Err(e) => return tool_error(e),
        };
        let mut agent = match self.shared.agent().await {
            Ok(a) => a,
            Err(e) => return e,
        };
        let record = match agent.perform(step).await {
            Ok(r) => r,
            Err(e) => return tool_error(format!("act: {e}")),
        };
        let label = record.action.as_ref().map(|a| a.label()).unwrap_or_default();
        match &record.result {
            StepResult::Ok => CallToolResult::success(vec![ContentBlock::text(format!(
                "done: {label} (on {})",
                record.observation.url
            ))]),
            StepResult::Refused { detail } => tool_error(format!("{label}: refused: {detail}")),
            StepResult::NoElement { detail } => tool_error(format!("{label}: no such element: {detail}")),
            StepResult::Target { detail } => tool_error(format!("{label}: the target cannot take it: {detail}")),
            StepResult::Failed { error } => tool_error(format!("{label}: failed: {error}")),
        }
    }

    #[tool(
        description = "Read values off the current page as JSON valid against a JSON Schema: the local model decodes under the schema (constrained decoding), so the reply is valid by construction; an unsupported schema keyword is an error naming it."
    )]
    async fn extract(&self, Parameters(a): Parameters<ExtractArgs>) -> CallToolResult {
        let mut agent = match self.shared.agent().await {
            Ok(a) => a,
            Err(e) => return e,
        };
        let max = a.max_tokens.unwrap_or(256).clamp(1, 4096);
        match agent.extract_json(&a.instruction, &a.schema, max).await {
            Ok(v) => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(v.to_string())]);
                if v.is_object() {
                    r.structured_content = Some(v);
                }
                r
            }
            Err(e) => tool_error(e.to_string()),
        }
    }

    #[tool(
        description = "Run a scenario (scenarios/*.toml, or a bare name) end to end on its own browser and served site, as `kamera run` does; returns its summary table."
    )]
    async fn run_scenario(&self, Parameters(a): Parameters<RunScenarioArgs>) -> CallToolResult {
        match self.shared.jobs.run_scenario(&a.path).await {
            Ok((text, passed)) if passed != Some(false) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Ok((text, _)) => tool_error(format!("the scenario failed its success check\n{text}")),
            Err(e) => tool_error(format!("run_scenario {}: {e:#}", a.path)),
        }
    }

    #[tool(
        description = "Re-run the agent on a recorded trace folder without a browser, as `kamera replay` does; returns the summary and whether the actions match the recording."
    )]
    async fn replay(&self, Parameters(a): Parameters<ReplayArgs>) -> CallToolResult {
        match self.shared.jobs.replay(&a.trace).await {
            Ok((text, true)) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Ok((text, false)) => tool_error(format!("the replay's actions differ from the recording\n{text}")),
            Err(e) => tool_error(format!("replay {}: {e:#}", a.trace)),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for KameraMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("kamera", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "A web agent's browser and context window. navigate to a page on an allowed origin, observe it \
                 (elements as [id]), act on targets (#id, text:Visible, [id]), extract JSON under a schema.",
            )
    }
}

impl std::fmt::Debug for KameraMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KameraMcp")
    }
}
