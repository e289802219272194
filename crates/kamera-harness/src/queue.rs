//! A work queue of episodes on Redis Streams (`kamera queue push`, `kamera worker`): an existing
//! engine's at-least-once delivery, made exactly-once in the results.
//!
//! - Each episode is one stream entry (the scenario file's text, name and path) read by a
//!   consumer group: Redis hands each entry to one worker and keeps it *pending* on that worker
//!   until acknowledged.
//! - A worker writes the episode's result into a hash keyed by the entry's id and acknowledges
//!   the entry in one `MULTI`/`EXEC`: a result is never written twice for two runs of one
//!   episode, and an episode is never acknowledged without its result.
//! - A worker killed mid-episode leaves its entry pending; once the entry has been idle for the
//!   claim timeout another worker takes it over (`XAUTOCLAIM`) and runs it. A live worker keeps
//!   its entry's idle time near zero with an `XCLAIM ... JUSTID` heartbeat, so a long episode is
//!   not taken from it.
//! - An entry delivered more than `max_deliveries` times (workers keep dying on it) is given up:
//!   its result is an error saying so.
//!
//! The keys share one hash tag (`kamera:queue:{NAME}:...`), so a queue's keys live on one node
//! of a Redis Cluster and the transaction stays single-slot; the client here is single-node.

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::{Commands, Connection, Value};
use serde::{Deserialize, Serialize};

/// The consumer group every worker reads in.
pub const GROUP: &str = "workers";

/// A queue error, naming what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("queue {url}: {op}: {source}")]
    Redis {
        url: String,
        op: &'static str,
        source: redis::RedisError,
    },
    #[error("queue: scenario {path}: {detail}")]
    Scenario { path: PathBuf, detail: String },
    #[error("queue {url}: {detail}")]
    Invalid { url: String, detail: String },
}

pub type QueueResult<T> = std::result::Result<T, QueueError>;

/// A stream entry as Redis returns it: its id and its fields and values in turn.
type RawEntry = (String, Vec<String>);

/// One episode taken from the queue.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The stream entry's id (`<ms>-<seq>`): the episode's id in the results.
    pub id: String,
    /// The scenario's name, file path (as pushed) and TOML text.
    pub scenario: String,
    pub path: PathBuf,
    pub toml: String,
    /// How many times Redis has handed this entry to a worker (1 on the first delivery).
    pub deliveries: u64,
}

/// An episode's result, as stored in the results hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeResult {
    pub id: String,
    pub scenario: String,
    /// The consumer (worker) that ran it to the end.
    pub worker: String,
    pub deliveries: u64,
    pub success: Option<bool>,
    pub answer: Option<String>,
    pub steps: usize,
    pub wall_ms: f64,
    pub error: Option<String>,
}

impl EpisodeResult {
    /// Whether it counts as failed (a failed check or an error).
    pub fn failed(&self) -> bool {
        self.error.is_some() || self.success == Some(false)
    }
}

/// Where a queue stands.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Status {
    /// Entries pushed so far.
    pub pushed: u64,
    /// Not yet handed to any worker.
    pub waiting: u64,
    /// Handed to a worker and not acknowledged: running, or held by a worker that died.
    pub running: u64,
    /// Results written: done (passed or ran without a check) and failed.
    pub done: u64,
    pub failed: u64,
    /// Pending entries per worker (consumer name, count).
    pub workers: Vec<(String, u64)>,
}

/// A connection to one queue.
pub struct Queue {
    url: String,
    name: String,
    conn: Connection,
}

