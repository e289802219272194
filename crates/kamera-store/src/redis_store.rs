//! `RedisStore`: records in Redis (one server or a Redis Cluster), shared by a fleet. A record
//! is a manifest key, published by one SET after its pieces, so a reader never sees half a
//! record; bytes use the sled store's encoding (`codec`) and are verified on every read.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kamera_ops::{Bases, DType};

use crate::codec;
use crate::error::{Error, Result};
use crate::id::{Key, ModelFp};
use crate::record::Record;
use crate::redis_conn::{Conn, Pool, redact};
use crate::redis_manifest::{HEADER_LEN, Layout, Manifest};
use crate::store::{ChunkStore, Counters, Stats};

/// Redis' largest string value.
const MAX_VALUE: usize = 512 << 20;

/// Settings of a [`RedisStore`].
#[derive(Clone, PartialEq)]
pub struct RedisConfig {
    /// `redis://[user][:password@]host[:port][/db]`, or `rediss://…` for TLS; a Redis Cluster is
    /// detected from any of its nodes.
    pub url: String,
    /// With `rediss://`: a PEM file of the CA certificate(s) to trust instead of the system's
    /// roots (a private CA, or a self-signed server certificate). The server is always verified.
    pub tls_ca: Option<PathBuf>,
    /// Namespace of every key (`{prefix}:{model}:{{key}}`); stores with different prefixes never
    /// see each other's records. No `{ } * ? [ ] \` or whitespace.
    pub prefix: String,
    /// Expiry of every record (manifest and pieces); `None` keeps records until Redis evicts
    /// them (`maxmemory-policy`, see the README).
    pub ttl: Option<Duration>,
    /// Records larger than this are written as pieces of this many bytes. Default 4 MiB.
    pub piece_bytes: usize,
    /// Connect, read and write timeout of every command.
    pub timeout: Duration,
    /// Storage dtype of payloads (`None` keeps each record's own). Default bf16, as on disk.
    pub dtype: Option<DType>,
    /// The patch bases transform-coded records are decoded in, as
    /// [`StoreConfig::bases`](crate::StoreConfig::bases). Default none.
    pub bases: Bases,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379/".into(),
            tls_ca: None,
            prefix: "kamera".into(),
            ttl: None,
            piece_bytes: 4 << 20,
            timeout: Duration::from_secs(5),
            dtype: Some(DType::Bf16),
            bases: Bases::new(),
        }
    }
}

impl RedisConfig {
    /// The defaults, at `url`.
    pub fn at(url: impl Into<String>) -> RedisConfig {
        RedisConfig {
            url: url.into(),
            ..RedisConfig::default()
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("tls_ca", &self.tls_ca)
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .field("piece_bytes", &self.piece_bytes)
            .field("timeout", &self.timeout)
            .field("dtype", &self.dtype)
            .field("bases", &self.bases)
            .finish()
    }
}

/// A [`ChunkStore`] in Redis. Connects lazily: `open` checks the settings only, so a process can
/// start while Redis is down ([`RedisStore::ping`] checks the server).
///
/// ```no_run
/// use kamera_store::{ChunkStore, Layered, RedisConfig, RedisStore, SledStore, StoreConfig};
/// let redis = RedisStore::open(RedisConfig {
///     prefix: "fleet-a".into(),
///     ttl: Some(std::time::Duration::from_secs(24 * 3600)),
///     ..RedisConfig::at("redis://:secret@cache.internal:6379/0")
/// })?;
/// redis.ping()?;
/// // Local disk first, Redis behind it; a Redis outage degrades to the disk tier.
/// let store = Layered::new(SledStore::open_default()?, redis);
/// # Ok::<(), kamera_store::Error>(())
/// ```
pub struct RedisStore {
    pub(crate) cfg: RedisConfig,
    url: String,
    pub(crate) pool: Pool,
    counters: Counters,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("prefix", &self.cfg.prefix)
            .finish()
    }
}

