//! Scenario files (scenarios/*.toml): what to open, what to do, how to judge the result.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::policy::Decoding;

mod uploads;

use uploads::lexically_inside;
pub use uploads::upload_file;

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
    /// How the model policy decodes an action: `constrained` (default: a token mask keeps every
    /// reply a valid action of the page), `ranked` (likelihood of each valid action) or `free`.
    #[serde(default)]
    pub decoding: Decoding,
    /// The local test site, generated from a seed.
    #[serde(default)]
    pub site: Option<SiteSpec>,
    /// A suite's episode protocol instead of the local site (set by the harness serving it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episode: Option<Episode>,
    /// What of each page becomes a chunk: its text (default), its screenshot (an image chunk;
    /// needs a vision-language model), or both.
    #[serde(default)]
    pub observe: Observe,
    #[serde(default)]
    pub budget: Budget,
    /// The folder `upload` steps may take files from (relative to the scenario file's folder;
    /// made absolute when the scenario is parsed). A step's path is relative to it, and must
    /// stay inside it (`..` and symbolic links out are refused); without it, `upload` steps are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploads: Option<PathBuf>,
    #[serde(default)]
    pub steps: Vec<ScriptStep>,
    #[serde(default)]
    pub success: Success,
}

fn default_start() -> String {
    "/".into()
}

/// What of each page the session reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observe {
    #[default]
    Text,
    Screenshot,
    Both,
}

impl Observe {
    pub fn text(self) -> bool {
        self != Observe::Screenshot
    }
    pub fn screenshot(self) -> bool {
        self != Observe::Text
    }
}

impl std::fmt::Display for Observe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Observe::Text => "text",
            Observe::Screenshot => "screenshot",
            Observe::Both => "both",
        })
    }
}

impl std::str::FromStr for Observe {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Observe, String> {
        match s {
            "text" => Ok(Observe::Text),
            "screenshot" => Ok(Observe::Screenshot),
            "both" => Ok(Observe::Both),
            _ => Err(format!("observe {s:?}: expected text, screenshot or both")),
        }
    }
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
    /// A seeded layout perturbation of the site (kamera-site's `perturb`: menu reordered,
    /// labels renamed, a field moved); unset: the site as designed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perturb: Option<u64>,
}

/// A page-side episode protocol, for pages a harness serves (a benchmark suite's, as
/// kamera-harness serves them): the suite the harness serves, JavaScript run once the
/// start page has loaded, and JavaScript read after every action that returns
/// `[done, reward, ..]` (a done episode's reward is the run's; `success.min_reward` judges it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Episode {
    /// The suite whose pages the harness serves (it refuses one it does not know).
    pub suite: String,
    /// Run on the start page once it has loaded (e.g. seeding and starting the episode).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub start_js: String,
    /// Read after every action: an array `[done, reward, ..]`.
    pub reward_js: String,
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
    /// Rank of the conditioning patches the session forms (0: plain relocation). Unset: the cost
    /// model's best measured point within its byte budget (kamera-sched `CostModel::patch_config`).
    #[serde(default)]
    pub patch_rank: Option<usize>,
    /// Repair the survivors of an eviction after each answer (prefill them again in place and
    /// store their patches for the new context): exact answers and patches for recurring
    /// contexts, at the cost of that prefill between steps. Off: survivors are only re-rotated.
    #[serde(default = "default_repair")]
    pub repair: bool,
    /// Pixel budget of a screenshot chunk (`observe = "screenshot"` or `"both"`): larger
    /// screenshots are downscaled to fit, 28x28 pixels per image token.
    #[serde(default = "default_screenshot_pixels")]
    pub screenshot_pixels: usize,
    /// Most tiles a larger screenshot is cut into (horizontal bands, each an image chunk of up to
    /// `screenshot_pixels`); 1 (the default): downscaled whole to fit.
    #[serde(default = "default_screenshot_tiles")]
    pub screenshot_tiles: usize,
    /// Most tokens of one page chunk: a longer page becomes several, in reading order (at most
    /// half of `window_tokens`). Unset: 512.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_tokens: Option<usize>,
}

