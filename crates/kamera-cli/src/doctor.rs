//! `kamera doctor`: what this machine has of what Kamera needs (Chromium, cached models and
//! their sha256 stamps, the store, redis-server, MiniWoB++, pip, NVRTC and the CUDA driver), what
//! is missing and the command that installs it. Exits 1 when something required is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use clap::Args;
use kamera_model::{CacheState, ModelName, cache_state, default_home, model_path};

#[derive(Args)]
pub struct DoctorArgs {
    /// Print the checks as JSON.
    #[arg(long)]
    json: bool,
}

/// One check's finding.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    /// Missing here makes `kamera doctor` fail: `kamera run` cannot work without it.
    pub required: bool,
    pub detail: String,
    /// The command that installs or fixes it.
    pub fix: Option<String>,
}

fn check(name: &str, ok: bool, required: bool, detail: String, fix: &str) -> Check {
    Check {
        name: name.into(),
        ok,
        required,
        detail,
        fix: (!ok).then(|| fix.to_string()),
    }
}

/// The first line a program prints for `args`, if it runs.
fn version(exe: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(exe).args(args).output().ok()?;
    let text = String::from_utf8_lossy(if out.stdout.is_empty() {
        &out.stderr
    } else {
        &out.stdout
    })
    .to_string();
    out.status
        .success()
        .then(|| text.lines().next().unwrap_or("").trim().to_string())
}

/// `name` on PATH.
fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn chromium() -> Check {
    let exe = std::env::var_os("KAMERA_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let v = exe.exists().then(|| version(&exe, &["--version"])).flatten();
    let detail = match &v {
        Some(v) => format!("{v} ({})", exe.display()),
        None if exe.exists() => format!("{} does not run (--version failed)", exe.display()),
        None => format!("no {} (set KAMERA_CHROMIUM to another)", exe.display()),
    };
    check("chromium", v.is_some(), true, detail, "scripts/install-chromium.sh")
}

fn models(home: &Path) -> Vec<Check> {
    ModelName::ALL
        .iter()
        .map(|&name| {
            let path = model_path(name, home);
            let (ok, detail) = match cache_state(name, home, false) {
                Ok(CacheState::Verified) => (true, format!("verified ({})", path.display())),
                Ok(CacheState::Unverified) => (
                    false,
                    format!("{} has no matching .verified stamp (sha256 unchecked)", path.display()),
                ),
                Ok(CacheState::Missing) => (false, format!("not cached ({})", path.display())),
                Err(e) => (false, format!("{e}")),
            };
            // The embedded default model is what `kamera run` uses; the others are optional.
            let required = name == ModelName::Smollm2_135m;
            check(
                &format!("model {}", name.as_str()),
                ok,
                required,
                detail,
                &format!("kamera models fetch {}", name.as_str()),
            )
        })
        .collect()
}

/// The store's directory exists (or can be made) and takes a file.
fn store() -> Check {
    let path = kamera_store::default_path();
    let probe = path.join(format!(".doctor-{}", std::process::id()));
    let r = std::fs::create_dir_all(&path)
        .and_then(|()| std::fs::write(&probe, b"ok"))
        .and_then(|()| std::fs::remove_file(&probe));
    let (ok, detail) = match r {
        Ok(()) => (true, format!("{} is writable", path.display())),
        Err(e) => (false, format!("{}: {e}", path.display())),
    };
    check(
        "store",
        ok,
        true,
        detail,
        "set KAMERA_HOME to a writable directory (the store is $KAMERA_HOME/store)",
    )
}

fn redis() -> Check {
    let v = which("redis-server").and_then(|p| version(&p, &["--version"]));
    let detail = v.unwrap_or_else(|| "no redis-server on PATH (only `--store redis://` and its tests need it)".into());
    check(
        "redis-server",
        which("redis-server").is_some(),
        false,
        detail,
        "scripts/install-redis.sh",
    )
}

fn pip() -> Check {
    let py = std::env::var("KAMERA_PYTHON").unwrap_or_else(|_| "python3".into());
    let v = which(&py)
        .or_else(|| Some(PathBuf::from(&py)).filter(|p| p.is_file()))
        .and_then(|p| version(&p, &["-m", "pip", "--version"]));
    let ok = v.is_some();
    check(
        "pip",
        ok,
        false,
        v.unwrap_or_else(|| format!("{py} -m pip does not run (model and MiniWoB++ packages are fetched with it)")),
        "apt-get install python3-pip",
    )
}

fn miniwob(home: &Path) -> Check {
    let html = home.join("miniwob-1.1.0").join("html");
    let ok = html.join("core").join("core.js").exists();
    check(
        "miniwob",
        ok,
        false,
        if ok {
            format!("{}", html.display())
        } else {
            "not cached (MiniWoB++ scenarios and `kamera bench agent` fetch it on first use)".into()
        },
        "kamera run miniwob-click-test",
    )
}

/// A shared library `prefix*.so*` in LD_LIBRARY_PATH, the loader's cache, the usual CUDA
/// folders, or under `$KAMERA_HOME` (scripts/install-nvrtc.sh's copy).
fn find_lib(prefix: &str, home: &Path) -> Option<PathBuf> {
    if let Ok(out) = Command::new("ldconfig").arg("-p").output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.trim_start().starts_with(prefix)
                && let Some((_, p)) = line.split_once("=> ")
            {
                return Some(PathBuf::from(p.trim()));
            }
        }
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    dirs.extend(
        [
            "/usr/local/cuda/lib64",
            "/usr/local/nvidia/lib64",
            "/usr/lib/x86_64-linux-gnu",
        ]
        .map(PathBuf::from),
    );
    if let Ok(rd) = std::fs::read_dir(home) {
        for e in rd
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("nvrtc-"))
        {
            for cu in ["cu13", "cu12"] {
                dirs.push(e.path().join("nvidia").join(cu).join("lib"));
            }
        }
    }
    dirs.iter().find_map(|d| {
        std::fs::read_dir(d).ok()?.flatten().map(|e| e.path()).find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix) && n.to_string_lossy().contains(".so"))
        })
    })
}

