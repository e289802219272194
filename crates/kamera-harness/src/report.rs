//! A self-contained HTML report of a run: summary, a per-step timing chart (inline SVG), cache
//! operations, and each step's screenshot (embedded from the trace's resources/).

use std::fmt::Write;
use std::path::Path;

use base64::Engine;

use kamera_agent::{Result, RunSummary};

use crate::io;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes the report to `out`; screenshots come from `resources` (a trace's resources/ folder).
// Long: writes the report's HTML in page order.
pub fn write_html(summary: &RunSummary, resources: Option<&Path>, out: &Path) -> Result<()> {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>kamera run: {name}</title><style>\
         body{{font-family:sans-serif;margin:20px}} td,th{{border:1px solid #ccc;padding:3px 8px;vertical-align:top}}\
         table{{border-collapse:collapse}} img{{width:320px;border:1px solid #999}} pre{{white-space:pre-wrap;max-width:420px;font-size:11px}}\
         </style></head><body><h1>{name}</h1>",
        name = esc(&summary.scenario)
    );
    let c = &summary.session;
    let _ = write!(
        h,
        "<table><tr><th>steps</th><td>{}</td></tr><tr><th>answer</th><td>{}</td></tr><tr><th>expected</th><td>{}</td></tr>\
         <tr><th>success</th><td>{}</td></tr><tr><th>reward</th><td>{}</td></tr><tr><th>error</th><td>{}</td></tr>\
         <tr><th>window</th><td>{} hit, {} new, {} recall, {} from the store, {} evict, {} relocate; {} tokens placed without prefill, {} prefilled; {} patches formed, {} applied</td></tr>\
         <tr><th>wall</th><td>{:.0} ms</td></tr></table>",
        summary.end.steps,
        esc(summary.end.answer.as_deref().unwrap_or("-")),
        esc(summary.expected.as_deref().unwrap_or("-")),
        summary.end.success.map(|b| b.to_string()).unwrap_or("-".into()),
        summary.end.reward.map(|r| format!("{r:.3}")).unwrap_or("-".into()),
        esc(summary.end.error.as_deref().unwrap_or("-")),
        c.hits,
        c.new,
        c.recalls,
        c.stored,
        c.evictions,
        c.relocations,
        c.placed_tokens,
        c.prefill_tokens,
        c.patches_formed,
        c.patches_applied,
        summary.wall_ms
    );
    // Timing chart: one stacked bar per step.
    let parts: [(&str, &str); 7] = [
        ("observe", "#457b9d"),
        ("encode", "#e63946"),
        ("patch", "#9b5de5"),
        ("reuse", "#2a9d8f"),
        ("prefill", "#f4a261"),
        ("decode", "#8d99ae"),
        ("act", "#1d3557"),
    ];
    let max = summary.steps.iter().map(|s| s.timings.total_ms).fold(1.0, f64::max);
    let (bw, ch) = (40.0, 200.0);
    let w = 60.0 + bw * summary.steps.len() as f64;
    let _ = write!(
        h,
        "<h2>Step timings (ms)</h2><svg width=\"{w}\" height=\"{}\">",
        ch + 40.0
    );
    for (i, s) in summary.steps.iter().enumerate() {
        let t = &s.timings;
        let vals = [
            t.observe_ms,
            t.encode_ms,
            t.reuse_ms,
            t.prefill_ms,
            t.decode_ms,
            t.act_ms,
        ];
        let mut y = ch;
        for (v, (name, col)) in vals.iter().zip(parts) {
            let hgt = v / max * ch;
            y -= hgt;
            let _ = write!(
                h,
                "<rect x=\"{}\" y=\"{y:.1}\" width=\"{}\" height=\"{hgt:.1}\" fill=\"{col}\"><title>step {i} {name} {v:.1} ms</title></rect>",
                50.0 + bw * i as f64,
                bw - 6.0
            );
        }
        let _ = write!(
            h,
            "<text x=\"{}\" y=\"{}\" font-size=\"11\">{i}</text>",
            60.0 + bw * i as f64,
            ch + 14.0
        );
    }
    let _ = write!(
        h,
        "<text x=\"0\" y=\"12\" font-size=\"11\">{max:.0}</text><text x=\"0\" y=\"{}\" font-size=\"11\">",
        ch + 34.0
    );
    for (name, col) in parts {
        let _ = write!(h, "<tspan fill=\"{col}\">■ {name} </tspan>");
    }
    h += "</text></svg><h2>Steps</h2><table><tr><th>#</th><th>screenshot</th><th>page</th><th>window plan</th><th>action</th><th>result</th><th>ms</th></tr>";
    for s in &summary.steps {
        let img = resources
            .map(|r| r.join(format!("{}.png", s.observation.screenshot)))
            .and_then(|p| std::fs::read(p).ok())
            .map(|b| {
                format!(
                    "<img src=\"data:image/png;base64,{}\">",
                    base64::engine::general_purpose::STANDARD.encode(b)
                )
            })
            .unwrap_or_default();
        let plan: Vec<String> = std::iter::once(format!("{:?}", s.visit).to_lowercase())
            .chain(s.plan.iter().map(|p| esc(&p.to_string())))
            .collect();
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{img}</td><td><b>{}</b><br>{}<pre>{}</pre></td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td></tr>",
            s.step,
            esc(&s.observation.title),
            esc(&s.observation.url),
            esc(&s.observation.text),
            plan.join("<br>"),
            esc(&s.action.as_ref().map(|a| a.label()).unwrap_or_default()),
            esc(&s.result.to_string()),
            s.timings.total_ms
        );
    }
    h += "</table></body></html>\n";
    std::fs::write(out, h).map_err(io("write report", out))
}
