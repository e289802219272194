//! Records the commit this binary is built from (`KAMERA_BUILD_COMMIT`: `git rev-parse HEAD`,
//! `-dirty` when tracked files differ from it), so a benchmark's stamp names the code that ran,
//! not the source tree's state when it ran. "unknown" outside a git checkout.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = match git(&["rev-parse", "HEAD"]) {
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty { format!("{head}-dirty") } else { head }
        }
        None => "unknown".to_string(),
    };
    println!("cargo:rustc-env=KAMERA_BUILD_COMMIT={commit}");
    // A new commit, a checkout, or an edit of any crate's sources or manifest: stamp again
    // (not files tests write elsewhere in the tree, which would rebuild this crate for nothing).
    for path in [
        "../../.git/HEAD",
        "../../.git/index",
        "../../.git/refs",
        "../../Cargo.toml",
        "../../Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    if let Ok(crates) = std::fs::read_dir("../../crates") {
        for c in crates.flatten() {
            for part in ["src", "Cargo.toml"] {
                let p = c.path().join(part);
                if p.exists() {
                    println!("cargo:rerun-if-changed={}", p.display());
                }
            }
        }
    }
}
