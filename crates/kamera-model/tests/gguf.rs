//! Malformed and truncated GGUF files get a clear error, never a panic; fingerprints are stable.

mod common;

use std::path::Path;

use anyhow::Result;
use kamera_model::{Error, Gguf, Model, ModelName};

fn err_of(bytes: Vec<u8>) -> String {
    match Gguf::from_bytes(Path::new("test.gguf"), bytes) {
        Ok(_) => "no error".to_string(),
        Err(e) => {
            assert!(matches!(e, Error::Gguf { .. }), "{e:?}");
            e.to_string()
        }
    }
}

#[test]
fn bad_magic_and_empty() {
    assert!(err_of(vec![]).contains("not a GGUF file"));
    assert!(err_of(b"GGML\x03\0\0\0".to_vec()).contains("not a GGUF file"));
}

#[test]
fn truncated_real_files() -> Result<()> {
    let bytes = std::fs::read(common::path(ModelName::Smollm2_135m)?)?;
    for cut in [6, 24, 1000, 100_000, bytes.len() / 2, bytes.len() - 1] {
        let e = err_of(bytes[..cut].to_vec());
        eprintln!("cut at {cut}: {e}");
        assert!(
            e.contains("truncated") || e.contains("malformed header"),
            "cut at {cut}: {e}"
        );
    }
    // Garbage in the header: a huge tensor count.
    let mut bad = bytes[..4096].to_vec();
    bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_of(bad).contains("malformed header"));
    let dir = std::env::temp_dir().join(format!("kamera-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let p = dir.join("half.gguf");
    std::fs::write(&p, &bytes[..bytes.len() / 2])?;
    let e = Model::load(&p).unwrap_err();
    assert!(
        e.to_string().contains("truncated") && e.to_string().contains("half.gguf"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn fingerprint_and_layout() -> Result<()> {
    let m = common::load(ModelName::Smollm2_135m)?;
    let again = Model::load(&common::path(ModelName::Smollm2_135m)?)?;
    assert_eq!(m.fingerprint(), again.fingerprint());
    assert_eq!(m.fingerprint().len(), 32);
    let l = m.layout();
    assert_eq!((l.n_layers, l.heads(), l.kv_heads(), l.head_dim), (30, 9, 3, 64));
    assert_eq!(m.rope().layout, kamera_model::PairLayout::Interleaved);
    Ok(())
}
