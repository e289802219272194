//! `kamera mcp`: the agent as an MCP server (the official Rust SDK, rmcp) over stdio, or over
//! streamable HTTP on loopback with `--http 127.0.0.1:PORT`. One browser and one Session
//! (window, live context, chunk store) are kept across calls and across MCP sessions; the tools
//! are in mcp/tools.rs. Nothing but the protocol goes to stdout: logs go to stderr.

mod act;
mod jobs;
mod tools;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use kamera_agent::{Agent, Observe};
use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::run::{ModelArg, StoreArgs, load_model, runtime_config};
use jobs::Jobs;
use tools::{KameraMcp, Shared};

#[derive(Args)]
pub struct McpArgs {
    /// An origin the browser may visit (`http://127.0.0.1:8080`); repeat for more. Navigations
    /// anywhere else are refused. At least one.
    #[arg(long = "allow", value_name = "ORIGIN")]
    allow: Vec<String>,
    /// What the session reads of each observed page (text; screenshot or both need a
    /// vision-language model), and what the `observe` tool returns when a call names no mode.
    #[arg(long, default_value = "text")]
    observe: Observe,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio; ADDR on loopback
    /// (`127.0.0.1:PORT`, port 0 picks a free one; the address is printed on stderr).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    store: StoreArgs,
}

pub fn run(a: McpArgs) -> Result<()> {
    if a.allow.is_empty() {
        bail!(
            "kamera mcp needs at least one --allow ORIGIN (e.g. --allow http://127.0.0.1:8080): the browser may visit nothing else"
        );
    }
    if let Some(addr) = a.http
        && !addr.ip().is_loopback()
    {
        bail!("--http serves on loopback only: give 127.0.0.1:PORT or [::1]:PORT (got {addr})");
    }
    let observe = a.observe;
    crate::run::ensure_chromium()?;
    let model = load_model(&a.model)?;
    if observe.screenshot() && model.vision().is_none() {
        bail!(
            "--observe {} needs a vision-language model (--model DIR of a Qwen2.5-VL, see the README); {} reads text only",
            a.observe,
            a.model.name()
        );
    }
    let mut builder = Agent::builder()
        .runtime(runtime_config(model.clone(), &a.model, &a.store, true))
        .observe(observe);
    for origin in &a.allow {
        builder = builder.allow_origin(origin.trim_end_matches('/'));
    }
    let agent = builder.build().context("building the agent")?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let cancel = crate::run::cancel_on_stop_signal(&rt);
    let shared = Arc::new(Shared {
        jobs: Jobs {
            model,
            model_arg: a.model.clone(),
            store: agent.session().store().clone(),
            cancel: cancel.clone(),
        },
        agent: Mutex::new(Some(agent)),
        observe,
    });
    let served = rt.block_on(async {
        match a.http {
            None => serve_stdio(shared.clone(), cancel.clone()).await,
            Some(addr) => serve_http(addr, shared.clone(), cancel.clone()).await,
        }
    });
    rt.block_on(shared.close());
    served
}

/// Serves one MCP session on stdin/stdout until the client closes it (or Ctrl-C / SIGTERM).
async fn serve_stdio(shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let server = KameraMcp::new(shared)
        .serve(rmcp::transport::stdio())
        .await
        .context("starting the MCP session on stdio")?;
    tokio::select! {
        r = server.waiting() => { r.context("the MCP session on stdio")?; }
        _ = cancel.cancelled() => {}
    }
    Ok(())
}

/// Serves streamable HTTP at `addr` (loopback), every MCP session over the one agent, until
/// Ctrl-C.
async fn serve_http(addr: SocketAddr, shared: Arc<Shared>, cancel: CancellationToken) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr} for --http"))?;
    let local = listener.local_addr()?;
    eprintln!("kamera mcp: serving streamable HTTP at http://{local}/mcp");
    let config = StreamableHttpServerConfig::default().with_cancellation_token(cancel.child_token());
    let service = StreamableHttpService::new(
        move || Ok(KameraMcp::new(shared.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    loop {
        let (stream, peer) = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an MCP connection");
                    continue;
                }
            },
        };
        let svc = hyper_util::service::TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await
            {
                tracing::debug!(%peer, error = %e, "MCP HTTP connection");
            }
        });
    }
}
