//! The `act` tool's arguments, checked into one of the agent's action steps
//! ([`kamera_agent::ScriptStep`]); what is missing or does not go with the action is an error naming
//! it and what the action takes.

use kamera_agent::{DEFAULT_WAIT_MS, ScriptStep};
use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;

/// The actions `act` takes, with what each needs.
pub const ACTIONS: &str = "click {target}, type {text, target?}, select {target, option}, check {target}, \
uncheck {target}, hover {target}, drag {target, to}, key {text: the key, e.g. Enter}, scroll {dy?}, \
scroll_to {target}, back, switch_tab {index}, wait_for {target, ms?}";

/// One action on the current page. Targets: `#html-id`, `text:Visible text` or `[3]` (the
/// element's id in `observe`'s text).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ActArgs {
    /// click, type, select, check, uncheck, hover, drag, key, scroll, scroll_to, back,
    /// switch_tab or wait_for.
    pub action: String,
    /// The element acted on: `#html-id`, `text:Visible text` or `[3]` (for type: the field,
    /// else the focused one; for drag: what is dragged; for wait_for: what to wait for).
    pub target: Option<String>,
    /// The text to type; for key, the key (Enter, Tab, Escape, ArrowDown, ...).
    pub text: Option<String>,
    /// For select: the option's text or value.
    pub option: Option<String>,
    /// For drag: the target it is dropped on.
    pub to: Option<String>,
    /// For scroll: pixels down (negative: up); default 300.
    pub dy: Option<f64>,
    /// For switch_tab: the tab, 0 the first in order of opening.
    pub index: Option<usize>,
    /// For wait_for: the most milliseconds to wait (default 5000).
    pub ms: Option<u64>,
}

impl ActArgs {
    /// The step these arguments name, or why not.
    pub fn step(self) -> Result<ScriptStep, String> {
        let name = self.action.trim().to_lowercase();
        let need = |what: Option<String>, field: &str| {
            what.filter(|s| !s.trim().is_empty())
                .ok_or_else(|| format!("act {name:?} needs `{field}`"))
        };
        let step = match name.as_str() {
            "click" => ScriptStep::Click {
                target: need(self.target, "target")?,
            },
            "type" => ScriptStep::Type {
                text: self.text.ok_or_else(|| "act \"type\" needs `text`".to_string())?,
                into: self.target,
            },
            "select" => ScriptStep::Select {
                target: need(self.target, "target")?,
                option: need(self.option, "option")?,
            },
            "check" => ScriptStep::Check {
                target: need(self.target, "target")?,
            },
            "uncheck" => ScriptStep::Uncheck {
                target: need(self.target, "target")?,
            },
            "hover" => ScriptStep::Hover {
                target: need(self.target, "target")?,
            },
            "drag" => ScriptStep::Drag {
                from: need(self.target, "target")?,
                to: need(self.to, "to")?,
            },
            "key" => ScriptStep::Key {
                key: need(self.text, "text")?,
            },
            "scroll" => ScriptStep::Scroll {
                dy: self.dy.unwrap_or(300.0),
            },
            "scroll_to" => ScriptStep::ScrollTo {
                target: need(self.target, "target")?,
            },
            "back" => ScriptStep::Back,
            "switch_tab" => ScriptStep::SwitchTab {
                index: self.index.ok_or("act \"switch_tab\" needs `index`")?,
            },
            "wait_for" => ScriptStep::WaitFor {
                target: need(self.target, "target")?,
                ms: self.ms.unwrap_or(DEFAULT_WAIT_MS),
            },
            "navigate" => return Err("to load a URL use the `navigate` tool".into()),
            other => return Err(format!("unknown action {other:?}; the actions are: {ACTIONS}")),
        };
        Ok(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: serde_json::Value) -> ActArgs {
        serde_json::from_value(v).expect("arguments")
    }

    #[test]
    fn arguments_become_steps_or_say_what_is_missing() {
        let s = args(serde_json::json!({"action": "type", "target": "#q", "text": "A-1042"})).step();
        assert_eq!(
            s,
            Ok(ScriptStep::Type {
                text: "A-1042".into(),
                into: Some("#q".into())
            })
        );
        let e = args(serde_json::json!({"action": "select", "target": "#who"})).step();
        assert_eq!(e, Err("act \"select\" needs `option`".into()));
        let e = args(serde_json::json!({"action": "fly"})).step().expect_err("unknown");
        assert!(e.contains("unknown action \"fly\"") && e.contains("wait_for"), "{e}");
        let k = args(serde_json::json!({"action": "Key", "text": "Enter"})).step();
        assert_eq!(k, Ok(ScriptStep::Key { key: "Enter".into() }));
    }
}
