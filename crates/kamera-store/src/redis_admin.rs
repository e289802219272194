//! Maintenance of a [`RedisStore`] (`kamera store --store redis://… stats | verify | gc`): usage
//! by model and kind, a check of every record, and removal of damaged records and of orphan
//! pieces. Names are listed with SCAN (never KEYS), on every primary of a cluster. There is no
//! byte budget of ours on Redis: its `maxmemory` and `maxmemory-policy` decide what stays
//! ([`RedisStore::memory`] reports them).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::codec;
use crate::error::Result;
use crate::id::Key;
use crate::redis_manifest::{HEADER_LEN, Manifest};
use crate::redis_store::RedisStore;
use crate::report::{GcReport, Usage, VerifyReport};

/// Memory use and settings of one Redis server (of each primary of a cluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerMemory {
    /// `host:port` of a cluster primary; `None` for a single server.
    pub node: Option<String>,
    /// `used_memory`, bytes.
    pub used_bytes: u64,
    /// `maxmemory`, bytes; 0 is no limit.
    pub max_bytes: u64,
    /// `maxmemory_policy`, e.g. `allkeys-lru`.
    pub policy: String,
}

impl ServerMemory {
    /// Whether Redis evicts our records when full: `allkeys-*` policies do; `volatile-*` only
    /// evict keys with a TTL (`ttl`: the store writes with one); `noeviction` never does, and
    /// writes fail with OOM once `maxmemory` is reached.
    pub fn evicts(&self, ttl: bool) -> bool {
        self.policy.starts_with("allkeys-") || (ttl && self.policy.starts_with("volatile-"))
    }
}

/// Deletes the manifest `KEYS[1]` and the pieces `KEYS[2..]` (one hash slot) only if the
/// manifest still holds `ARGV[1]`: the bytes deleted, or -1 when a writer replaced it since.
const DELETE_IF_SAME: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local n = 0
for _, k in ipairs(KEYS) do n = n + redis.call('STRLEN', k) end
redis.call('DEL', unpack(KEYS))
return n
";

impl RedisStore {
    /// Records and encoded bytes by model and kind, from every manifest's header (SCAN, then
    /// GETRANGE of 56 bytes each: record bytes are not read). A manifest whose header does not
    /// verify is counted in `unreadable`.
    pub fn usage(&self) -> Result<Usage> {
        let (mut entries, mut unreadable) = (Vec::new(), 0);
        for (name, key) in self.manifests(None)? {
            match self.header(&name, &key)? {
                None => {} // removed or evicted since the scan
                Some(Ok(m)) => entries.push((key, m.record_len)),
                Some(Err(_)) => unreadable += 1,
            }
        }
        let mut usage = Usage::of(entries);
        usage.unreadable = unreadable;
        Ok(usage)
    }

    /// Reads, checks and decodes every record of this prefix; lists the unusable ones (damaged,
    /// incomplete, foreign model, unknown version) and counts orphan pieces.
    pub fn verify(&self) -> Result<VerifyReport> {
        let mut rep = VerifyReport::default();
        for (_, key) in self.manifests(None)? {
            let read = self.fetch(&key).and_then(|b| {
                b.map(|b| codec::check(&key, &b, &self.cfg.bases).map(|n| (b.len(), n)))
                    .transpose()
            });
            match read {
                Ok(None) => {} // removed or evicted since the scan
                Ok(Some((len, n))) => rep.healthy(key.kind, len as u64, n as u64),
                Err(e) if e.is_miss() => rep.bad.push((key.to_string(), e.to_string())),
                Err(e) => return Err(e),
            }
        }
        rep.orphan_pieces = self.orphans()?.values().map(|p| p.len() as u64).sum();
        Ok(rep)
    }

    /// Removes every unusable record (its manifest and the pieces it names, atomically and only
    /// if no writer replaced the manifest meanwhile), then every piece no manifest names. A
    /// piece may be orphaned only for a moment (written by a put that has not yet published its
    /// manifest), so an orphan is removed only if it is still one `grace` later.
    ///
    /// Records are never evicted here: Redis' `maxmemory-policy` is the byte budget.
    pub fn gc(&self, grace: Duration) -> Result<GcReport> {
        let mut rep = GcReport::default();
        for (name, key) in self.manifests(None)? {
            let value: Option<Vec<u8>> = self
                .pool
                .run(|c| c.query(redis::cmd("GET").arg(&name)))
                .map_err(|e| self.err("gc", key, e))?;
            let Some(value) = value else { continue };
            let why = match self
                .assemble(&key, &name, value.clone())
                .and_then(|b| codec::verify(&key, &b))
            {
                Ok(_) => continue,
                Err(e) if e.is_miss() => e,
                Err(e) => return Err(e),
            };
            let mut names = vec![name.clone()];
            if let Ok(m) = Manifest::parse(&self.cfg.prefix, &key, &value) {
                names.extend(RedisStore::piece_keys(&name, &m));
            }
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(DELETE_IF_SAME).arg(names.len()).arg(&names).arg(&value);
            let freed: i64 = self.pool.run(|c| c.query(&cmd)).map_err(|e| self.err("gc", key, e))?;
            if freed >= 0 {
                tracing::info!(%key, error = %why, "store gc: removed an unusable record from Redis");
                rep.removed_bad += 1;
                rep.freed_bytes += freed as u64;
            }
        }
        let mut orphans = self.orphans()?;
        if !orphans.is_empty() && !grace.is_zero() {
            std::thread::sleep(grace);
            let again = self.orphans()?;
            orphans.retain(|m, pieces| {
                let still = again.get(m);
                pieces.retain(|p| still.is_some_and(|s| s.contains(p)));
                !pieces.is_empty()
            });
        }
        for (manifest, pieces) in orphans {
            // One manifest's pieces share its hash slot: one node, one script.
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(DELETE_PIECES).arg(pieces.len()).arg(&pieces);
            let (n, freed): (u64, u64) = self
                .pool
                .run(|c| c.query(&cmd))
                .map_err(|e| self.err("gc", &manifest, e))?;
            rep.orphan_pieces += n;
            rep.freed_bytes += freed;
        }
        rep.remaining_bytes = self.usage()?.bytes();
        Ok(rep)
    }

