//! Renders a `kamera eval` JSON report again: `cargo run --release -p kamera-lab --example render
//! -- REPORT.json [...]` writes REPORT.md (tables, Pareto, diagnostics) and REPORT.svg beside it.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    for arg in std::env::args().skip(1) {
        let path = PathBuf::from(&arg);
        let report: kamera_lab::Report = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let svg = path.with_extension("svg");
        std::fs::write(&svg, report.svg())?;
        let name = svg
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let md = format!("{}\n![gap recovered vs bytes]({name})\n", report.markdown());
        std::fs::write(path.with_extension("md"), md)?;
        eprintln!("rendered {}", path.display());
    }
    Ok(())
}
