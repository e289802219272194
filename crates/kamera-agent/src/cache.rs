//! The action cache (`kamera run --action-cache DIR`, [`crate::AgentBuilder::action_cache`]):
//! what a step decided, kept on disk so that the same step on the same page is replayed with no
//! model call, and healed where the page changed.
//!
//! An entry's key is the step's instruction (a scripted step as written, after `$name`
//! substitution; a scripted question; the model policy's task), the URL without its volatile
//! parts ([`url_key`]) and the kind of entry; its value is one of
//! - `target`: a scripted step's target, by its features ([`Target`]), and the page it led to;
//! - `action`: the model policy's action, its targets by their features, and the page it led to;
//! - `answer`: a question's answer, with a hash of the window the model read it from;
//! - `plan`: the model policy's plan for its task (no URL), with a hash of the window it was
//!   written over; used only over that very window, and not counted as a step's hit.
//!
//! An entry is used as recorded when the page's interactive structure ([`structure_hash`]) is the
//! recorded one and its targets are found unchanged (a **hit**: no model call). Where the page
//! changed, its targets are looked for by their stable selectors (HTML id, link path, tag and
//! text); found, the step replays and the entry is updated (**healed** with no model call); gone,
//! the model re-infers the step (**healed** with one model call) and the entry is replaced. An
//! answer is a hit only over the very window it was read from (greedy decoding over the same
//! context answers the same); another window asks the model again. Each replayed step is checked
//! at the next observation: a page other than the one recorded marks the entry stale, and when
//! the step visibly did nothing it is retried once, the model re-inferring it.
//!
//! On disk: one JSON file per key, `DIR/<32 hex digits>.json` (sha256 of kind, instruction and
//! URL key), and for targets and actions a copy under the key with the page's interactive
//! structure added, looked up first: pages that share a URL and an instruction (a task's seeds,
//! a list and its filtered view) keep one entry each, and the structure-free key is what a
//! changed page heals from. Written atomically (a temporary file, then a rename), carrying
//! `"version": ACTION_CACHE_VERSION`. A file that does not parse, or of another version, is an
//! error naming it ([`Error::Cache`]), never skipped.

mod target;

use std::path::{Path, PathBuf};

use kamera_browser::{Action, Observation};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, io};
pub use target::{Found, PageSig, Target, structure_hash, url_key};

/// The on-disk format's version.
pub const ACTION_CACHE_VERSION: u32 = 1;

/// What the cache did during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Steps replayed as recorded, with no model call.
    pub hits: usize,
    /// Steps whose entry no longer fit the page and was updated (with or without a model call).
    pub healed: usize,
    /// Entries written for steps not seen before.
    pub stored: usize,
    /// Replayed steps that did not lead to the recorded page.
    pub mismatches: usize,
}

/// One file of the cache.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    version: u32,
    instruction: String,
    url: String,
    #[serde(flatten)]
    value: Value,
    /// Set when a replay did not lead to the recorded page: the next use re-infers.
    #[serde(default)]
    stale: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Value {
    Target {
        structure: String,
        target: Target,
        after: Option<PageSig>,
    },
    Action {
        structure: String,
        action: Action,
        targets: Vec<Target>,
        after: Option<PageSig>,
    },
    Answer {
        window: String,
        answer: String,
    },
    /// The model policy's plan for a goal, written over `window` (its sha256).
    Plan {
        window: String,
        plan: String,
    },
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Target { .. } => "target",
            Value::Action { .. } => "action",
            Value::Answer { .. } => "answer",
            Value::Plan { .. } => "plan",
        }
    }
    /// The interactive structure of the page the entry acts on (targets and actions).
    fn structure(&self) -> Option<&str> {
        match self {
            Value::Target { structure, .. } | Value::Action { structure, .. } => Some(structure),
            Value::Answer { .. } | Value::Plan { .. } => None,
        }
    }
    fn after_mut(&mut self) -> Option<&mut Option<PageSig>> {
        match self {
            Value::Target { after, .. } | Value::Action { after, .. } => Some(after),
            Value::Answer { .. } | Value::Plan { .. } => None,
        }
    }
}