    /// `INFO memory` of the server, or of every primary of a cluster: what bounds the store's
    /// bytes in Redis.
    pub fn memory(&self) -> Result<Vec<ServerMemory>> {
        let infos: Vec<(Option<String>, String)> = self
            .pool
            .run(|c| c.on_each_primary(redis::cmd("INFO").arg("memory")))
            .map_err(|e| self.err("memory", "INFO memory", e))?;
        Ok(infos
            .into_iter()
            .map(|(node, info)| {
                let field = |f: &str| {
                    info.lines()
                        .find_map(|l| l.trim().strip_prefix(f)?.strip_prefix(':'))
                        .unwrap_or("")
                        .to_string()
                };
                ServerMemory {
                    node,
                    used_bytes: field("used_memory").parse().unwrap_or(0),
                    max_bytes: field("maxmemory").parse().unwrap_or(0),
                    policy: field("maxmemory_policy"),
                }
            })
            .collect())
    }

    /// The manifest header under `name`: `None` when the key is gone, else whether it verifies.
    fn header(&self, name: &str, key: &Key) -> Result<Option<Result<Manifest>>> {
        let head: Vec<u8> = self
            .pool
            .run(|c| c.query(redis::cmd("GETRANGE").arg(name).arg(0).arg(HEADER_LEN - 1)))
            .map_err(|e| self.err("header", key, e))?;
        Ok((!head.is_empty()).then(|| Manifest::parse(&self.cfg.prefix, key, &head)))
    }

    /// Pieces of this prefix that no manifest names, by the manifest name they belong under.
    fn orphans(&self) -> Result<BTreeMap<String, BTreeSet<String>>> {
        let pattern = format!("{}:*:{{*}}:*:*", self.cfg.prefix);
        let names = self
            .pool
            .run(|c| c.scan(&pattern))
            .map_err(|e| self.err("gc", &pattern, e))?;
        let mut by: BTreeMap<String, (Key, BTreeSet<String>)> = BTreeMap::new();
        for n in &names {
            if let Some((manifest, key)) = self.parse_piece(n) {
                let piece = String::from_utf8_lossy(n).into_owned();
                by.entry(manifest)
                    .or_insert_with(|| (key, BTreeSet::new()))
                    .1
                    .insert(piece);
            }
        }
        let mut out = BTreeMap::new();
        for (manifest, (key, mut pieces)) in by {
            if let Some(Ok(m)) = self.header(&manifest, &key)? {
                for named in RedisStore::piece_keys(&manifest, &m) {
                    pieces.remove(&named);
                }
            }
            if !pieces.is_empty() {
                out.insert(manifest, pieces);
            }
        }
        Ok(out)
    }

    /// The manifest name and record key of a piece name of this prefix
    /// (`{manifest}:{generation, 16 hex}:{i}`), or `None` for any other name.
    fn parse_piece(&self, name: &[u8]) -> Option<(String, Key)> {
        let name = std::str::from_utf8(name).ok()?;
        let (rest, i) = name.rsplit_once(':')?;
        let (manifest, generation) = rest.rsplit_once(':')?;
        let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        if i.parse::<u32>().ok()?.to_string() != i || generation.len() != 16 || !generation.chars().all(hex) {
            return None;
        }
        let key = self.parse_name(manifest.as_bytes())?;
        Some((manifest.to_string(), key))
    }
}

/// Deletes the pieces `KEYS` (one hash slot): `{pieces deleted, bytes deleted}`.
const DELETE_PIECES: &str = r"
local n, bytes = 0, 0
for _, k in ipairs(KEYS) do
  local len = redis.call('STRLEN', k)
  n = n + redis.call('DEL', k)
  bytes = bytes + len
end
return {n, bytes}
";
