//! Traces: `trace.ndjson` (a header, one line per step, an end line) beside a content-addressed
//! `resources/` folder (screenshots as `<sha256>.png`). A trace replays without a browser.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use kamera_browser::{Action, Element, Observation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result, io};
use crate::llm::ModelCall;

/// Version of the trace format; readers refuse others. 2: steps record the scheduler's typed
/// plan (kamera-sched steps, chunk ids as kamera-store hex) and typed results.
pub const TRACE_VERSION: u32 = 2;

/// sha256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub version: u32,
    /// The scenario file, as TOML, so a replay needs nothing else.
    pub scenario: String,
    /// The origin the site was served on during the recording.
    pub origin: String,
    pub model: String,
    pub started_unix_ms: u64,
}

/// An observation as stored: the screenshot by sha256.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObsRecord {
    pub url: String,
    pub title: String,
    pub text: String,
    pub elements: Vec<Element>,
    pub screenshot: String,
}

/// Milliseconds spent in each part of a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTimings {
    pub observe_ms: f64,
    /// Forward passes of the step's plan: a new page alone and in place, re-prefills (0 on a
    /// hit, relocation or recall from the store).
    pub encode_ms: f64,
    /// Forming patches: conditioned prefills + SVDs, difference patches, orbit patches.
    #[serde(default)]
    pub patch_ms: f64,
    /// Relocating and patching chunks and writing the moved ones into the model context.
    pub reuse_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub act_ms: f64,
    pub total_ms: f64,
    /// Full re-prefill of the same context, timed only when asked (`RunOptions::baseline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_prefill_ms: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: usize,
    pub observation: ObsRecord,
    /// The page's chunk: its text (the first of `chunks` for a page of several), or its screenshot
    /// with `observe = "screenshot"`.
    pub chunk: kamera_store::ChunkId,
    /// A page longer than a chunk's cap: all its chunks in reading order (`chunk` is the first);
    /// empty where the page is one chunk (and in traces written before pages were split).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<kamera_store::ChunkId>,
    /// The screenshot's image chunk when the page's text is the step's chunk (`observe = "both"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_chunk: Option<kamera_store::ChunkId>,
    /// Tokens of the page's chunks (all of them, for a page of several).
    pub chunk_tokens: usize,
    /// How the window met the page's chunks (the costliest of their visits: new, stored, recall,
    /// hit).
    pub visit: kamera_sched::Visit,
    /// The scheduler's plan of this step (the visit, then any recall by relevance), as made. The
    /// session holds plans until the model reads the window; they run then, or a rebuild of the
    /// window replaces them (`rebuilt`).
    pub plan: Vec<kamera_sched::Step>,
    /// The cost model's reason for each choice in the plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub why: Vec<String>,
    /// Tokens that went through a forward pass during this step: earlier steps' deferred work,
    /// and the held plans (or their rebuild) run when the model read the window.
    pub prefill_tokens: usize,
    /// Whether the model read at this step built the window afresh instead of running the held
    /// plans ([`kamera_sched::Window::materialize`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rebuilt: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    pub result: StepResult,
    /// Requests the page made off the allowed origins during this step, refused at the browser
    /// (absent in traces written before they were recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<kamera_browser::Blocked>,
    /// Downloads that completed during this step, saved in the run's downloads folder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub downloads: Vec<kamera_browser::Download>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    pub timings: StepTimings,
}

/// How a step's action went.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum StepResult {
    #[default]
    Ok,
    /// Navigation off the allowed origins, refused (the run goes on).
    Refused { detail: String },
    /// The action's element is gone (the run goes on).
    NoElement { detail: String },
    /// The action's element cannot take it: hidden, disabled, of the wrong kind, or a waited-for
    /// target that never appeared (the run goes on).
    Target { detail: String },
    /// The step failed and ended the run.
    Failed { error: String },
}

impl StepResult {
    pub fn is_ok(&self) -> bool {
        *self == StepResult::Ok
    }
}

impl std::fmt::Display for StepResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepResult::Ok => f.write_str("ok"),
            StepResult::Refused { detail } | StepResult::NoElement { detail } | StepResult::Target { detail } => {
                f.write_str(detail)
            }
            StepResult::Failed { error } => write!(f, "failed: {error}"),
        }
    }
}

