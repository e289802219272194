//! Connections of [`crate::RedisStore`]: a small pool of synchronous connections to one Redis
//! server or a Redis Cluster (detected at the first connection), reconnecting after an error,
//! and a key scan that visits every primary of a cluster.

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ConnectionLike, RedisResult, Value};

/// Idle connections kept for reuse; more may be open while many threads call at once.
const MAX_IDLE: usize = 8;

/// One connection, to a single server or to a cluster.
pub(crate) enum Conn {
    Single(redis::Connection),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    /// Runs one command (keys of a multi-key command must share a hash slot in a cluster).
    pub fn query<T: redis::FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query(c),
            Conn::Cluster(c) => cmd.query(c.as_mut()),
        }
    }

    /// Names of the keys matching `pattern` (a Redis glob), on every primary of a cluster.
    /// SCAN may return a name twice; callers deduplicate.
    pub fn scan(&mut self, pattern: &str) -> RedisResult<Vec<Vec<u8>>> {
        match self {
            Conn::Single(c) => scan_node(pattern, |cmd| cmd.query(c)),
            Conn::Cluster(c) => {
                let mut out = Vec::new();
                for (host, port) in primaries(c)? {
                    let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    out.extend(scan_node(pattern, |cmd| {
                        Ok(redis::from_redis_value(c.route_command(cmd, to.clone())?)?)
                    })?);
                }
                Ok(out)
            }
        }
    }

    /// Runs `cmd` on the server, or on every primary of a cluster: `(node, reply)`, the node as
    /// `host:port` (`None` for a single server).
    pub fn on_each_primary<T: redis::FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<Vec<(Option<String>, T)>> {
        match self {
            Conn::Single(c) => Ok(vec![(None, cmd.query(c)?)]),
            Conn::Cluster(c) => {
                let mut out = Vec::new();
                for (host, port) in primaries(c)? {
                    let node = format!("{host}:{port}");
                    let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    out.push((Some(node), redis::from_redis_value(c.route_command(cmd, to)?)?));
                }
                Ok(out)
            }
        }
    }
}

/// SCAN with MATCH on one node until the cursor returns to 0.
fn scan_node(
    pattern: &str,
    mut run: impl FnMut(&Cmd) -> RedisResult<(u64, Vec<Vec<u8>>)>,
) -> RedisResult<Vec<Vec<u8>>> {
    let (mut cursor, mut out) = (0u64, Vec::new());
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000);
        let (next, names) = run(&cmd)?;
        out.extend(names);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

/// (host, port) of every primary, from CLUSTER SLOTS: `[[start, end, [host, port, id, ..], replicas..], ..]`.
fn primaries(c: &mut ClusterConnection) -> RedisResult<Vec<(String, u16)>> {
    let slots = c.route_command(
        &redis::cmd("CLUSTER").arg("SLOTS").clone(),
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
    )?;
    let bad = || redis::RedisError::from((redis::ErrorKind::Parse, "unexpected CLUSTER SLOTS reply"));
    let Value::Array(ranges) = slots else { return Err(bad()) };
    let mut out: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else { return Err(bad()) };
        let Some(Value::Array(node)) = fields.get(2) else {
            return Err(bad());
        };
        let host: String = redis::from_redis_value_ref(node.first().ok_or_else(bad)?)?;
        let port: u16 = redis::from_redis_value_ref(node.get(1).ok_or_else(bad)?)?;
        if !out.iter().any(|(h, p)| *h == host && *p == port) {
            out.push((host, port));
        }
    }
    Ok(out)
}

/// How the server answered the first connection.
enum Mode {
    Single,
    Cluster(Box<ClusterClient>),
}