impl RedisStore {
    /// Checks `cfg` and prepares the client (no connection yet).
    pub fn open(cfg: RedisConfig) -> Result<RedisStore> {
        const OP: &str = "RedisStore::open";
        let url = redact(&cfg.url);
        let invalid = |what, detail: String| Error::Invalid { op: OP, what, detail };
        let scheme = cfg.url.split_once("://").map_or("", |(s, _)| s);
        let tls = matches!(scheme, "rediss" | "valkeys");
        let tls_ca = match &cfg.tls_ca {
            Some(path) if !tls => {
                return Err(invalid(
                    "tls_ca",
                    format!("{} is given, but {url} is not a rediss:// URL", path.display()),
                ));
            }
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                invalid(
                    "tls_ca",
                    format!("{}: {e} (a PEM file of CA certificates)", path.display()),
                )
            })?),
            None => None,
        };
        if cfg.prefix.is_empty()
            || cfg.prefix.len() > 256
            || cfg
                .prefix
                .chars()
                .any(|c| !c.is_ascii_graphic() || "{}*?[]\\".contains(c))
        {
            return Err(invalid(
                "prefix",
                format!(
                    "{:?}: 1 to 256 printable ASCII characters without {{ }} * ? [ ] \\",
                    cfg.prefix
                ),
            ));
        }
        if cfg.piece_bytes == 0 || cfg.piece_bytes > MAX_VALUE - HEADER_LEN {
            return Err(invalid(
                "piece_bytes",
                format!("{}: 1 to {} bytes", cfg.piece_bytes, MAX_VALUE - HEADER_LEN),
            ));
        }
        if cfg.timeout.is_zero() || cfg.ttl.is_some_and(|t| t.as_millis() == 0) {
            return Err(invalid(
                "timeout",
                format!(
                    "timeout {:?}, ttl {:?}: both must be at least 1 ms",
                    cfg.timeout, cfg.ttl
                ),
            ));
        }
        let pool = Pool::new(&cfg.url, tls_ca, cfg.timeout).map_err(|e| invalid("url", format!("{url}: {e}")))?;
        Ok(RedisStore {
            cfg,
            url,
            pool,
            counters: Counters::default(),
        })
    }

    pub fn config(&self) -> &RedisConfig {
        &self.cfg
    }

    /// The server URL with any password replaced by `***` (for messages).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Checks that the server answers (connecting if needed).
    pub fn ping(&self) -> Result<()> {
        self.pool
            .run(|c| c.query::<String>(&redis::cmd("PING")))
            .map(drop)
            .map_err(|e| self.err("ping", "PING", e))
    }

    /// Whether the server is a Redis Cluster; `None` before the first connection.
    pub fn is_cluster(&self) -> Option<bool> {
        self.pool.is_cluster()
    }

    /// The Redis key of `key`'s manifest: `{prefix}:{model hex}:{{key hex}}`. Its pieces are
    /// `{manifest}:{generation}:{i}`; the braces (a Redis Cluster hash tag) keep them on the
    /// manifest's slot.
    pub fn manifest_key(&self, key: &Key) -> String {
        format!("{}:{}:{{{}}}", self.cfg.prefix, key.model, key.to_hex())
    }

    pub(crate) fn piece_keys(manifest: &str, m: &Manifest) -> Vec<String> {
        let count = match m.layout {
            Layout::Inline => 0,
            Layout::Pieces { count, .. } => count,
        };
        let generation = m.generation();
        (0..count).map(|i| format!("{manifest}:{generation}:{i}")).collect()
    }

    /// The record key named by a manifest key of this prefix, or `None` for any other name.
    pub(crate) fn parse_name(&self, name: &[u8]) -> Option<Key> {
        let name = std::str::from_utf8(name).ok()?;
        let rest = name.strip_prefix(self.cfg.prefix.as_str())?.strip_prefix(':')?;
        let (model, rest) = rest.split_once(':')?;
        let hex = rest.strip_prefix('{')?.strip_suffix('}')?;
        let key = Key::from_hex(hex).ok()?;
        (key.model.to_string() == model).then_some(key)
    }

    pub(crate) fn err(&self, op: &'static str, key: impl fmt::Display, source: redis::RedisError) -> Error {
        Error::Redis {
            op,
            url: self.url.clone(),
            key: key.to_string(),
            source,
        }
    }

    fn ttl_ms(&self) -> Option<u64> {
        self.cfg.ttl.map(|t| t.as_millis().clamp(1, u64::MAX as u128) as u64)
    }

    /// Stores already-encoded record bytes under `key` as they are (tests, import): pieces
    /// first, then the manifest that publishes them, then the previous version's pieces go.
    pub fn put_raw(&self, key: &Key, bytes: &[u8]) -> Result<()> {
        let m = Manifest::of(bytes, self.cfg.piece_bytes)?;
        let header = m.header(&self.cfg.prefix, key);
        let name = self.manifest_key(key);
        let pieces = RedisStore::piece_keys(&name, &m);
        let ttl = self.ttl_ms();
        let prefix = self.cfg.prefix.as_str();
        self.pool
            .run(|c| {
                let old = old_manifest(c, prefix, key, &name)?;
                let value = if pieces.is_empty() {
                    [&header[..], bytes].concat()
                } else {
                    for (p, chunk) in pieces.iter().zip(bytes.chunks(self.cfg.piece_bytes)) {
                        set(c, p, chunk, ttl)?;
                    }
                    header.to_vec()
                };
                // One SET publishes the record: readers see the old version or the new one.
                set(c, &name, &value, ttl)?;
                if let Some(old) = old {
                    let stale: Vec<String> = RedisStore::piece_keys(&name, &old)
                        .into_iter()
                        .filter(|p| !pieces.contains(p))
                        .collect();
                    if !stale.is_empty() {
                        c.query::<i64>(redis::cmd("DEL").arg(&stale))?;
                    }
                }
                Ok(())
            })
            .map_err(|e| self.err("put", key, e))?;
        Counters::add(&self.counters.puts, 1);
        Counters::add(&self.counters.bytes_written, bytes.len() as u64);
        Ok(())
    }

    /// The encoded record of `key` from its manifest value, reading the pieces it names.
    pub(crate) fn assemble(&self, key: &Key, name: &str, mut value: Vec<u8>) -> Result<Vec<u8>> {
        const OP: &str = "get";
        let m = Manifest::parse(&self.cfg.prefix, key, &value)?;
        let bytes = match m.layout {
            Layout::Inline => value.split_off(HEADER_LEN),
            Layout::Pieces { count, .. } => {
                if value.len() != HEADER_LEN {
                    return Err(Error::corrupt(OP, key, "a piece manifest with inline bytes"));
                }
                let names = RedisStore::piece_keys(name, &m);
                let pieces: Vec<Option<Vec<u8>>> = self
                    .pool
                    .run(|c| c.query(redis::cmd("MGET").arg(&names)))
                    .map_err(|e| self.err(OP, key, e))?;
                let mut out = Vec::with_capacity(m.record_len.min(MAX_VALUE as u64 * 4) as usize);
                for (i, p) in pieces.into_iter().enumerate() {
                    let Some(p) = p else {
                        return Err(Error::Incomplete {
                            op: OP,
                            key: key.to_string(),
                            detail: format!(
                                "piece {i} of {count} is missing (evicted or expired before its \
                                 manifest, or removed while being read)"
                            ),
                        });
                    };
                    Counters::add(&self.counters.bytes_read, p.len() as u64);
                    if p.len() as u64 != m.piece_len(i as u32) {
                        let detail = format!("piece {i} has {} bytes, expected {}", p.len(), m.piece_len(i as u32));
                        return Err(Error::corrupt(OP, key, detail));
                    }
                    out.extend_from_slice(&p);
                }
                out
            }
        };
        if bytes.len() as u64 != m.record_len || !bytes.ends_with(&m.record_sum) {
            let detail = format!("{} bytes do not match the manifest's record", bytes.len());
            return Err(Error::corrupt(OP, key, detail));
        }
        Ok(bytes)
    }

    /// Manifest names of this prefix (of one model or all), listed by SCAN (on every primary of
    /// a cluster), with their record keys, in key order. Names are parsed strictly, so another
    /// prefix's keys are never listed.
    pub(crate) fn manifests(&self, model: Option<ModelFp>) -> Result<Vec<(String, Key)>> {
        let pattern = match model {
            Some(m) => format!("{}:{m}:{{*}}", self.cfg.prefix),
            None => format!("{}:*:{{*}}", self.cfg.prefix),
        };
        let names = self
            .pool
            .run(|c| c.scan(&pattern))
            .map_err(|e| self.err("keys", &pattern, e))?;
        let mut keys: Vec<Key> = names
            .iter()
            .filter_map(|n| self.parse_name(n))
            .filter(|k| model.is_none_or(|m| k.model == m))
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys.into_iter().map(|k| (self.manifest_key(&k), k)).collect())
    }

    /// The encoded record of `key` (manifest, then its pieces), not yet decoded: `None` when no
    /// manifest is there; a damaged manifest or a missing piece is an error (`is_miss`).
    pub(crate) fn fetch(&self, key: &Key) -> Result<Option<Vec<u8>>> {
        let name = self.manifest_key(key);
        let value: Option<Vec<u8>> = self
            .pool
            .run(|c| c.query(redis::cmd("GET").arg(&name)))
            .map_err(|e| self.err("get", key, e))?;
        let Some(value) = value else { return Ok(None) };
        Counters::add(&self.counters.bytes_read, value.len() as u64);
        self.assemble(key, &name, value).map(Some)
    }
}