/// An entry used or made this step, checked and written at the next observation.
struct Pending {
    file: PathBuf,
    record: Record,
    /// The page the step acted on.
    before: PageSig,
    before_structure: String,
    /// The entry was replayed (not decided afresh): check the page it leads to.
    replayed: bool,
}

/// How the cache answered a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    Hit,
    /// The entry's targets were found by their stable selectors on a changed page.
    Healed,
    /// No usable entry: decide afresh (`true`: an entry existed and is being healed).
    Decide {
        healing: bool,
    },
}

/// The cache directory and what it did this run.
pub struct ActionCache {
    dir: PathBuf,
    stats: CacheStats,
    pending: Option<Pending>,
    /// The key of the step the last check asked to retry (retried once).
    retried: Option<PathBuf>,
    /// The model policy's steps so far on each URL key: its entries are keyed by the task, the
    /// URL and this count, so that several steps on one page keep one entry each.
    visits: std::collections::HashMap<String, usize>,
    /// The page the entry being healed led to: the healed step is checked against it.
    healing_after: Option<PageSig>,
}

impl ActionCache {
    /// Opens (creating) the cache in `dir` and reads every entry once: a file that is not an
    /// entry of this version is an error naming it.
    pub fn open(dir: impl Into<PathBuf>) -> Result<ActionCache> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(io("create the action cache", &dir))?;
        for f in std::fs::read_dir(&dir).map_err(io("read the action cache", &dir))? {
            let path = f.map_err(io("read the action cache", &dir))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                read(&path)?;
            }
        }
        Ok(ActionCache {
            dir,
            stats: CacheStats::default(),
            pending: None,
            retried: None,
            visits: Default::default(),
            healing_after: None,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the cache did so far.
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    fn file(&self, kind: &str, instruction: &str, url: &str) -> PathBuf {
        let h = crate::trace::sha256_hex(format!("{kind}\n{instruction}\n{url}").as_bytes());
        self.dir.join(format!("{}.json", &h[..32]))
    }

    /// The file of the entry for `instruction` on a page of this interactive `structure`.
    fn structured(&self, kind: &str, instruction: &str, url: &str, structure: &str) -> PathBuf {
        self.file(kind, &format!("{instruction}\n{structure}"), url)
    }

    /// The entry for `instruction` on `url`: the one recorded on a page of `structure` when
    /// there is one, else the last one recorded there. The path returned is the structure-free
    /// key's ([`ActionCache::write_record`] writes both).
    fn lookup_on(
        &self,
        kind: &str,
        instruction: &str,
        url: &str,
        structure: &str,
    ) -> Result<(PathBuf, Option<Record>)> {
        let exact = self.structured(kind, instruction, url, structure);
        if exact.exists() {
            let rec = read(&exact)?;
            if rec.value.kind() == kind {
                return Ok((self.file(kind, instruction, url), Some(rec)));
            }
        }
        self.lookup(kind, instruction, url)
    }

    /// Writes `rec` under `file` and, for targets and actions, under its structure's key.
    fn write_record(&self, file: &Path, rec: &Record) -> Result<()> {
        write(file, rec)?;
        match rec.value.structure() {
            Some(s) => write(&self.structured(rec.value.kind(), &rec.instruction, &rec.url, s), rec),
            None => Ok(()),
        }
    }

    fn lookup(&self, kind: &str, instruction: &str, url: &str) -> Result<(PathBuf, Option<Record>)> {
        let file = self.file(kind, instruction, url);
        let rec = if file.exists() { Some(read(&file)?) } else { None };
        Ok((file, rec.filter(|r| r.value.kind() == kind)))
    }

    /// Checks the last step's entry against the page it led to (`obs`) and writes it. Returns
    /// `true` when that step was replayed, did not lead to the recorded page, and left the page
    /// as it was (it did nothing): the caller retries it once, and the stale entry makes the
    /// model re-infer it.
    pub fn observed(&mut self, obs: &Observation, origin: &str) -> Result<bool> {
        let Some(mut p) = self.pending.take() else {
            return Ok(false);
        };
        let now = PageSig::of(obs, origin);
        let mut retry = false;
        if let Some(after) = p.record.value.after_mut() {
            match after {
                Some(expected) if p.replayed && *expected != now => {
                    tracing::info!(expected = ?expected, got = ?now, "action cache: the replayed step led elsewhere");
                    self.stats.mismatches += 1;
                    p.record.stale = true;
                    retry = now == p.before
                        && structure_hash(obs) == p.before_structure
                        && self.retried.as_ref() != Some(&p.file);
                    if retry {
                        self.retried = Some(p.file.clone());
                        if let (Value::Action { .. }, Some(n)) = (&p.record.value, self.visits.get_mut(&p.record.url)) {
                            *n = n.saturating_sub(1);
                        }
                    }
                }
                _ => *after = Some(now),
            }
        }
        self.write_record(&p.file, &p.record)?;
        Ok(retry)
    }

    /// Writes what is pending (the run's last step, with no next page to check it against).
    pub fn finish(&mut self) -> Result<()> {
        if let Some(p) = self.pending.take() {
            self.write_record(&p.file, &p.record)?;
        }
        Ok(())
    }

    /// A scripted step's target: the cached one where its features find it on `obs`, else
    /// [`Use::Decide`] (the caller resolves it by the step's selector or asks the model, then
    /// calls [`ActionCache::record_target`]). The second value is what the entry knew of the
    /// target, for a model's prompt.
    pub fn target(
        &mut self,
        instruction: &str,
        obs: &Observation,
        origin: &str,
    ) -> Result<(Use, Option<u32>, Option<Target>)> {
        let url = url_key(&obs.url, origin);
        let (file, rec) = self.lookup_on("target", instruction, &url, &structure_hash(obs))?;
        let Some(rec) = rec else {
            return Ok((Use::Decide { healing: false }, None, None));
        };
        let Value::Target { structure, target, .. } = &rec.value else {
            return Ok((Use::Decide { healing: false }, None, None));
        };
        let known = Some(target.clone());
        let found = if rec.stale { None } else { target.find(obs) };
        let Some((id, how)) = found else {
            self.healing_after = match &rec.value {
                Value::Target { after, .. } if !rec.stale => after.clone(),
                _ => None,
            };
            return Ok((Use::Decide { healing: true }, None, known));
        };
        let s = structure_hash(obs);
        let u = if how == Found::Same && *structure == s {
            self.stats.hits += 1;
            Use::Hit
        } else {
            self.stats.healed += 1;
            Use::Healed
        };
        let el = obs.element(id).map(Target::of).unwrap_or_else(|| target.clone());
        let mut record = rec.clone();
        record.value = Value::Target {
            structure: s.clone(),
            target: el,
            after: match &rec.value {
                Value::Target { after, .. } => after.clone(),
                _ => None,
            },
        };
        self.replaying(file, record, obs, origin, s);
        Ok((u, Some(id), known))
    }

    /// Holds `record` (an entry being replayed on `obs`) until the page it leads to is seen.
    fn replaying(&mut self, file: PathBuf, record: Record, obs: &Observation, origin: &str, structure: String) {
        self.pending = Some(Pending {
            file,
            record,
            before: PageSig::of(obs, origin),
            before_structure: structure,
            replayed: true,
        });
    }

    /// Records the target a scripted step resolved afresh (`healing`: replacing an entry that
    /// no longer fit).
    pub fn record_target(&mut self, instruction: &str, obs: &Observation, origin: &str, id: u32, healing: bool) {
        let Some(e) = obs.element(id) else { return };
        let url = url_key(&obs.url, origin);
        let s = structure_hash(obs);
        self.count(healing);
        // A healed step is checked against the page its entry led to.
        let after = if healing { self.healing_after.take() } else { None };
        self.pending = Some(Pending {
            replayed: after.is_some(),
            file: self.file("target", instruction, &url),
            record: Record {
                version: ACTION_CACHE_VERSION,
                instruction: instruction.to_string(),
                url,
                value: Value::Target {
                    structure: s.clone(),
                    target: Target::of(e),
                    after,
                },
                stale: false,
            },
            before: PageSig::of(obs, origin),
            before_structure: s,
        });
    }

    /// The model policy's instruction for its next step on `url`: the task and how many steps
    /// it took on that page before.
    fn visit_key(&self, task: &str, url: &str) -> String {
        format!("{task}\n#{}", self.visits.get(url).copied().unwrap_or(0))
    }

    fn count(&mut self, healing: bool) {
        if healing {
            self.stats.healed += 1;
        } else {
            self.stats.stored += 1;
        }
    }

    /// The plan recorded for `goal` over this very window (`window`: its text before the first
    /// page), if any. Not counted in [`CacheStats`]: a plan is no step.
    pub fn plan(&self, goal: &str, window: &str) -> Result<Option<String>> {
        let (_, rec) = self.lookup("plan", goal, "")?;
        let w = crate::trace::sha256_hex(window.as_bytes());
        Ok(match rec.map(|r| r.value) {
            Some(Value::Plan { window, plan }) if window == w => Some(plan),
            _ => None,
        })
    }

    /// Writes the plan the model wrote for `goal` over `window`.
    pub fn record_plan(&self, goal: &str, window: &str, plan: &str) -> Result<()> {
        let record = Record {
            version: ACTION_CACHE_VERSION,
            instruction: goal.to_string(),
            url: String::new(),
            value: Value::Plan {
                window: crate::trace::sha256_hex(window.as_bytes()),
                plan: plan.to_string(),
            },
            stale: false,
        };
        write(&self.file("plan", goal, ""), &record)
    }

    /// A question's cached answer, when it was read from this very window (`window`: the
    /// window's text); else `Decide` and the caller asks the model, then [`ActionCache::record_answer`].
    pub fn answer(
        &mut self,
        question: &str,
        obs: &Observation,
        origin: &str,
        window: &str,
    ) -> Result<(Use, Option<String>)> {
        let url = url_key(&obs.url, origin);
        let (_, rec) = self.lookup("answer", question, &url)?;
        let w = crate::trace::sha256_hex(window.as_bytes());
        match rec.map(|r| r.value) {
            Some(Value::Answer { window, answer }) if window == w => {
                self.stats.hits += 1;
                Ok((Use::Hit, Some(answer)))
            }
            Some(_) => Ok((Use::Decide { healing: true }, None)),
            None => Ok((Use::Decide { healing: false }, None)),
        }
    }

    /// Writes a question's answer read from `window`.
    pub fn record_answer(
        &mut self,
        question: &str,
        obs: &Observation,
        origin: &str,
        window: &str,
        answer: &str,
        healing: bool,
    ) -> Result<()> {
        let url = url_key(&obs.url, origin);
        self.count(healing);
        let file = self.file("answer", question, &url);
        write(
            &file,
            &Record {
                version: ACTION_CACHE_VERSION,
                instruction: question.to_string(),
                url,
                value: Value::Answer {
                    window: crate::trace::sha256_hex(window.as_bytes()),
                    answer: answer.to_string(),
                },
                stale: false,
            },
        )
    }

    /// The model policy's cached action for `task` on `obs`, its targets found by their
    /// features (ids rewritten to this page's); else `Decide`, and the caller asks the model,
    /// then [`ActionCache::record_action`].
    pub fn action(&mut self, task: &str, obs: &Observation, origin: &str) -> Result<(Use, Option<Action>)> {
        let url = url_key(&obs.url, origin);
        let task = &self.visit_key(task, &url);
        let (file, rec) = self.lookup_on("action", task, &url, &structure_hash(obs))?;
        let Some(rec) = rec else {
            return Ok((Use::Decide { healing: false }, None));
        };
        let Value::Action {
            structure,
            action,
            targets,
            after,
        } = &rec.value
        else {
            return Ok((Use::Decide { healing: false }, None));
        };
        if rec.stale {
            return Ok((Use::Decide { healing: true }, None));
        }
        let mut ids = Vec::new();
        let mut all_same = true;
        for t in targets {
            match t.find(obs) {
                Some((id, how)) => {
                    all_same &= how == Found::Same;
                    ids.push(id);
                }
                None => return Ok((Use::Decide { healing: true }, None)),
            }
        }
        let Some(replayed) = with_ids(action, &ids) else {
            return Ok((Use::Decide { healing: true }, None));
        };
        let s = structure_hash(obs);
        let u = if all_same && *structure == s {
            self.stats.hits += 1;
            Use::Hit
        } else {
            self.stats.healed += 1;
            Use::Healed
        };
        let targets = ids.iter().filter_map(|id| obs.element(*id).map(Target::of)).collect();
        *self.visits.entry(url.clone()).or_default() += 1;
        let mut record = rec.clone();
        record.value = Value::Action {
            structure: s.clone(),
            action: replayed.clone(),
            targets,
            after: after.clone(),
        };
        self.replaying(file, record, obs, origin, s);
        Ok((u, Some(replayed)))
    }

    /// Records the model policy's action for `task` on `obs` (not `done`: an answer is the
    /// model's reading of the window, kept only by [`ActionCache::record_answer`]).
    pub fn record_action(&mut self, task: &str, obs: &Observation, origin: &str, action: &Action, healing: bool) {
        if matches!(action, Action::Done { .. }) {
            return;
        }
        let ids = target_ids(action);
        let targets: Vec<Target> = ids.iter().filter_map(|id| obs.element(*id).map(Target::of)).collect();
        if targets.len() != ids.len() {
            return;
        }
        let url = url_key(&obs.url, origin);
        let task = &self.visit_key(task, &url);
        *self.visits.entry(url.clone()).or_default() += 1;
        let s = structure_hash(obs);
        self.count(healing);
        self.pending = Some(Pending {
            file: self.file("action", task, &url),
            record: Record {
                version: ACTION_CACHE_VERSION,
                instruction: task.to_string(),
                url,
                value: Value::Action {
                    structure: s.clone(),
                    action: action.clone(),
                    targets,
                    after: None,
                },
                stale: false,
            },
            before: PageSig::of(obs, origin),
            before_structure: s,
            replayed: false,
        });
    }
}

/// The element ids an action names, in order.
fn target_ids(a: &Action) -> Vec<u32> {
    match a {
        Action::Click { id }
        | Action::Check { id }
        | Action::Uncheck { id }
        | Action::Hover { id }
        | Action::ScrollTo { id }
        | Action::Upload { id, .. }
        | Action::Select { id, .. } => vec![*id],
        Action::Type { id, .. } => id.iter().copied().collect(),
        Action::Drag { from, to } => vec![*from, *to],
        _ => Vec::new(),
    }
}

/// `a` with its element ids replaced by `ids` (as many as [`target_ids`] gives).
fn with_ids(a: &Action, ids: &[u32]) -> Option<Action> {
    if ids.len() != target_ids(a).len() {
        return None;
    }
    let mut a = a.clone();
    match &mut a {
        Action::Click { id }
        | Action::Check { id }
        | Action::Uncheck { id }
        | Action::Hover { id }
        | Action::ScrollTo { id }
        | Action::Upload { id, .. }
        | Action::Select { id, .. } => *id = ids[0],
        Action::Type { id, .. } => *id = ids.first().copied(),
        Action::Drag { from, to } => (*from, *to) = (ids[0], ids[1]),
        _ => {}
    }
    Some(a)
}

fn read(path: &Path) -> Result<Record> {
    let bad = |detail: String| Error::Cache {
        path: path.to_path_buf(),
        detail,
    };
    let bytes = std::fs::read(path).map_err(io("read an action cache entry", path))?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON ({e}); delete it or the cache folder")))?;
    match v.get("version").and_then(|x| x.as_u64()) {
        Some(n) if n == ACTION_CACHE_VERSION as u64 => {}
        Some(n) => {
            return Err(bad(format!(
                "entry version {n}, this kamera reads version {ACTION_CACHE_VERSION}; delete it or use another cache folder"
            )));
        }
        None => return Err(bad("no \"version\": not an action cache entry".into())),
    }
    serde_json::from_value(v).map_err(|e| bad(format!("not an action cache entry ({e})")))
}

/// Writes `rec` to `path` atomically: a temporary file beside it, then a rename.
fn write(path: &Path, rec: &Record) -> Result<()> {
    let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
    let bytes = serde_json::to_vec_pretty(rec).map_err(|e| Error::Cache {
        path: path.to_path_buf(),
        detail: format!("encode: {e}"),
    })?;
    std::fs::write(&tmp, bytes).map_err(io("write an action cache entry", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("rename an action cache entry into place", path))
}

#[cfg(test)]
mod tests;