fn gpu(home: &Path) -> Vec<Check> {
    let nvrtc = find_lib("libnvrtc", home);
    let cuda = find_lib("libcuda.so", home);
    let backend = match kamera_gpu::CudaBackend::new(0) {
        Ok(b) => Ok(b.device_name()),
        Err(e) => Err(e.to_string()),
    };
    vec![
        check(
            "nvrtc",
            nvrtc.is_some(),
            false,
            nvrtc.map_or("no libnvrtc (only the CUDA backend needs it)".into(), |p| {
                format!("{} (put its folder on LD_LIBRARY_PATH)", p.display())
            }),
            "scripts/install-nvrtc.sh",
        ),
        check(
            "libcuda",
            cuda.is_some(),
            false,
            cuda.map_or("no CUDA driver library (no NVIDIA GPU driver here)".into(), |p| {
                p.display().to_string()
            }),
            "install the NVIDIA driver for your GPU",
        ),
        check(
            "cuda backend",
            backend.is_ok(),
            false,
            backend.unwrap_or_else(|e| e),
            "cargo build --release -p kamera-cli --features cuda (with NVRTC and a GPU)",
        ),
    ]
}

/// Every check, in the order printed.
pub fn checks() -> Vec<Check> {
    let home = default_home();
    let mut all = vec![chromium()];
    all.extend(models(&home));
    all.push(store());
    all.push(pip());
    all.push(miniwob(&home));
    all.push(redis());
    all.extend(gpu(&home));
    all
}

pub fn run(a: DoctorArgs) -> Result<()> {
    let all = checks();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        for c in &all {
            let mark = match (c.ok, c.required) {
                (true, _) => "ok",
                (false, true) => "MISSING",
                (false, false) => "absent",
            };
            println!("{mark:<8} {:<20} {}", c.name, c.detail);
            if let Some(f) = &c.fix {
                println!("{:<8} {:<20} fix: {f}", "", "");
            }
        }
    }
    let missing: Vec<&str> = all
        .iter()
        .filter(|c| c.required && !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    if !missing.is_empty() {
        eprintln!("kamera doctor: required but missing: {}", missing.join(", "));
        std::process::exit(1);
    }
    Ok(())
}