fn default_screenshot_pixels() -> usize {
    28 * 28 * 256
}

fn default_screenshot_tiles() -> usize {
    1
}

fn default_repair() -> bool {
    true
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
            patch_rank: None,
            repair: default_repair(),
            screenshot_pixels: default_screenshot_pixels(),
            screenshot_tiles: default_screenshot_tiles(),
            chunk_tokens: None,
        }
    }
}

/// One scripted step. In a scenario file it is a table with exactly one action key
/// (`click`, `type` with optional `into`, `select` with `option`, `check`, `uncheck`, `hover`,
/// `drag` with `to`, `scroll_to`, `upload` with `path`, `switch_tab`, `wait_for` with optional
/// `timeout_ms`, `key`,
/// `navigate`, `back = true`, `scroll`, `wait_ms`, `remember` with `regex`, `ask` with optional
/// `choices`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawStep", into = "RawStep")]
pub enum ScriptStep {
    /// Click the element matching a target: `#html-id`, `text:Visible text`, or `[3]` (element id).
    Click {
        target: String,
    },
    /// Type `text` (`$name` inserts a remembered value) into `into` (a target) or the focus.
    Type {
        text: String,
        into: Option<String>,
    },
    /// Choose `option` (its text or value) in the select matching `target`.
    Select {
        target: String,
        option: String,
    },
    /// Check the checkbox, radio button or switch matching `target` (or labelled by it).
    Check {
        target: String,
    },
    /// Uncheck the checkbox or switch matching `target`.
    Uncheck {
        target: String,
    },
    /// Move the mouse over the element matching `target`.
    Hover {
        target: String,
    },
    /// Drag the element matching `from` onto the one matching `to`.
    Drag {
        from: String,
        to: String,
    },
    /// Scroll the element matching `target` into view.
    ScrollTo {
        target: String,
    },
    /// Set the file input matching `target` (or the one a label or container holds) to the file
    /// at `path`, relative to the scenario's `uploads` folder and inside it.
    Upload {
        target: String,
        path: String,
    },
    /// Drive tab `index` (0 is the first, in order of opening) from now on.
    SwitchTab {
        index: usize,
    },
    /// Wait until a visible element matches `target` (`#html-id`, `text:...`), at most `ms`.
    WaitFor {
        target: String,
        ms: u64,
    },
    /// Press a key (`Enter`, `Tab`, ...).
    Key {
        key: String,
    },
    /// Go to a path on the site or a URL.
    Navigate {
        url: String,
    },
    Back,
    Scroll {
        dy: f64,
    },
    Wait {
        ms: u64,
    },
    /// Remember the first capture group of `regex` on the current page text as `$name`.
    Remember {
        name: String,
        regex: String,
    },
    /// Ask the model this question over the context window; its answer ends the run. With
    /// `choices`, they are scored by the model's likelihood; otherwise it generates freely.
    Ask {
        question: String,
        choices: Vec<String>,
    },
}

/// How long a `wait_for` step waits when it names no `timeout_ms`.
pub const DEFAULT_WAIT_MS: u64 = 5000;

/// A step as written in TOML: a bag of optional keys, checked into a [`ScriptStep`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    click: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    r#type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    into: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    select: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    option: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    check: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uncheck: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hover: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    drag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scroll_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    upload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    switch_tab: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wait_for: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    navigate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    back: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scroll: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wait_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remember: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ask: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    choices: Vec<String>,
}