/// The end of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndRecord {
    pub steps: usize,
    pub answer: Option<String>,
    pub success: Option<bool>,
    /// Result of the scenario's JS predicate, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub js_check: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every download of the run, in order (each step lists its own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub downloads: Vec<kamera_browser::Download>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Line {
    Header(Header),
    Step(Box<StepRecord>),
    End(EndRecord),
}

/// Writes a trace directory.
pub struct TraceWriter {
    dir: PathBuf,
    out: File,
}

impl TraceWriter {
    /// Creates `dir` (and `dir/resources`) and truncates `dir/trace.ndjson`.
    pub fn create(dir: &Path) -> Result<TraceWriter> {
        std::fs::create_dir_all(dir.join("resources")).map_err(io("create trace dir", dir))?;
        let path = dir.join("trace.ndjson");
        let out = File::create(&path).map_err(io("create", &path))?;
        Ok(TraceWriter {
            dir: dir.to_path_buf(),
            out,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stores `bytes` as `resources/<sha256>.<ext>` (once) and returns the sha256.
    pub fn resource(&self, bytes: &[u8], ext: &str) -> Result<String> {
        let h = sha256_hex(bytes);
        let p = self.dir.join("resources").join(format!("{h}.{ext}"));
        if !p.exists() {
            std::fs::write(&p, bytes).map_err(io("write", &p))?;
        }
        Ok(h)
    }

    pub fn write(&mut self, line: &Line) -> Result<()> {
        let path = self.dir.join("trace.ndjson");
        let s = serde_json::to_string(line).map_err(|e| Error::Trace {
            path: path.clone(),
            line: 0,
            detail: e.to_string(),
        })?;
        writeln!(self.out, "{s}").map_err(io("write", &path))?;
        self.out.flush().map_err(io("flush", &path))
    }
}

/// A trace read back.
#[derive(Debug, Clone)]
pub struct Trace {
    pub dir: PathBuf,
    pub header: Header,
    pub steps: Vec<StepRecord>,
    pub end: Option<EndRecord>,
}

impl Trace {
    /// Reads `dir/trace.ndjson` (or a `.ndjson` file given directly); every line must parse.
    pub fn read(path: &Path) -> Result<Trace> {
        let (dir, file) = if path.is_dir() {
            (path.to_path_buf(), path.join("trace.ndjson"))
        } else {
            (
                path.parent().unwrap_or(Path::new(".")).to_path_buf(),
                path.to_path_buf(),
            )
        };
        let f = File::open(&file).map_err(|e| Error::Trace {
            path: file.clone(),
            line: 0,
            detail: format!("cannot open: {e}"),
        })?;
        Trace::parse(BufReader::new(f), &file, dir)
    }

    /// Parses trace NDJSON from `reader` (`file` names it in errors; `dir` holds `resources/`).
    pub fn parse(reader: impl BufRead, file: &Path, dir: PathBuf) -> Result<Trace> {
        let file = file.to_path_buf();
        let mut header = None;
        let mut steps = Vec::new();
        let mut end = None;
        for (i, line) in reader.lines().enumerate() {
            let bad = |detail: String| Error::Trace {
                path: file.clone(),
                line: i + 1,
                detail,
            };
            let line = line.map_err(|e| bad(e.to_string()))?;
            if line.trim().is_empty() {
                continue;
            }
            let parsed: Line = serde_json::from_str(&line).map_err(|e| bad(format!("not a trace line: {e}")))?;
            match parsed {
                Line::Header(h) if i == 0 => {
                    if h.version != TRACE_VERSION {
                        return Err(bad(format!(
                            "trace version {} (this build reads {TRACE_VERSION})",
                            h.version
                        )));
                    }
                    header = Some(h);
                }
                Line::Header(_) => return Err(bad("a second header".into())),
                _ if header.is_none() => return Err(bad("the first line must be the header".into())),
                Line::Step(s) => steps.push(*s),
                Line::End(e) => end = Some(e),
            }
        }
        let header = header.ok_or_else(|| Error::Trace {
            path: file.clone(),
            line: 1,
            detail: "empty trace (no header)".into(),
        })?;
        Ok(Trace {
            dir,
            header,
            steps,
            end,
        })
    }

    /// The recorded observations with their screenshots loaded and checked by sha256.
    pub fn observations(&self) -> Result<Vec<Observation>> {
        self.steps
            .iter()
            .map(|s| {
                let p = self
                    .dir
                    .join("resources")
                    .join(format!("{}.png", s.observation.screenshot));
                let png = std::fs::read(&p).map_err(io("read screenshot", &p))?;
                if sha256_hex(&png) != s.observation.screenshot {
                    return Err(Error::Trace {
                        path: p,
                        line: s.step + 2,
                        detail: "screenshot does not match its sha256".into(),
                    });
                }
                Ok(Observation {
                    url: s.observation.url.clone(),
                    title: s.observation.title.clone(),
                    text: s.observation.text.clone(),
                    elements: s.observation.elements.clone(),
                    screenshot_png: png,
                })
            })
            .collect()
    }

    /// The actions taken, in order.
    pub fn actions(&self) -> Vec<Action> {
        self.steps.iter().filter_map(|s| s.action.clone()).collect()
    }
}

/// The action steps as Chrome DevTools Recorder JSON.
pub fn devtools_recorder(
    title: &str,
    start_url: &str,
    steps: &[StepRecord],
    width: u32,
    height: u32,
) -> serde_json::Value {
    use serde_json::json;
    let mut out = vec![
        json!({"type": "setViewport", "width": width, "height": height, "deviceScaleFactor": 1,
               "isMobile": false, "hasTouch": false, "isLandscape": true}),
        json!({"type": "navigate", "url": start_url}),
    ];
    for s in steps {
        let sel = |id: u32| -> serde_json::Value {
            match s.observation.elements.iter().find(|e| e.id == id) {
                Some(e) if !e.html_id.is_empty() => json!([[format!("#{}", e.html_id)]]),
                Some(e) => json!([[format!("aria/{}", e.text)], [format!("text/{}", e.text)]]),
                None => json!([]),
            }
        };
        match &s.action {
            Some(Action::Click { id }) => {
                out.push(json!({"type": "click", "selectors": sel(*id), "offsetX": 1, "offsetY": 1}))
            }
            Some(Action::ClickXy { x, y }) => {
                out.push(json!({"type": "click", "selectors": [["body"]], "offsetX": x, "offsetY": y}))
            }
            Some(Action::Type { id, text }) => {
                let selectors = id.map(sel).unwrap_or_else(|| json!([[":focus"]]));
                out.push(json!({"type": "change", "value": text, "selectors": selectors}))
            }
            Some(Action::Key { key }) => {
                out.push(json!({"type": "keyDown", "key": key}));
                out.push(json!({"type": "keyUp", "key": key}));
            }
            Some(Action::Scroll { dy }) => out.push(json!({"type": "scroll", "x": 0, "y": dy})),
            Some(Action::Navigate { url }) => out.push(json!({"type": "navigate", "url": url})),
            Some(Action::Back) => out.push(json!({"type": "navigate", "url": "javascript:history.back()"})),
            Some(Action::Select { id, option }) => {
                out.push(json!({"type": "change", "value": option, "selectors": sel(*id)}))
            }
            Some(Action::Check { id } | Action::Uncheck { id }) => {
                out.push(json!({"type": "click", "selectors": sel(*id), "offsetX": 1, "offsetY": 1}))
            }
            Some(Action::Hover { id }) => out.push(json!({"type": "hover", "selectors": sel(*id)})),
            Some(Action::ScrollTo { id }) => out.push(json!({"type": "scroll", "selectors": sel(*id)})),
            Some(Action::WaitFor { target, ms }) => {
                let selector = match target.strip_prefix("text:") {
                    Some(t) => format!("text/{}", t.trim()),
                    None => target.clone(),
                };
                out.push(json!({"type": "waitForElement", "selectors": [[selector]], "timeout": ms}))
            }
            // The Recorder format has no drag, tab switch or file step; the trace keeps them.
            Some(
                Action::Drag { .. }
                | Action::SwitchTab { .. }
                | Action::Upload { .. }
                | Action::Wait { .. }
                | Action::Done { .. },
            )
            | None => {}
        }
    }
    json!({"title": title, "steps": out})
}
