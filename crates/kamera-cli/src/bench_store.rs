//! `kamera bench store`: put and get latency and throughput of one real chunk record (the
//! model's prefill of a 1024-token chunk, as the runtime stores it) on Redis, sled and a plain
//! file, against re-prefilling that chunk, measured in one run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use clap::{Args, ValueEnum};
use kamera_model::Model;
use kamera_ops::{Bases, DType};
use kamera_store::{ChunkId, ChunkStore, Key, ModelFp, Record, RedisConfig, RedisStore, SledStore, StoreConfig, codec};
use serde::Serialize;

use crate::bench_session_report::percentile;

#[derive(Args)]
pub struct StoreBenchArgs {
    /// Model name or path to a .gguf file (its prefill makes the record).
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
    /// Tokens of the chunk.
    #[arg(long, default_value_t = 1024)]
    chunk_tokens: usize,
    /// Timed puts per store.
    #[arg(long, default_value_t = 20)]
    puts: usize,
    /// Timed gets per store.
    #[arg(long, default_value_t = 50)]
    gets: usize,
    /// Timed prefills of the chunk.
    #[arg(long, default_value_t = 3)]
    prefills: usize,
    /// Storage type of the record: f32 (what `kamera run` keeps) or bf16 (the stores' default).
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Dtype,
    /// A Redis server to measure (records go under a prefix of their own and are removed at the
    /// end). Without it the bench starts its own redis-server on a free loopback port.
    #[arg(long, value_name = "redis://URL")]
    redis: Option<String>,
    /// Where to write the JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Dtype {
    F32,
    Bf16,
}

/// Shape of one run.
#[derive(Debug, Clone)]
pub struct StoreBenchConfig {
    pub chunk_tokens: usize,
    pub puts: usize,
    pub gets: usize,
    pub prefills: usize,
    pub dtype: DType,
}

/// Latency percentiles of `n` timed calls, and the record's bytes over the mean time.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub n: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    /// Encoded record bytes per second of the mean call, in MB/s (1e6 bytes).
    pub mb_s: f64,
}

impl Latency {
    fn of(ms: Vec<f64>, bytes: u64) -> Latency {
        let mean_ms = ms.iter().sum::<f64>() / ms.len().max(1) as f64;
        Latency {
            n: ms.len(),
            p50_ms: percentile(ms.clone(), 0.5),
            p99_ms: percentile(ms, 0.99),
            mean_ms,
            mb_s: bytes as f64 / 1e3 / mean_ms,
        }
    }
}

/// One store's figures.
#[derive(Debug, Clone, Serialize)]
pub struct StoreRow {
    pub store: String,
    /// `put` as the runtime calls it: encode + write, no flush or fsync.
    pub put: Latency,
    /// `get`: read + verify (checksum) + decode.
    pub get: Latency,
    /// Re-prefill p50 / get p50: how much faster a hit is than encoding the chunk again.
    pub prefill_over_get: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct StoreBench {
    pub model: String,
    pub chunk_tokens: usize,
    pub dtype: String,
    /// Encoded bytes of the record.
    pub record_bytes: u64,
    /// Where Redis ran.
    pub redis: String,
    pub prefill: Latency,
    pub rows: Vec<StoreRow>,
}

impl StoreBench {
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "## kamera bench store: {}, one {}-token chunk, {} record of {:.1} MB\n\n\
             | | put p50 ms | put p99 ms | put MB/s | get p50 ms | get p99 ms | get MB/s | re-prefill / get (p50) |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
            self.model,
            self.chunk_tokens,
            self.dtype,
            self.record_bytes as f64 / 1e6
        );
        for r in &self.rows {
            s += &format!(
                "| {} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} | {:.1}x |\n",
                r.store,
                r.put.p50_ms,
                r.put.p99_ms,
                r.put.mb_s,
                r.get.p50_ms,
                r.get.p99_ms,
                r.get.mb_s,
                r.prefill_over_get
            );
        }
        let p = &self.prefill;
        s += &format!(
            "| re-prefill ({} runs) | | | | {:.1} | {:.1} | | 1x |\n\n\
             {} puts and {} gets per store over 4 keys (overwrites), after one untimed put of each; \
             Redis: {}. No flush or fsync in a put.\n",
            p.n,
            p.p50_ms,
            p.p99_ms,
            self.rows.first().map_or(0, |r| r.put.n),
            self.rows.first().map_or(0, |r| r.get.n),
            self.redis
        );
        s
    }
}