fn set(c: &mut Conn, name: &str, value: &[u8], ttl_ms: Option<u64>) -> redis::RedisResult<()> {
    let mut cmd = redis::cmd("SET");
    cmd.arg(name).arg(value);
    if let Some(ms) = ttl_ms {
        cmd.arg("PX").arg(ms);
    }
    c.query(&cmd)
}

/// The manifest under `name` as it was (header bytes only), if it verifies.
fn old_manifest(c: &mut Conn, prefix: &str, key: &Key, name: &str) -> redis::RedisResult<Option<Manifest>> {
    let head: Vec<u8> = c.query(redis::cmd("GETRANGE").arg(name).arg(0).arg(HEADER_LEN - 1))?;
    Ok(Manifest::parse(prefix, key, &head).ok())
}

impl ChunkStore for RedisStore {
    fn get(&self, key: &Key) -> Result<Option<Arc<Record>>> {
        let Some(bytes) = self.fetch(key).inspect_err(|e| self.counters.count_err(e))? else {
            Counters::add(&self.counters.misses, 1);
            return Ok(None);
        };
        match codec::decode(key, &bytes, &self.cfg.bases) {
            Ok(r) => {
                Counters::add(&self.counters.remote_hits, 1);
                Ok(Some(Arc::new(r)))
            }
            Err(e) => {
                self.counters.count_err(&e);
                Err(e)
            }
        }
    }