/// A pool of connections to `url`, connecting lazily.
pub(crate) struct Pool {
    client: redis::Client,
    timeout: Duration,
    mode: OnceLock<Mode>,
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    /// A pool for `url` (parsed now; nothing connects until the first command). A `rediss://`
    /// URL connects over TLS, trusting `tls_ca` (PEM) when given, else the system's roots.
    pub fn new(url: &str, tls_ca: Option<Vec<u8>>, timeout: Duration) -> RedisResult<Pool> {
        let client = if url.starts_with("rediss://") || url.starts_with("valkeys://") {
            // rustls needs a process-wide crypto provider; ours is ring (a no-op if one is set).
            let _ = rustls::crypto::ring::default_provider().install_default();
            let certs = redis::TlsCertificates {
                client_tls: None,
                root_cert: tls_ca,
            };
            redis::Client::build_with_tls(url, certs)?
        } else {
            redis::Client::open(url)?
        };
        Ok(Pool {
            client,
            timeout,
            mode: OnceLock::new(),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Whether the server is a Redis Cluster (`None` until a connection succeeded).
    pub fn is_cluster(&self) -> Option<bool> {
        self.mode.get().map(|m| matches!(m, Mode::Cluster(_)))
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Conn>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn connect(&self) -> RedisResult<Conn> {
        if let Some(Mode::Cluster(client)) = self.mode.get() {
            return self.cluster_conn(client);
        }
        let c = self.client.get_connection_with_timeout(self.timeout)?;
        c.set_read_timeout(Some(self.timeout))?;
        c.set_write_timeout(Some(self.timeout))?;
        let mut c = Conn::Single(c);
        if self.mode.get().is_none() {
            let info: String = c.query(redis::cmd("INFO").arg("cluster"))?;
            let mode = if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
                let client = ClusterClient::builder([self.client.get_connection_info().clone()])
                    .connection_timeout(self.timeout)
                    .response_timeout(self.timeout)
                    .retries(2)
                    .build()?;
                Mode::Cluster(Box::new(client))
            } else {
                Mode::Single
            };
            let _ = self.mode.set(mode);
            if let Some(Mode::Cluster(client)) = self.mode.get() {
                tracing::debug!("redis: the server is a Redis Cluster");
                c = self.cluster_conn(client)?;
            }
        }
        Ok(c)
    }

    fn cluster_conn(&self, client: &ClusterClient) -> RedisResult<Conn> {
        let c = client.get_connection()?;
        c.set_read_timeout(Some(self.timeout))?;
        c.set_write_timeout(Some(self.timeout))?;
        Ok(Conn::Cluster(Box::new(c)))
    }

    /// Runs `f` on a pooled connection. A connection that failed is dropped; when a pooled one
    /// fails with a connection error (the server restarted, the socket went stale) every idle
    /// connection is dropped and `f` runs once more on a fresh one, so `f` must be idempotent.
    pub fn run<T>(&self, mut f: impl FnMut(&mut Conn) -> RedisResult<T>) -> RedisResult<T> {
        let pooled = self.lock().pop();
        let was_pooled = pooled.is_some();
        let mut c = match pooled {
            Some(c) => c,
            None => self.connect()?,
        };
        match f(&mut c) {
            Ok(v) => {
                self.give_back(c);
                Ok(v)
            }
            Err(e) if was_pooled && is_connection_error(&e) => {
                self.lock().clear();
                let mut c = self.connect()?;
                let v = f(&mut c)?;
                self.give_back(c);
                Ok(v)
            }
            Err(e) => {
                if !is_connection_error(&e) && e.kind() != redis::ErrorKind::Parse {
                    // A server's error reply (e.g. OOM) leaves the connection in sync.
                    self.give_back(c);
                }
                Err(e)
            }
        }
    }

    fn give_back(&self, c: Conn) {
        let open = match &c {
            Conn::Single(c) => c.is_open(),
            Conn::Cluster(c) => c.is_open(),
        };
        let mut idle = self.lock();
        if open && idle.len() < MAX_IDLE {
            idle.push(c);
        }
    }
}

fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error()
}

/// `url` with any password replaced by `***` (for messages and logs).
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some((auth, host)) => (auth, host),
        None => return url.to_string(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://{auth}@{host}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_redacted() {
        assert_eq!(super::redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(super::redact("redis://:secret@h"), "redis://:***@h");
        assert_eq!(super::redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(super::redact("redis://u@h"), "redis://u@h");
    }
}
