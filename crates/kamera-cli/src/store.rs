//! `kamera store stats | verify | gc`: the canonical store on disk (sled, `$KAMERA_HOME/store`)
//! or a fleet's Redis (`--store redis://…`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};
use kamera_store::{RedisConfig, RedisStore, SledStore, StoreConfig, Usage, VerifyReport, default_path};

#[derive(Args)]
pub struct StoreArgs {
    /// The store: a directory (the sled store) or a Redis URL
    /// (`redis://[user][:password@]host[:port][/db]`, any node of a cluster). Default
    /// `$KAMERA_HOME/store`, else `~/.cache/kamera/store`.
    #[arg(long, global = true, value_name = "PATH|redis://URL", conflicts_with = "path")]
    store: Option<String>,
    /// Store directory (the same as `--store PATH`).
    #[arg(long, global = true)]
    path: Option<PathBuf>,
    /// With a `rediss://` URL: PEM file of the CA certificate(s) to trust instead of the
    /// system's roots.
    #[arg(long, global = true, value_name = "PATH")]
    tls_ca: Option<PathBuf>,
    /// Key prefix of the records in Redis (`kamera run --store redis://…` writes under `kamera`).
    #[arg(long, global = true, default_value = "kamera")]
    prefix: String,
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Records and bytes by model and kind; size on disk, or Redis' memory and eviction policy.
    Stats,
    /// Decode and checksum every record; exit non-zero if any is damaged.
    Verify,
    /// Remove damaged records (and, on Redis, pieces no manifest names); on disk, then evict
    /// (cost-aware) down to a byte budget.
    Gc {
        /// Byte budget for the records on disk (encoded bytes); without it only damaged records
        /// go. Not for Redis, whose byte budget is its own `maxmemory` + `maxmemory-policy`.
        #[arg(long)]
        budget: Option<u64>,
        /// Redis: a piece no manifest names is removed only if it still is one this long later
        /// (a put in flight publishes its manifest right after its pieces).
        #[arg(long, default_value_t = 5000)]
        grace_ms: u64,
    },
}

/// The store a command works on.
// One value per process: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Target {
    Sled(SledStore),
    Redis(RedisStore),
}

/// Whether `s` names a Redis server rather than a directory.
fn is_redis_url(s: &str) -> bool {
    s.split_once("://")
        .is_some_and(|(scheme, _)| scheme.starts_with("redis") || scheme.starts_with("valkey"))
}

fn open(args: &StoreArgs) -> Result<(Target, String)> {
    match (&args.store, &args.path) {
        (Some(url), _) if is_redis_url(url) => {
            let cfg = RedisConfig {
                prefix: args.prefix.clone(),
                tls_ca: args.tls_ca.clone(),
                ..RedisConfig::at(url.as_str())
            };
            let store = RedisStore::open(cfg).context("--store")?;
            store.ping().context("--store: the Redis server does not answer")?;
            let what = format!("redis {} prefix {}", store.url(), args.prefix);
            Ok((Target::Redis(store), what))
        }
        (Some(s), _) if s.contains("://") => {
            bail!("--store {s}: not a directory and not a redis:// URL (the stores are sled on disk and Redis)")
        }
        (store, path) => {
            let path = store
                .as_ref()
                .map(PathBuf::from)
                .or_else(|| path.clone())
                .unwrap_or_else(default_path);
            let store =
                SledStore::open(StoreConfig::at(&path)).with_context(|| format!("opening {}", path.display()))?;
            Ok((Target::Sled(store), format!("sled {}", path.display())))
        }
    }
}

pub fn run(args: StoreArgs) -> Result<()> {
    let (store, what) = open(&args)?;
    println!("store: {what}");
    match args.command {
        StoreCommand::Stats => stats(&store),
        StoreCommand::Verify => {
            let rep = match &store {
                Target::Sled(s) => s.verify()?,
                Target::Redis(r) => r.verify()?,
            };
            print_verify(&rep);
            if !rep.bad.is_empty() {
                bail!(
                    "{} damaged records in {what} (run `kamera store gc` to remove them)",
                    rep.bad.len()
                );
            }
            Ok(())
        }
        StoreCommand::Gc { budget, grace_ms } => match &store {
            Target::Sled(s) => {
                let rep = s.gc(budget)?;
                println!(
                    "removed {} damaged, evicted {}, freed {} bytes; {} record bytes remain",
                    rep.removed_bad, rep.evicted, rep.freed_bytes, rep.remaining_bytes
                );
                Ok(())
            }
            Target::Redis(r) => {
                if let Some(b) = budget {
                    bail!(
                        "--budget {b}: Redis has no kamera byte budget; its own `maxmemory` and \
                         `maxmemory-policy` (use allkeys-lru) bound the store there (see \
                         crates/kamera-store/README.md, \"Eviction and expiry\")"
                    );
                }
                let rep = r.gc(Duration::from_millis(grace_ms))?;
                println!(
                    "removed {} damaged records and {} orphan pieces, freed {} bytes; {} record bytes remain",
                    rep.removed_bad, rep.orphan_pieces, rep.freed_bytes, rep.remaining_bytes
                );
                print_memory(r)
            }
        },
    }
}