impl TryFrom<RawStep> for ScriptStep {
    type Error = String;
    // Long: one arm per step kind of the scenario format, after the checks between its keys.
    fn try_from(r: RawStep) -> std::result::Result<ScriptStep, String> {
        let keys = [
            ("click", r.click.is_some()),
            ("type", r.r#type.is_some()),
            ("select", r.select.is_some()),
            ("check", r.check.is_some()),
            ("uncheck", r.uncheck.is_some()),
            ("hover", r.hover.is_some()),
            ("drag", r.drag.is_some()),
            ("scroll_to", r.scroll_to.is_some()),
            ("upload", r.upload.is_some()),
            ("switch_tab", r.switch_tab.is_some()),
            ("wait_for", r.wait_for.is_some()),
            ("key", r.key.is_some()),
            ("navigate", r.navigate.is_some()),
            ("back", r.back.is_some()),
            ("scroll", r.scroll.is_some()),
            ("wait_ms", r.wait_ms.is_some()),
            ("remember", r.remember.is_some()),
            ("ask", r.ask.is_some()),
        ];
        let set: Vec<&str> = keys.iter().filter(|k| k.1).map(|k| k.0).collect();
        if set.len() != 1 {
            return Err(format!(
                "a step needs exactly one of {} (found {})",
                keys.iter().map(|k| k.0).collect::<Vec<_>>().join(", "),
                if set.is_empty() {
                    "none".to_string()
                } else {
                    set.join(", ")
                }
            ));
        }
        let only = |name: &str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(format!("`{name}` does not go with `{}`", set[0]))
            }
        };
        only("into", r.into.is_none() || r.r#type.is_some())?;
        only("regex", r.regex.is_none() || r.remember.is_some())?;
        only("choices", r.choices.is_empty() || r.ask.is_some())?;
        only("option", r.option.is_none() || r.select.is_some())?;
        only("to", r.to.is_none() || r.drag.is_some())?;
        only("path", r.path.is_none() || r.upload.is_some())?;
        only("timeout_ms", r.timeout_ms.is_none() || r.wait_for.is_some())?;
        Ok(match r {
            RawStep {
                click: Some(target), ..
            } => ScriptStep::Click { target },
            RawStep {
                r#type: Some(text),
                into,
                ..
            } => ScriptStep::Type { text, into },
            RawStep {
                select: Some(target),
                option,
                ..
            } => ScriptStep::Select {
                option: option.ok_or_else(|| format!("`select = {target:?}` needs an `option`"))?,
                target,
            },
            RawStep {
                check: Some(target), ..
            } => ScriptStep::Check { target },
            RawStep {
                uncheck: Some(target), ..
            } => ScriptStep::Uncheck { target },
            RawStep {
                hover: Some(target), ..
            } => ScriptStep::Hover { target },
            RawStep {
                drag: Some(from), to, ..
            } => ScriptStep::Drag {
                to: to.ok_or_else(|| format!("`drag = {from:?}` needs a `to` target"))?,
                from,
            },
            RawStep {
                scroll_to: Some(target),
                ..
            } => ScriptStep::ScrollTo { target },
            RawStep {
                upload: Some(target),
                path,
                ..
            } => ScriptStep::Upload {
                path: path.filter(|p| !p.trim().is_empty()).ok_or_else(|| {
                    format!("`upload = {target:?}` needs a `path` (a file in the scenario's `uploads` folder)")
                })?,
                target,
            },
            RawStep {
                switch_tab: Some(index),
                ..
            } => ScriptStep::SwitchTab { index },
            RawStep {
                wait_for: Some(target),
                timeout_ms,
                ..
            } => ScriptStep::WaitFor {
                target,
                ms: timeout_ms.unwrap_or(DEFAULT_WAIT_MS),
            },
            RawStep { key: Some(key), .. } => ScriptStep::Key { key },
            RawStep {
                navigate: Some(url), ..
            } => ScriptStep::Navigate { url },
            RawStep { back: Some(true), .. } => ScriptStep::Back,
            RawStep { back: Some(false), .. } => {
                return Err("`back = false` is not a step: write `back = true` to go back".into());
            }
            RawStep { scroll: Some(dy), .. } if dy.is_finite() => ScriptStep::Scroll { dy },
            RawStep { scroll: Some(dy), .. } => return Err(format!("scroll {dy} is not a finite number")),
            RawStep { wait_ms: Some(ms), .. } => ScriptStep::Wait { ms },
            RawStep {
                remember: Some(name),
                regex,
                ..
            } => {
                let regex = regex.ok_or("`remember` needs a `regex`")?;
                regex::Regex::new(&regex).map_err(|e| format!("remember {name:?}: bad regex: {e}"))?;
                ScriptStep::Remember { name, regex }
            }
            RawStep {
                ask: Some(question),
                choices,
                ..
            } => ScriptStep::Ask { question, choices },
            _ => return Err("a step needs exactly one action key".into()),
        })
    }
}

