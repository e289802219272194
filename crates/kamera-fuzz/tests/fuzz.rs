//! Every target at a CI-sized count: no panic, nothing over its allocation bound, every
//! invariant held. The counted 100,000-input runs are `kamera-fuzz --count 100000`.

use std::sync::Mutex;

use anyhow::Result;
use kamera_fuzz::{CountingAlloc, Runner, targets};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// The runner swaps the panic hook: one target at a time.
static ONE: Mutex<()> = Mutex::new(());

fn fuzz(name: &str, count: u64) -> Result<()> {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let t = targets::by_name(name)?;
    let r = Runner::new(42).run(&t, count);
    eprint!("{r}");
    assert_eq!(r.inputs, count);
    assert!(r.peak_alloc.is_some(), "the counting allocator is installed");
    assert!(r.rejected > 0, "mutations reach the decoder's errors");
    assert!(r.held(), "{r}");
    Ok(())
}

#[test]
fn gguf() -> Result<()> {
    fuzz("gguf", 1500)
}

#[test]
fn safetensors() -> Result<()> {
    fuzz("safetensors", 2000)
}

#[test]
fn record() -> Result<()> {
    fuzz("record", 4000)
}

#[test]
fn trace() -> Result<()> {
    fuzz("trace", 3000)
}

#[test]
fn recorder() -> Result<()> {
    fuzz("recorder", 2000)
}

#[test]
fn scenario() -> Result<()> {
    fuzz("scenario", 4000)
}

#[test]
fn tokenizer() -> Result<()> {
    fuzz("tokenizer", 1000)
}

/// Regenerates the GGUF seeds from the real models (fetched where not cached):
/// `KAMERA_BLESS=1 cargo test --release -p kamera-fuzz --test fuzz -- --ignored gguf_seeds`.
#[test]
#[ignore = "writes seeds/ from the real models"]
fn gguf_seeds() -> Result<()> {
    use kamera_model::{ModelName, default_home, fetch};
    for m in ModelName::ALL {
        let seed = targets::gguf_seed_from_model(&fetch(m, &default_home())?)?;
        let p = targets::gguf_seeds_dir().join(format!("{}.gguf", m.as_str()));
        eprintln!("{}: {} bytes", p.display(), seed.len());
        if std::env::var_os("KAMERA_BLESS").is_some() {
            std::fs::write(&p, &seed)?;
        }
    }
    Ok(())
}

/// Regenerates the safetensors seeds from the tiny Qwen2.5-VL's shards:
/// `KAMERA_BLESS=1 cargo test --release -p kamera-fuzz --test fuzz -- --ignored safetensors_seeds`.
#[test]
#[ignore = "writes seeds/ from kamera-model's golden tiny model"]
fn safetensors_seeds() -> Result<()> {
    for (i, src) in targets::safetensors_seed_sources().iter().enumerate() {
        let seed = targets::safetensors_seed_from_model(src)?;
        let p = targets::safetensors_seed_path(i);
        eprintln!("{}: {} bytes", p.display(), seed.len());
        if std::env::var_os("KAMERA_BLESS").is_some() {
            std::fs::write(&p, &seed)?;
        }
    }
    Ok(())
}
