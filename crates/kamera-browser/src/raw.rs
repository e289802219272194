//! A DevTools connection of our own to the browser target (confinement, the download policy):
//! a command sent on it and its answer awaited, the events before it skipped.

use chromiumoxide::conn::Connection;
use chromiumoxide::types::{CdpJsonEventMessage, Command, Message};
use futures::StreamExt;

/// Sends `cmd` on `conn` and waits for its answer; an error is the browser's refusal, or why the
/// command could not be sent or answered.
pub(crate) async fn call<C: Command>(conn: &mut Connection<CdpJsonEventMessage>, cmd: C) -> Result<(), String> {
    let params = serde_json::to_value(&cmd).map_err(|e| format!("could not encode {}: {e}", cmd.identifier()))?;
    let id = conn
        .submit_command(cmd.identifier(), None, params)
        .map_err(|e| format!("could not send {}: {e}", cmd.identifier()))?;
    loop {
        match conn.next().await {
            Some(Ok(Message::Response(r))) if r.id == id => {
                return match r.error {
                    None => Ok(()),
                    Some(e) => Err(format!("{}: {e}", cmd.identifier())),
                };
            }
            Some(_) => {}
            None => return Err("the browser closed the connection".into()),
        }
    }
}
