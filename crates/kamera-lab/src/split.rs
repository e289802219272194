//! Task splits: which tasks of a file a run scores, so that nothing is held out by hand. The
//! default suite (kamera-eval's `tasks/default.jsonl`) is split by position: tasks 1-8 are the
//! dev tasks (where configurations were picked), 9-24 the calibration tasks (bases, sensitivity
//! and query tables), 25-40 the held-out tasks that headline figures come from (41-120: more
//! calibration tasks, used for the 96-task bases).

use std::fmt;
use std::str::FromStr;

use kamera_eval::Task;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A named split of the default suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Dev,
    Calibration,
    HeldOut,
}

impl Split {
    /// Its tasks (1-based positions in the file, both ends included).
    pub fn range(self) -> TaskRange {
        let (first, last) = match self {
            Split::Dev => (1, 8),
            Split::Calibration => (9, 24),
            Split::HeldOut => (25, 40),
        };
        TaskRange { first, last }
    }
    pub fn name(self) -> &'static str {
        match self {
            Split::Dev => "dev",
            Split::Calibration => "calibration",
            Split::HeldOut => "heldout",
        }
    }
}

impl FromStr for Split {
    type Err = Error;
    fn from_str(s: &str) -> Result<Split> {
        match s {
            "dev" => Ok(Split::Dev),
            "calibration" | "cal" => Ok(Split::Calibration),
            "heldout" | "held-out" => Ok(Split::HeldOut),
            _ => Err(Error::Invalid {
                op: "split",
                detail: format!("{s:?}: dev (tasks 1-8), calibration (9-24) or heldout (25-40) expected"),
            }),
        }
    }
}

/// Tasks `first..=last` of a file, 1-based positions among its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRange {
    pub first: usize,
    pub last: usize,
}

impl TaskRange {
    /// The tasks of `tasks` in the range; an error naming the range when it is empty, starts
    /// at 0 or ends past the file.
    pub fn select(self, tasks: Vec<Task>) -> Result<Vec<Task>> {
        if self.first == 0 || self.first > self.last || self.last > tasks.len() {
            return Err(Error::Invalid {
                op: "task range",
                detail: format!(
                    "tasks {self} of a file of {} tasks (1-based, both ends included)",
                    tasks.len()
                ),
            });
        }
        Ok(tasks
            .into_iter()
            .skip(self.first - 1)
            .take(self.last + 1 - self.first)
            .collect())
    }
}

impl fmt::Display for TaskRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.first, self.last)
    }
}

impl FromStr for TaskRange {
    type Err = Error;
    /// `A..=B` or `A-B` (both included), `A..B` (B excluded), 1-based.
    fn from_str(s: &str) -> Result<TaskRange> {
        let bad = || Error::Invalid {
            op: "task range",
            detail: format!("{s:?}: A..=B, A-B or A..B (1-based task positions) expected"),
        };
        let num = |x: &str| x.trim().parse::<usize>().map_err(|_| bad());
        let (first, last) = if let Some((a, b)) = s.split_once("..=") {
            (num(a)?, num(b)?)
        } else if let Some((a, b)) = s.split_once("..") {
            (num(a)?, num(b)?.checked_sub(1).ok_or_else(bad)?)
        } else if let Some((a, b)) = s.split_once('-') {
            (num(a)?, num(b)?)
        } else {
            return Err(bad());
        };
        if first == 0 || first > last {
            return Err(bad());
        }
        Ok(TaskRange { first, last })
    }
}

/// Which tasks a report scored: the file, the split or range, and `--limit` after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSelection {
    pub file: String,
    /// The named split (`None`: a range given as such, or the whole file).
    pub split: Option<String>,
    pub range: Option<TaskRange>,
    pub limit: Option<usize>,
    /// The ids scored, in order.
    pub ids: Vec<String>,
}
