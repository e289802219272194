//! The report of `kamera bench session`: per-method percentiles and totals, ratios measured in
//! the same run, a Markdown table and an SVG plot of time to first token per step.

use std::fmt::Write;

use kamera_agent::SessionStats;
use serde::Serialize;

use crate::bench_session::{MethodStep, StepRow};

#[derive(Debug, Clone, Serialize)]
pub struct MethodSummary {
    pub name: &'static str,
    pub ttft_p50_ms: f64,
    pub ttft_p95_ms: f64,
    pub ttft_mean_ms: f64,
    /// Mean time to first token plus the work deferred past it, per step.
    pub compute_mean_ms: f64,
    pub prefill_tokens: usize,
    pub bytes_moved: u64,
    /// Mean KL to the full re-prefill over the question steps.
    pub mean_kl: Option<f64>,
    pub max_kl: Option<f64>,
    /// Question steps answered with the site's true status.
    pub correct: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub model: String,
    pub steps: usize,
    pub questions: usize,
    pub window_tokens: usize,
    pub orders: usize,
    pub rank: usize,
    pub methods: Vec<MethodSummary>,
    /// p50 time to first token of full re-prefill / Kamera, and of the prefix cache / Kamera.
    pub p50_speedup_vs_full: f64,
    pub p50_speedup_vs_prefix: f64,
    pub session: SessionStats,
}

pub(crate) fn percentile(mut xs: Vec<f64>, p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let i = ((xs.len() - 1) as f64 * p).round() as usize;
    xs[i]
}

fn method(
    name: &'static str,
    rows: &[StepRow],
    pick: impl Fn(&StepRow) -> &MethodStep,
    truth: &[Option<String>],
) -> MethodSummary {
    let ttft: Vec<f64> = rows.iter().map(|r| pick(r).ttft_ms).collect();
    let kls: Vec<f64> = rows.iter().filter_map(|r| pick(r).kl).collect();
    MethodSummary {
        name,
        ttft_p50_ms: percentile(ttft.clone(), 0.5),
        ttft_p95_ms: percentile(ttft.clone(), 0.95),
        ttft_mean_ms: ttft.iter().sum::<f64>() / ttft.len().max(1) as f64,
        compute_mean_ms: rows.iter().map(|r| pick(r).ttft_ms + pick(r).deferred_ms).sum::<f64>()
            / rows.len().max(1) as f64,
        prefill_tokens: rows.iter().map(|r| pick(r).prefill_tokens).sum(),
        bytes_moved: rows.iter().map(|r| pick(r).bytes_moved).sum(),
        mean_kl: (!kls.is_empty()).then(|| kls.iter().sum::<f64>() / kls.len() as f64),
        max_kl: kls.iter().copied().reduce(f64::max),
        correct: rows
            .iter()
            .zip(truth)
            .filter(|(r, t)| t.is_some() && pick(r).answer == **t)
            .count(),
    }
}

pub fn summarize(
    model: &str,
    (window, orders, rank): (usize, usize, usize),
    rows: &[StepRow],
    session: &SessionStats,
) -> Summary {
    let truth: Vec<Option<String>> = rows.iter().map(|r| r.truth.clone()).collect();
    let methods = vec![
        method("kamera", rows, |r| &r.kamera, &truth),
        method("prefix-cache", rows, |r| &r.prefix, &truth),
        method("full-reprefill", rows, |r| &r.full, &truth),
    ];
    Summary {
        model: model.to_string(),
        steps: rows.len(),
        questions: rows.iter().filter(|r| r.question).count(),
        window_tokens: window,
        orders,
        rank,
        p50_speedup_vs_full: methods[2].ttft_p50_ms / methods[0].ttft_p50_ms,
        p50_speedup_vs_prefix: methods[1].ttft_p50_ms / methods[0].ttft_p50_ms,
        methods,
        session: session.clone(),
    }
}

pub fn markdown(s: &Summary) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "`kamera bench session --model {} --steps {} --orders {} --window {}` (rank-{} patches; {} question steps)\n",
        s.model, s.steps, s.orders, s.window_tokens, s.rank, s.questions
    );
    let _ = writeln!(
        m,
        "| method | TTFT p50 | TTFT p95 | TTFT mean | TTFT + deferred work, mean | tokens prefilled | KV bytes moved | answer KL to full (mean / max) | correct answers |"
    );
    let _ = writeln!(m, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for x in &s.methods {
        let kl = match (x.mean_kl, x.max_kl) {
            (Some(a), Some(b)) => format!("{a:.2e} / {b:.2e}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            m,
            "| {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {} | {:.1} MB | {kl} | {}/{} |",
            x.name,
            x.ttft_p50_ms,
            x.ttft_p95_ms,
            x.ttft_mean_ms,
            x.compute_mean_ms,
            x.prefill_tokens,
            x.bytes_moved as f64 / 1e6,
            x.correct,
            s.questions
        );
    }
    let _ = writeln!(
        m,
        "\np50 time to first token: Kamera is {:.1}x faster than full re-prefill and {:.1}x faster than the prefix cache (same run).",
        s.p50_speedup_vs_full, s.p50_speedup_vs_prefix
    );
    let c = &s.session;
    let _ = writeln!(
        m,
        "Session: {} hit, {} new, {} recall, {} evict, {} relocate; {} patches formed, {} applied; {} of its {} prefilled tokens repaired survivors after the answer.",
        c.hits,
        c.new,
        c.recalls,
        c.evictions,
        c.relocations,
        c.patches_formed,
        c.patches_applied,
        c.repair_tokens,
        c.prefill_tokens
    );
    m
}

/// Time to first token per step, log scale, one line per method; question steps marked.
pub fn svg(rows: &[StepRow]) -> String {
    let (w, h, pad) = (900.0, 360.0, 50.0);
    let all: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.kamera.ttft_ms, r.prefix.ttft_ms, r.full.ttft_ms])
        .map(|x| x.max(1.0))
        .collect();
    let (lo, hi) = (
        all.iter().copied().fold(f64::INFINITY, f64::min).log10().floor(),
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
    type Series = (&'static str, &'static str, fn(&StepRow) -> f64);
    let series: [Series; 3] = [
        ("kamera", "#2a9d8f", |r| r.kamera.ttft_ms),
        ("prefix cache", "#e9c46a", |r| r.prefix.ttft_ms),
        ("full re-prefill", "#e63946", |r| r.full.ttft_ms),
    ];
    for (k, (name, col, f)) in series.iter().enumerate() {
        let pts: Vec<String> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| format!("{:.1},{:.1}", x(i), y(f(r))))
            .collect();
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{col}\" stroke-width=\"2\" points=\"{}\"/>\
             <text x=\"{}\" y=\"16\" fill=\"{col}\">■ {name}</text>",
            pts.join(" "),
            pad + 130.0 * k as f64
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"16\" fill=\"#b8860b\">▮ question step</text><text x=\"{}\" y=\"{}\">step</text></svg>",
        pad + 400.0,
        w / 2.0,
        h - 12.0
    );
    s
}
