//! The `kamera` binary run as a user runs it, for the CLI tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// `kamera ARGS` with `env` set.
pub fn kamera(env: &[(&str, &Path)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kamera"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run kamera")
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
