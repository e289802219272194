//! Writes the generated task suite: `cargo run --release -p kamera-eval --example gen_tasks --
//! [OUT.jsonl] [COUNT] [SEED] [FILLER] [PAGES]` (defaults: tasks/default.jsonl next to this crate,
//! 120, 7, 12, 3).

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = args
        .first()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tasks/default.jsonl"));
    let mut cfg = kamera_eval::GenConfig::default();
    if let Some(n) = args.get(1) {
        cfg.tasks = n.parse()?;
    }
    if let Some(s) = args.get(2) {
        cfg.seed = s.parse()?;
    }
    if let Some(f) = args.get(3) {
        cfg.filler = f.parse()?;
    }
    if let Some(p) = args.get(4) {
        cfg.pages = p.parse()?;
    }
    let tasks = kamera_eval::generate(&cfg);
    kamera_eval::save_tasks(&out, &tasks)?;
    eprintln!("wrote {} tasks to {}", tasks.len(), out.display());
    Ok(())
}
