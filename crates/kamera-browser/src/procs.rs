//! Processes a Chromium profile's browser left running: every Chromium process and helper
//! carries its `--user-data-dir`, so they are found by the profile in their command line.

use std::path::Path;

/// PIDs of the processes whose command line names `profile`.
pub fn processes_of(profile: &Path) -> Vec<u32> {
    let needle = profile.to_string_lossy().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}
