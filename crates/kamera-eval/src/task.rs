//! The task format (JSONL, one task a line): `{"id", "chunks": [...], "question", "answer"}`.
//! Chunks are page observations in context order; the question follows them; the answer is the
//! expected continuation.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One reuse task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub chunks: Vec<String>,
    pub question: String,
    pub answer: String,
}

impl Task {
    /// Checks the fields a harness needs: an id, at least one non-empty chunk, a question and
    /// an answer.
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: &str| {
            Err(Error::Task {
                id: self.id.clone(),
                detail: detail.to_string(),
            })
        };
        if self.id.trim().is_empty() {
            return bad("empty id");
        }
        if self.chunks.is_empty() {
            return bad("no chunks (expected at least one page)");
        }
        if let Some(i) = self.chunks.iter().position(|c| c.trim().is_empty()) {
            return bad(&format!("chunk {i} is empty"));
        }
        if self.question.trim().is_empty() {
            return bad("empty question");
        }
        if self.answer.is_empty() {
            return bad("empty answer");
        }
        Ok(())
    }
}

/// Parses JSONL text (blank lines skipped); `path` only names the source in errors.
pub fn parse_tasks(text: &str, path: &Path) -> Result<Vec<Task>> {
    let mut tasks = Vec::new();
    let mut ids = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let err = |detail: String| Error::TaskFile {
            path: path.to_path_buf(),
            line: line_no,
            detail,
        };
        let task: Task = serde_json::from_str(line).map_err(|e| {
            err(format!(
                "{e}; expected {{\"id\": str, \"chunks\": [str, ...], \"question\": str, \"answer\": str}}"
            ))
        })?;
        task.validate().map_err(|e| err(e.to_string()))?;
        if !ids.insert(task.id.clone()) {
            return Err(err(format!("duplicate id {:?}", task.id)));
        }
        tasks.push(task);
    }
    if tasks.is_empty() {
        return Err(Error::TaskFile {
            path: path.to_path_buf(),
            line: 0,
            detail: "no tasks in the file".into(),
        });
    }
    Ok(tasks)
}

/// Reads a JSONL task file.
pub fn load_tasks(path: &Path) -> Result<Vec<Task>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        op: "load_tasks",
        path: path.to_path_buf(),
        source,
    })?;
    parse_tasks(&text, path)
}

/// JSONL text of `tasks`, one a line.
pub fn tasks_to_jsonl(tasks: &[Task]) -> String {
    let mut out = String::new();
    for t in tasks {
        out.push_str(&serde_json::to_string(t).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// Writes a JSONL task file.
pub fn save_tasks(path: &Path, tasks: &[Task]) -> Result<()> {
    let io = |source| Error::Io {
        op: "save_tasks",
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(tasks_to_jsonl(tasks).as_bytes()).map_err(io)
}
