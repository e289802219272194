//! `kamera store stats | verify | gc`: the canonical store at `$KAMERA_HOME/store`.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use kamera_store::{SledStore, StoreConfig, default_path};

#[derive(Args)]
pub struct StoreArgs {
    /// Store directory (default `$KAMERA_HOME/store`, else `~/.cache/kamera/store`).
    #[arg(long, global = true)]
    path: Option<PathBuf>,
    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Records, bytes and tokens by kind and model; size on disk.
    Stats,
    /// Decode and checksum every record; exit non-zero if any is damaged.
    Verify,
    /// Remove damaged records, then evict (cost-aware) down to a byte budget.
    Gc {
        /// Byte budget for the records (encoded bytes); without it only damaged records go.
        #[arg(long)]
        budget: Option<u64>,
    },
}

pub fn run(args: StoreArgs) -> Result<()> {
    let path = args.path.unwrap_or_else(default_path);
    let store = SledStore::open(StoreConfig::at(&path)).with_context(|| format!("opening {}", path.display()))?;
    match args.command {
        StoreCommand::Stats => {
            let metas = store.metas()?;
            let mut by: std::collections::BTreeMap<(String, &str), (u64, u64)> = Default::default();
            for (k, m) in &metas {
                let e = by.entry((k.model.to_string(), k.kind.name())).or_default();
                e.0 += 1;
                e.1 += m.bytes;
            }
            println!("store {}", path.display());
            println!("{:<34} {:<10} {:>8} {:>14}", "model", "kind", "records", "bytes");
            for ((model, kind), (n, bytes)) in by {
                println!("{model:<34} {kind:<10} {n:>8} {bytes:>14}");
            }
            println!(
                "{} records, {} record bytes, {} bytes on disk",
                store.len(),
                store.total_bytes(),
                store.size_on_disk()?
            );
        }
        StoreCommand::Verify => {
            let rep = store.verify()?;
            for (kind, n, bytes, tokens) in &rep.by_kind {
                println!(
                    "{:<10} {n:>8} records {bytes:>14} bytes {tokens:>10} tokens",
                    kind.name()
                );
            }
            for (key, why) in &rep.bad {
                println!("DAMAGED {key}: {why}");
            }
            println!("{} ok, {} damaged", rep.ok, rep.bad.len());
            if !rep.bad.is_empty() {
                anyhow::bail!(
                    "{} damaged records (run `kamera store gc` to remove them)",
                    rep.bad.len()
                );
            }
        }
        StoreCommand::Gc { budget } => {
            let rep = store.gc(budget)?;
            println!(
                "removed {} damaged, evicted {}, freed {} bytes; {} record bytes remain",
                rep.removed_bad, rep.evicted, rep.freed_bytes, rep.remaining_bytes
            );
        }
    }
    Ok(())
}
