//! Test support shared by the workspace's tests: a test that cannot run on this machine (no
//! AVX512_BF16, not root, a redis-server without TLS) says so through [`skip`], so that
//! `scripts/test.sh` counts it apart from the tests that passed. This is kamera-ops' one file
//! write, and only tests call it.

use std::io::Write;
use std::path::Path;

/// The environment variable naming the file each skip appends its line to (scripts/test.sh sets it).
pub const SKIP_LOG: &str = "KAMERA_SKIP_LOG";

/// Reports that `test` did not run here and why: prints `SKIPPED test: reason` and, where
/// `KAMERA_SKIP_LOG` names a file, appends `test: reason` to it (one write per line, so tests in
/// parallel threads and processes do not interleave). The caller returns right after; libtest
/// still prints `ok`, which is why the log exists.
///
/// ```no_run
/// # fn has_feature() -> bool { false }
/// if !has_feature() {
///     kamera_ops::testkit::skip("crate::my_test", "this CPU has no AVX512_BF16");
///     return;
/// }
/// ```
pub fn skip(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os(SKIP_LOG) {
        // A skip that cannot be recorded must not pass for a test that ran.
        if let Err(e) = record(Path::new(&path), test, reason) {
            panic!(
                "{test} skipped ({reason}) but {SKIP_LOG}={} cannot record it: {e}",
                path.to_string_lossy()
            );
        }
    }
}

fn record(path: &Path, test: &str, reason: &str) -> std::io::Result<()> {
    let line = format!("{test}: {reason}\n");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_skip_appends_one_line_per_call() {
        let dir = std::env::temp_dir().join(format!("kamera-skip-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        super::record(&dir, "a", "one reason").unwrap();
        super::record(&dir, "b", "another").unwrap();
        let text = std::fs::read_to_string(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(text, "a: one reason\nb: another\n");
    }
}