impl From<ScriptStep> for RawStep {
    fn from(s: ScriptStep) -> RawStep {
        let mut r = RawStep::default();
        match s {
            ScriptStep::Click { target } => r.click = Some(target),
            ScriptStep::Type { text, into } => (r.r#type, r.into) = (Some(text), into),
            ScriptStep::Select { target, option } => (r.select, r.option) = (Some(target), Some(option)),
            ScriptStep::Check { target } => r.check = Some(target),
            ScriptStep::Uncheck { target } => r.uncheck = Some(target),
            ScriptStep::Hover { target } => r.hover = Some(target),
            ScriptStep::Drag { from, to } => (r.drag, r.to) = (Some(from), Some(to)),
            ScriptStep::ScrollTo { target } => r.scroll_to = Some(target),
            ScriptStep::Upload { target, path } => (r.upload, r.path) = (Some(target), Some(path)),
            ScriptStep::SwitchTab { index } => r.switch_tab = Some(index),
            ScriptStep::WaitFor { target, ms } => (r.wait_for, r.timeout_ms) = (Some(target), Some(ms)),
            ScriptStep::Key { key } => r.key = Some(key),
            ScriptStep::Navigate { url } => r.navigate = Some(url),
            ScriptStep::Back => r.back = Some(true),
            ScriptStep::Scroll { dy } => r.scroll = Some(dy),
            ScriptStep::Wait { ms } => r.wait_ms = Some(ms),
            ScriptStep::Remember { name, regex } => (r.remember, r.regex) = (Some(name), Some(regex)),
            ScriptStep::Ask { question, choices } => (r.ask, r.choices) = (Some(question), choices),
        }
        r
    }
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
    /// The episode's reward ([`Episode::reward_js`]) must exceed this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_reward: Option<f64>,
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
        let mut s: Scenario = toml::from_str(text).map_err(|e| bad(format!("not a valid scenario: {e}")))?;
        if s.name.trim().is_empty() {
            return Err(bad("`name` is empty".into()));
        }
        if s.site.is_some() && s.episode.is_some() {
            return Err(bad("give either [site] or [episode], not both".into()));
        }
        if s.site.is_none() && s.episode.is_none() && !s.start.contains("://") {
            return Err(bad(format!(
                "start {:?} is a path but no [site] or [episode] is served",
                s.start
            )));
        }
        if s.budget.steps == 0 || s.budget.window_tokens < 64 {
            return Err(bad("budget.steps must be > 0 and budget.window_tokens >= 64".into()));
        }
        if s.budget.chunk_tokens.is_some_and(|n| n < 32) {
            return Err(bad(
                "budget.chunk_tokens must be >= 32 (a block holds the page's header)".into(),
            ));
        }
        if s.budget.screenshot_tiles == 0 {
            return Err(bad("budget.screenshot_tiles must be >= 1 (1: downscale whole)".into()));
        }
        if s.policy == PolicyKind::Scripted && s.steps.is_empty() {
            return Err(bad("a scripted scenario needs [[steps]]".into()));
        }
        if let Some(dir) = &s.uploads {
            if dir.as_os_str().is_empty() {
                return Err(bad(
                    "`uploads` is empty: name a folder (relative to the scenario file's)".into(),
                ));
            }
            let base = path.parent().unwrap_or(Path::new(""));
            let joined = base.join(dir);
            s.uploads = Some(std::path::absolute(&joined).map_err(|e| bad(format!("uploads {}: {e}", dir.display())))?);
        }
        for (i, step) in s.steps.iter().enumerate() {
            if let ScriptStep::Upload { path: file, .. } = step {
                let Some(dir) = &s.uploads else {
                    return Err(bad(format!(
                        "step {}: `upload` of {file:?} needs the scenario to allow a folder: add `uploads = \"dir\"` (relative to the scenario file's folder)",
                        i + 1
                    )));
                };
                lexically_inside(dir, file).map_err(|d| bad(format!("step {}: {d}", i + 1)))?;
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