/// Keys the bench writes in turn (overwriting), so a run holds at most 4 records per store.
const RING: u8 = 4;

/// Measures `model`'s chunk on Redis (at `redis_url`, or on a redis-server started here), sled
/// and a plain file in a temporary directory, and re-prefilling it.
pub fn bench_store(model: &Model, name: &str, cfg: &StoreBenchConfig, redis_url: Option<&str>) -> Result<StoreBench> {
    ensure!(
        cfg.chunk_tokens > 0 && cfg.puts > 0 && cfg.gets > 0 && cfg.prefills > 0,
        "bench store: chunk tokens, puts, gets and prefills must be at least 1, got {cfg:?}"
    );
    let ids = crate::bench::tokens(model, cfg.chunk_tokens)?;
    let (mut prefill_ms, mut chunk) = (Vec::new(), None);
    for _ in 0..cfg.prefills {
        let t = Instant::now();
        let p = model.prefill(&ids, 0, &model.empty_context())?;
        prefill_ms.push(ms(t));
        chunk = Some(p.chunk);
    }
    let chunk = chunk.context("no prefill ran")?;
    let fp = ModelFp::of(model.fingerprint());
    let keys: Vec<Key> = (0..RING)
        .map(|i| Key::canonical(fp, ChunkId::of(&[i], "kamera-bench-store", fp)))
        .collect();
    let cost_us = (percentile(prefill_ms.clone(), 0.5) * 1e3) as u64;
    let record = Record::kv(fp, cost_us, chunk);
    let dtype = Some(cfg.dtype);
    let encoded = codec::encode(&keys[0], &record, dtype)?;
    let record_bytes = encoded.len() as u64;
    // What every store must give back: the record as its encoding holds it.
    let expected = codec::decode(&keys[0], &encoded, &Bases::new())?;
    drop(encoded);

    let _server;
    let (url, redis_where) = match redis_url {
        Some(u) => (u.to_string(), "given by --redis".to_string()),
        None => {
            let srv = crate::redis_server::RedisServer::start(&[])
                .context("bench store starts its own redis-server when no --redis URL is given")?;
            let url = srv.url();
            _server = srv;
            (url, "a redis-server on loopback started by the bench".to_string())
        }
    };
    let redis = RedisStore::open(RedisConfig {
        prefix: format!("kamera-bench-{}", std::process::id()),
        dtype,
        ..RedisConfig::at(url.as_str())
    })?;
    redis.ping().context("bench store: Redis does not answer")?;
    let dir = tempfile::tempdir()?;
    let sled = SledStore::open(StoreConfig {
        dtype,
        ..StoreConfig::at(dir.path().join("sled"))
    })?;
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files)?;

    let run = Run {
        cfg,
        keys: &keys,
        record: &record,
        expected: &expected,
        bytes: record_bytes,
        prefill_p50: percentile(prefill_ms.clone(), 0.5),
    };
    let rows = vec![
        run.store("redis", |k, r| Ok(redis.put(k, r)?), |k| Ok(redis.get(k)?))?,
        run.store("sled", |k, r| Ok(sled.put(k, r)?), |k| Ok(sled.get(k)?))?,
        run.store(
            "plain file",
            |k, r| file_put(&files, k, &r, dtype),
            |k| file_get(&files, k),
        )?,
    ];
    for k in &keys {
        redis.remove(k)?;
    }
    Ok(StoreBench {
        model: name.to_string(),
        chunk_tokens: cfg.chunk_tokens,
        dtype: format!("{:?}", cfg.dtype).to_lowercase(),
        record_bytes,
        redis: redis_where,
        prefill: Latency::of(prefill_ms, record_bytes),
        rows,
    })
}

/// What one store is measured with.
struct Run<'a> {
    cfg: &'a StoreBenchConfig,
    keys: &'a [Key],
    record: &'a Record,
    expected: &'a Record,
    bytes: u64,
    prefill_p50: f64,
}

