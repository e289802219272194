//! Scenario files (scenarios/*.toml): what to open, what to do, how to judge the result.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A scripted or autonomous web task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    /// What the agent is asked to achieve (shown to the model).
    pub goal: String,
    /// Start page: a path on the served site (`/orders`) or a full URL.
    #[serde(default = "default_start")]
    pub start: String,
    /// Origins allowed besides the served site's own.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// `scripted` (follow `steps`, ask the model only the scenario's questions) or `model`.
    #[serde(default)]
    pub policy: PolicyKind,
    /// The local test site, generated from a seed.
    #[serde(default)]
    pub site: Option<SiteSpec>,
    /// A MiniWoB++ task instead of the local site.
    #[serde(default)]
    pub miniwob: Option<MiniWobSpec>,
    #[serde(default)]
    pub budget: Budget,
    #[serde(default)]
    pub steps: Vec<Step>,
    #[serde(default)]
    pub success: Success,
}

fn default_start() -> String {
    "/".into()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    #[default]
    Scripted,
    Model,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteSpec {
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MiniWobSpec {
    /// Task name, e.g. `click-test` (the page miniwob/html/miniwob/<task>.html).
    pub task: String,
    #[serde(default)]
    pub seed: u64,
    /// Episode time limit in ms (the package's default is 10000; its reward decays with time).
    #[serde(default)]
    pub episode_ms: Option<u64>,
}

/// Step and context budgets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Most steps (actions) before the run ends unanswered.
    #[serde(default = "default_steps")]
    pub steps: usize,
    /// Most tokens of page chunks the context window holds; older chunks are evicted.
    #[serde(default = "default_window")]
    pub window_tokens: usize,
    /// Most new tokens per model answer.
    #[serde(default = "default_decode")]
    pub max_new_tokens: usize,
    /// Rank of the conditioning patch formed when a chunk is recalled (0: plain relocation).
    #[serde(default = "default_patch_rank")]
    pub patch_rank: usize,
}

fn default_patch_rank() -> usize {
    16
}

fn default_steps() -> usize {
    16
}
fn default_window() -> usize {
    1536
}
fn default_decode() -> usize {
    24
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            steps: default_steps(),
            window_tokens: default_window(),
            max_new_tokens: default_decode(),
            patch_rank: default_patch_rank(),
        }
    }
}

/// One scripted step. Exactly one of the action keys is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Click the element matching a target: `#html-id`, `text:Visible text`, or `[3]` (element id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub click: Option<String>,
    /// Type this text (`$name` inserts a remembered value) into `into` (a target) or the focus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub into: Option<String>,
    /// Press a key (`Enter`, `Tab`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Go to a path on the site or a URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub navigate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scroll: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Remember the first capture group of `regex` on the current page text as `$name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remember: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Ask the model this question over the context window; its answer ends the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<String>,
    /// Candidate answers, scored by the model's likelihood (otherwise it generates freely).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
}

/// How a run is judged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Success {
    /// The expected answer (case-insensitive, trimmed; the answer must equal or contain it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// A JavaScript expression that must be truthy on the final page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub js: Option<String>,
    /// The MiniWoB++ reward must exceed this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_reward: Option<f64>,
}

impl Step {
    fn kind_count(&self) -> usize {
        [
            self.click.is_some(),
            self.r#type.is_some(),
            self.key.is_some(),
            self.navigate.is_some(),
            self.back.is_some(),
            self.scroll.is_some(),
            self.wait_ms.is_some(),
            self.remember.is_some(),
            self.ask.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count()
    }
}

impl Scenario {
    /// Parses and checks a scenario file.
    pub fn load(path: &Path) -> Result<Scenario> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Scenario {
            path: path.to_path_buf(),
            detail: format!("cannot read: {e}"),
        })?;
        Scenario::parse(&text, path)
    }

    /// Parses and checks scenario TOML (`path` only names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Scenario> {
        let bad = |detail: String| Error::Scenario {
            path: path.to_path_buf(),
            detail,
        };
        let s: Scenario = toml::from_str(text).map_err(|e| bad(format!("not a valid scenario: {e}")))?;
        if s.name.trim().is_empty() {
            return Err(bad("`name` is empty".into()));
        }
        if s.site.is_some() && s.miniwob.is_some() {
            return Err(bad("give either [site] or [miniwob], not both".into()));
        }
        if s.site.is_none() && s.miniwob.is_none() && !s.start.contains("://") {
            return Err(bad(format!(
                "start {:?} is a path but no [site] or [miniwob] is served",
                s.start
            )));
        }
        if s.budget.steps == 0 || s.budget.window_tokens < 64 {
            return Err(bad("budget.steps must be > 0 and budget.window_tokens >= 64".into()));
        }
        if s.policy == PolicyKind::Scripted && s.steps.is_empty() {
            return Err(bad("a scripted scenario needs [[steps]]".into()));
        }
        for (i, st) in s.steps.iter().enumerate() {
            let n = st.kind_count();
            if n != 1 {
                return Err(bad(format!(
                    "step {} must have exactly one of click, type, key, navigate, back, scroll, wait_ms, remember, ask (has {n})",
                    i + 1
                )));
            }
            if st.remember.is_some() {
                let Some(re) = &st.regex else {
                    return Err(bad(format!("step {}: remember needs a regex", i + 1)));
                };
                regex::Regex::new(re).map_err(|e| bad(format!("step {}: bad regex: {e}", i + 1)))?;
            }
            if st.into.is_some() && st.r#type.is_none() {
                return Err(bad(format!("step {}: `into` only goes with `type`", i + 1)));
            }
        }
        Ok(s)
    }

    /// The scenario as TOML (embedded in trace headers so a replay needs no other file).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }
}

/// Resolves a scenario argument: a path, or a bare name under `scenarios/`.
pub fn resolve(arg: &str) -> PathBuf {
    let p = PathBuf::from(arg);
    if p.exists() {
        return p;
    }
    let named = Path::new("scenarios").join(format!("{arg}.toml"));
    if named.exists() { named } else { p }
}
