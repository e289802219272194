//! The plot of `kamera bench session`: time to first token per step, log scale, one line per
//! method that ran; question steps marked.

use std::fmt::Write;

use crate::bench_session::{METHODS, StepRow};

const COLORS: [&str; 5] = ["#2a9d8f", "#457b9d", "#e63946", "#e9c46a", "#8d6a9f"];

pub fn svg(rows: &[StepRow]) -> String {
    let (w, h, pad) = (900.0, 380.0, 50.0);
    let all: Vec<f64> = rows
        .iter()
        .flat_map(|r| r.methods.values().map(|m| m.ttft_ms))
        .map(|x| x.max(1.0))
        .collect();
    let (lo, hi) = (
        all.iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
            .log10()
            .floor()
            .min(0.0),
        all.iter().copied().fold(1.0, f64::max).log10().ceil().max(1.0),
    );
    let n = rows.len().max(2) as f64;
    let x = |i: usize| pad + (w - 2.0 * pad) * i as f64 / (n - 1.0);
    let y = |v: f64| h - pad - (h - 2.0 * pad) * (v.max(1.0).log10() - lo) / (hi - lo).max(1e-9);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>"
    );
    let mut e = lo as i32;
    while e as f64 <= hi {
        let v = 10f64.powi(e);
        let yy = y(v);
        let _ = write!(
            s,
            "<line x1=\"{pad}\" x2=\"{}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#ddd\"/><text x=\"4\" y=\"{}\">{v} ms</text>",
            w - pad,
            yy + 4.0
        );
        e += 1;
    }
    for (i, _) in rows.iter().enumerate().filter(|(_, r)| r.question) {
        let _ = write!(
            s,
            "<line x1=\"{xx}\" x2=\"{xx}\" y1=\"{pad}\" y2=\"{}\" stroke=\"#fce4a8\" stroke-width=\"6\"/>",
            h - pad,
            xx = x(i)
        );
    }
    let mut k = 0;
    for (name, col) in METHODS.iter().zip(COLORS) {
        let pts: Vec<String> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.methods.get(name).map(|m| format!("{:.1},{:.1}", x(i), y(m.ttft_ms))))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{col}\" stroke-width=\"2\" points=\"{}\"/>\
             <text x=\"{}\" y=\"16\" fill=\"{col}\">■ {name}</text>",
            pts.join(" "),
            pad + 150.0 * k as f64
        );
        k += 1;
    }
    let _ = writeln!(
        s,
        "<text x=\"{pad}\" y=\"32\" fill=\"#b8860b\">▮ question step</text><text x=\"{}\" y=\"{}\">step (time to first token, log scale)</text></svg>",
        w / 2.0 - 80.0,
        h - 12.0
    );
    s
}