    fn put(&self, key: &Key, record: Record) -> Result<()> {
        record.check_model(key)?;
        self.put_raw(key, &codec::encode(key, &record, self.cfg.dtype)?)
    }

    fn contains(&self, key: &Key) -> Result<bool> {
        let name = self.manifest_key(key);
        let n: i64 = self
            .pool
            .run(|c| c.query(redis::cmd("EXISTS").arg(&name)))
            .map_err(|e| self.err("contains", key, e))?;
        Ok(n > 0)
    }

    fn remove(&self, key: &Key) -> Result<bool> {
        let name = self.manifest_key(key);
        let prefix = self.cfg.prefix.as_str();
        let had = self
            .pool
            .run(|c| {
                let old = old_manifest(c, prefix, key, &name)?;
                // The manifest first: from here on no reader is sent to the pieces.
                let n: i64 = c.query(redis::cmd("DEL").arg(&name))?;
                if let Some(old) = old.filter(|m| m.layout != Layout::Inline) {
                    c.query::<i64>(redis::cmd("DEL").arg(RedisStore::piece_keys(&name, &old)))?;
                }
                Ok(n > 0)
            })
            .map_err(|e| self.err("remove", key, e))?;
        if had {
            Counters::add(&self.counters.removes, 1);
        }
        Ok(had)
    }

    fn keys(&self, model: Option<ModelFp>) -> Result<Vec<Key>> {
        Ok(self.manifests(model)?.into_iter().map(|(_, k)| k).collect())
    }

    /// Durability is the server's: with `appendonly yes` and `appendfsync always` every write
    /// that returned is on disk already, so there is nothing to do here.
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> Stats {
        self.counters.snapshot()
    }
}