fn stats(store: &Target) -> Result<()> {
    let usage: Usage = match store {
        Target::Sled(s) => s.usage()?,
        Target::Redis(r) => r.usage()?,
    };
    println!("{:<34} {:<10} {:>8} {:>14}", "model", "kind", "records", "bytes");
    for r in &usage.rows {
        println!(
            "{:<34} {:<10} {:>8} {:>14}",
            r.model.to_string(),
            r.kind.name(),
            r.records,
            r.bytes
        );
    }
    println!("{} records, {} record bytes", usage.records(), usage.bytes());
    if usage.unreadable > 0 {
        println!("{} manifests unreadable (run `kamera store verify`)", usage.unreadable);
    }
    match store {
        Target::Sled(s) => {
            println!("{} bytes on disk", s.size_on_disk()?);
            Ok(())
        }
        Target::Redis(r) => print_memory(r),
    }
}

fn print_verify(rep: &VerifyReport) {
    for (kind, n, bytes, tokens) in &rep.by_kind {
        println!(
            "{:<10} {n:>8} records {bytes:>14} bytes {tokens:>10} tokens",
            kind.name()
        );
    }
    for (key, why) in &rep.bad {
        println!("DAMAGED {key}: {why}");
    }
    if rep.orphan_pieces > 0 {
        println!(
            "{} pieces that no manifest names (a put in flight, or a writer that died; `gc` removes them)",
            rep.orphan_pieces
        );
    }
    println!("{} ok, {} damaged", rep.ok, rep.bad.len());
}

/// Redis' memory and eviction settings: what bounds the store's bytes there.
fn print_memory(r: &RedisStore) -> Result<()> {
    for m in r.memory()? {
        let node = m.node.as_ref().map(|n| format!(" {n}")).unwrap_or_default();
        let max = match m.max_bytes {
            0 => "no maxmemory".to_string(),
            b => format!("maxmemory {b}"),
        };
        println!(
            "redis{node}: used_memory {}, {max}, maxmemory-policy {}",
            m.used_bytes, m.policy
        );
        if !m.evicts(r.config().ttl.is_some()) {
            println!(
                "  warning: {} never evicts kamera's records (they have no TTL): once full, writes fail \
                 with OOM; set `maxmemory-policy allkeys-lru`",
                m.policy
            );
        } else if m.max_bytes == 0 {
            println!("  note: no maxmemory, so nothing is evicted until the machine runs out of memory");
        }
    }
    println!("Redis evicts by its maxmemory-policy; kamera applies no byte budget there.");
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use kamera_ops::{ChunkKv, DType, KvLayout};
    use kamera_store::{ChunkId, ChunkStore, Key, ModelFp, Record};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        store: StoreArgs,
    }

    fn kamera_store(args: &[&str]) -> Result<()> {
        run(Cli::try_parse_from(["kamera-store"].iter().chain(args))?.store)
    }

    #[test]
    fn verify_fails_on_a_damaged_redis_record_until_gc_removes_it() -> Result<()> {
        let srv = crate::redis_server::RedisServer::start(&[])?;
        let url = srv.url();
        let s = RedisStore::open(RedisConfig {
            prefix: "cli".into(),
            ..RedisConfig::at(url.as_str())
        })?;
        let m = ModelFp::of("cli-test");
        let keys: Vec<Key> = (0..3u8).map(|i| Key::canonical(m, ChunkId::of(&[i], "e", m))).collect();
        for k in &keys {
            let kv = ChunkKv::zeros(KvLayout::gqa(2, 4, 2, 8), 0, 5, DType::Bf16)?;
            s.put(k, Record::kv(m, 1, kv))?;
        }
        let base = ["--store", url.as_str(), "--prefix", "cli"];
        let with = |cmd: &[&'static str]| [&base[..], cmd].concat();
        kamera_store(&with(&["verify"]))?;
        kamera_store(&with(&["stats"]))?;
        let _: i64 = redis::cmd("SETRANGE")
            .arg(s.manifest_key(&keys[1]))
            .arg(70)
            .arg(&[0xFFu8][..])
            .query(&mut srv.raw())?;
        let e = kamera_store(&with(&["verify"])).expect_err("a damaged record passed verify");
        assert!(e.to_string().contains("1 damaged records"), "{e}");
        let e = kamera_store(&with(&["gc", "--budget", "1000"])).expect_err("a budget on Redis");
        assert!(e.to_string().contains("maxmemory-policy"), "{e}");
        kamera_store(&with(&["gc", "--grace-ms", "0"]))?;
        kamera_store(&with(&["verify"]))?;
        assert_eq!(s.usage()?.records(), 2);
        assert!(kamera_store(&["--store", "s3://bucket", "stats"]).is_err());
        assert!(kamera_store(&["--store", "/x", "--path", "/y", "stats"]).is_err());
        Ok(())
    }
}