impl Queue {
    /// Connects to the Redis server at `url` (`redis://` or `rediss://`) and the queue `name`,
    /// creating its stream and consumer group when missing.
    pub fn open(url: &str, name: &str) -> QueueResult<Queue> {
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(QueueError::Invalid {
                url: url.into(),
                detail: "a queue is a Redis URL: redis://[user:pass@]host:port/db".into(),
            });
        }
        if name.is_empty() || name.contains(['{', '}', ' ']) {
            return Err(QueueError::Invalid {
                url: url.into(),
                detail: format!("queue name {name:?}: give a non-empty name without braces or spaces"),
            });
        }
        let client = redis::Client::open(url).map_err(redis_err(url, "open"))?;
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .map_err(redis_err(url, "connect"))?;
        let mut q = Queue {
            url: url.into(),
            name: name.into(),
            conn,
        };
        q.ensure_group()?;
        Ok(q)
    }

    /// Another connection to the same queue (a heartbeat runs on its own).
    pub fn reopen(&self) -> QueueResult<Queue> {
        Queue::open(&self.url, &self.name)
    }

    fn key(&self, what: &str) -> String {
        format!("kamera:queue:{{{}}}:{what}", self.name)
    }

    fn stream(&self) -> String {
        self.key("episodes")
    }

    fn results(&self) -> String {
        self.key("results")
    }

    fn ensure_group(&mut self) -> QueueResult<()> {
        let r: redis::RedisResult<Value> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(self.stream())
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query(&mut self.conn);
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(redis_err(&self.url, "create the consumer group")(e)),
        }
    }

    /// Adds the scenario file at `path` as one episode; returns its id.
    pub fn push(&mut self, path: &Path) -> QueueResult<String> {
        let toml = std::fs::read_to_string(path).map_err(|e| QueueError::Scenario {
            path: path.into(),
            detail: format!("cannot read: {e}"),
        })?;
        let scenario = crate::parse_scenario(&toml, path).map_err(|e| QueueError::Scenario {
            path: path.into(),
            detail: e.to_string(),
        })?;
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        redis::cmd("XADD")
            .arg(self.stream())
            .arg("*")
            .arg("scenario")
            .arg(&scenario.name)
            .arg("path")
            .arg(abs.to_string_lossy().as_ref())
            .arg("toml")
            .arg(&toml)
            .query(&mut self.conn)
            .map_err(redis_err(&self.url, "push"))
    }

    /// The next episode for `worker`: first one another worker has held idle for at least
    /// `claim_after` (its worker died), else a new one, waiting up to `block` for one to arrive.
    pub fn next(&mut self, worker: &str, claim_after: Duration, block: Duration) -> QueueResult<Option<Entry>> {
        let claimed: (String, Vec<RawEntry>, Vec<String>) = redis::cmd("XAUTOCLAIM")
            .arg(self.stream())
            .arg(GROUP)
            .arg(worker)
            .arg(claim_after.as_millis() as u64)
            .arg("0-0")
            .arg("COUNT")
            .arg(1)
            .query(&mut self.conn)
            .map_err(redis_err(&self.url, "claim an idle episode"))?;
        if let Some((id, fields)) = claimed.1.into_iter().next() {
            let deliveries = self.deliveries(&id)?;
            tracing::info!(%id, deliveries, "took over an episode a worker left pending");
            return Ok(Some(entry(id, fields, deliveries)));
        }
        type Read = Option<Vec<(String, Vec<RawEntry>)>>;
        let read: Read = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(worker)
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(block.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(self.stream())
            .arg(">")
            .query(&mut self.conn)
            .map_err(redis_err(&self.url, "read an episode"))?;
        Ok(read
            .and_then(|streams| streams.into_iter().next())
            .and_then(|(_, entries)| entries.into_iter().next())
            .map(|(id, fields)| entry(id, fields, 1)))
    }

    /// How many times the pending entry `id` has been delivered.
    fn deliveries(&mut self, id: &str) -> QueueResult<u64> {
        let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(self.stream())
            .arg(GROUP)
            .arg(id)
            .arg(id)
            .arg(1)
            .query(&mut self.conn)
            .map_err(redis_err(&self.url, "read an episode's deliveries"))?;
        Ok(rows.first().map_or(1, |r| r.3))
    }

    /// Keeps `id` with `worker` and its idle time at zero (the heartbeat of a running episode).
    pub fn heartbeat(&mut self, worker: &str, id: &str) -> QueueResult<()> {
        let _: Value = redis::cmd("XCLAIM")
            .arg(self.stream())
            .arg(GROUP)
            .arg(worker)
            .arg(0)
            .arg(id)
            .arg("JUSTID")
            .query(&mut self.conn)
            .map_err(redis_err(&self.url, "heartbeat"))?;
        Ok(())
    }

    /// Writes `result` and acknowledges its entry, atomically.
    pub fn complete(&mut self, result: &EpisodeResult) -> QueueResult<()> {
        let json = serde_json::to_string(result).map_err(|e| QueueError::Invalid {
            url: self.url.clone(),
            detail: format!("encoding a result: {e}"),
        })?;
        let _: Value = redis::pipe()
            .atomic()
            .hset(self.results(), &result.id, json)
            .ignore()
            .cmd("XACK")
            .arg(self.stream())
            .arg(GROUP)
            .arg(&result.id)
            .ignore()
            .query(&mut self.conn)
            .map_err(redis_err(&self.url, "write a result"))?;
        Ok(())
    }

    /// Every result written, in id order.
    pub fn results_all(&mut self) -> QueueResult<Vec<EpisodeResult>> {
        let all: Vec<(String, String)> = self
            .conn
            .hgetall(self.results())
            .map_err(redis_err(&self.url, "read the results"))?;
        let mut out = Vec::with_capacity(all.len());
        for (id, json) in all {
            out.push(serde_json::from_str(&json).map_err(|e| QueueError::Invalid {
                url: self.url.clone(),
                detail: format!("result {id} does not read: {e}"),
            })?);
        }
        out.sort_by_key(|r: &EpisodeResult| id_key(&r.id));
        Ok(out)
    }

    /// Where the queue stands.
    pub fn status(&mut self) -> QueueResult<Status> {
        let pushed: u64 = redis::cmd("XLEN")
            .arg(self.stream())
            .query(&mut self.conn)
            .map_err(redis_err(&self.url, "count the episodes"))?;
        let (running, lag) = self.group_counts()?;
        let results = self.results_all()?;
        let failed = results.iter().filter(|r| r.failed()).count() as u64;
        // `lag` is what the group has not been handed yet (Redis 7); where Redis cannot tell,
        // count it from the rest.
        let done = results.len() as u64;
        let waiting = lag.unwrap_or_else(|| pushed.saturating_sub(done + running));
        // XPENDING's summary: count, smallest and largest id, and (consumer, count) pairs.
        type Summary = (u64, Option<String>, Option<String>, Option<Vec<(String, String)>>);
        let summary: Summary = redis::cmd("XPENDING")
            .arg(self.stream())
            .arg(GROUP)
            .query(&mut self.conn)
            .map_err(redis_err(&self.url, "read the pending episodes"))?;
        let workers = summary
            .3
            .unwrap_or_default()
            .into_iter()
            .map(|(w, n)| (w, n.parse().unwrap_or(0)))
            .collect();
        Ok(Status {
            pushed,
            waiting,
            running,
            done: done - failed,
            failed,
            workers,
        })
    }

    /// Whether nothing is left to do: no entry waiting and none pending.
    pub fn drained(&mut self) -> QueueResult<bool> {
        // From the consumer group alone (a worker polls this while idle), unless Redis cannot
        // tell the lag.
        match self.group_counts()? {
            (running, Some(lag)) => Ok(running == 0 && lag == 0),
            (_, None) => {
                let s = self.status()?;
                Ok(s.waiting == 0 && s.running == 0)
            }
        }
    }

    /// The group's pending entries (handed out, not acknowledged) and its lag (entries not yet
    /// handed out; `None` where Redis cannot tell).
    fn group_counts(&mut self) -> QueueResult<(u64, Option<u64>)> {
        let groups: Vec<std::collections::HashMap<String, Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(self.stream())
            .query(&mut self.conn)
            .map_err(redis_err(&self.url, "read the consumer group"))?;
        let group = groups.iter().find(|g| {
            g.get("name")
                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                .as_deref()
                == Some(GROUP)
        });
        let int = |k: &str| {
            group
                .and_then(|g| g.get(k))
                .and_then(|v| redis::from_redis_value_ref::<u64>(v).ok())
        };
        Ok((int("pending").unwrap_or(0), int("lag")))
    }
}

fn entry(id: String, fields: Vec<String>, deliveries: u64) -> Entry {
    let mut e = Entry {
        id,
        scenario: String::new(),
        path: PathBuf::new(),
        toml: String::new(),
        deliveries,
    };
    for kv in fields.chunks(2) {
        if let [k, v] = kv {
            match k.as_str() {
                "scenario" => e.scenario = v.clone(),
                "path" => e.path = PathBuf::from(v),
                "toml" => e.toml = v.clone(),
                _ => {}
            }
        }
    }
    e
}

/// A stream id's order (`<ms>-<seq>`).
fn id_key(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

fn redis_err(url: &str, op: &'static str) -> impl FnOnce(redis::RedisError) -> QueueError {
    let url = url.to_string();
    move |source| QueueError::Redis { url, op, source }
}