impl Run<'_> {
    fn store(
        &self,
        name: &str,
        mut put: impl FnMut(&Key, Record) -> Result<()>,
        mut get: impl FnMut(&Key) -> Result<Option<Arc<Record>>>,
    ) -> Result<StoreRow> {
        for k in self.keys {
            put(k, self.record.clone())?;
        }
        let mut put_ms = Vec::with_capacity(self.cfg.puts);
        for i in 0..self.cfg.puts {
            let r = self.record.clone(); // outside the timing
            let t = Instant::now();
            put(&self.keys[i % self.keys.len()], r)?;
            put_ms.push(ms(t));
        }
        let mut get_ms = Vec::with_capacity(self.cfg.gets);
        for i in 0..self.cfg.gets {
            let k = &self.keys[i % self.keys.len()];
            let t = Instant::now();
            let got = get(k)?.with_context(|| format!("{name}: record {k} missing after its put"))?;
            get_ms.push(ms(t));
            ensure!(
                i >= self.keys.len() || *got == *self.expected,
                "{name}: record {k} read back differs from what was put"
            );
        }
        let get = Latency::of(get_ms, self.bytes);
        Ok(StoreRow {
            store: name.to_string(),
            put: Latency::of(put_ms, self.bytes),
            prefill_over_get: self.prefill_p50 / get.p50_ms,
            get,
        })
    }
}

fn file_path(dir: &Path, key: &Key) -> PathBuf {
    dir.join(format!("{}.kmr", key.to_hex()))
}

fn file_put(dir: &Path, key: &Key, record: &Record, dtype: Option<DType>) -> Result<()> {
    let bytes = codec::encode(key, record, dtype)?;
    let path = file_path(dir, key);
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn file_get(dir: &Path, key: &Key) -> Result<Option<Arc<Record>>> {
    let path = file_path(dir, key);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(Arc::new(codec::decode(key, &bytes, &Bases::new())?)))
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

pub fn run(a: StoreBenchArgs) -> Result<()> {
    let model = crate::models::load(&a.model)?;
    let cfg = StoreBenchConfig {
        chunk_tokens: a.chunk_tokens,
        puts: a.puts,
        gets: a.gets,
        prefills: a.prefills,
        dtype: match a.dtype {
            Dtype::F32 => DType::F32,
            Dtype::Bf16 => DType::Bf16,
        },
    };
    let r = bench_store(&model, &a.model, &cfg, a.redis.as_deref())?;
    print!("{}", r.markdown());
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench itself, tiny, on SmolLM2: every store reads back what was put, every figure is
    /// a positive number, reading a chunk back beats re-prefilling it on every store (the
    /// README's claim, 45x-217x at 1024 tokens; only the direction at 16), and the table names
    /// each store.
    #[test]
    fn bench_store_runs_on_every_store() -> Result<()> {
        let model = crate::models::load("smollm2-135m")?;
        let cfg = StoreBenchConfig {
            chunk_tokens: 16,
            puts: 2,
            gets: 5,
            prefills: 1,
            dtype: DType::Bf16,
        };
        let r = bench_store(&model, "smollm2-135m", &cfg, None)?;
        let stores: Vec<&str> = r.rows.iter().map(|r| r.store.as_str()).collect();
        assert_eq!(stores, ["redis", "sled", "plain file"]);
        // SmolLM2-135M: 30 layers, 3 KV heads x 64, K and V, bf16, 16 tokens, + 96 header/sum.
        assert_eq!(r.record_bytes, 30 * 2 * 16 * 192 * 2 + 96);
        for row in &r.rows {
            assert_eq!((row.put.n, row.get.n), (2, 5));
            for x in [
                row.put.p50_ms,
                row.put.p99_ms,
                row.get.p50_ms,
                row.get.mb_s,
                row.prefill_over_get,
            ] {
                assert!(x.is_finite() && x > 0.0, "{row:?}");
            }
            assert!(row.put.p99_ms >= row.put.p50_ms && row.get.p99_ms >= row.get.p50_ms);
            eprintln!("{}: re-prefill / get {:.1}x", row.store, row.prefill_over_get);
            assert!(
                row.prefill_over_get > 1.0,
                "{}: a get is no faster than a re-prefill: {row:?}",
                row.store
            );
        }
        let md = r.markdown();
        assert!(
            md.contains("| plain file |") && md.contains("re-prefill (1 runs)"),
            "{md}"
        );
        Ok(())
    }
}
