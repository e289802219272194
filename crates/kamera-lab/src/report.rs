//! Aggregation over tasks, the JSON report, the Markdown table and the SVG plot of gap
//! recovered against bytes stored.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use kamera_eval::gap_recovered;

use crate::config::EvalConfig;
use crate::noise::NoiseFloor;
use crate::split::TaskSelection;
use crate::task_result::{TaskMethod, TaskResult};

/// Means over tasks of one method.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MethodSummary {
    /// Mean KL(full ‖ method) per answer token.
    pub kl: f64,
    pub top1: f64,
    pub exact_match: f64,
    pub answer_logprob: f64,
    /// 1 − mean KL / mean blind KL.
    pub gap_recovered: f64,
    /// Mean over tasks of the per-task gap recovered (noisier: tasks with tiny blind KL weigh in).
    pub gap_recovered_task_mean: f64,
    /// The task standard error of `gap_recovered` (a ratio of means, by the delta method:
    /// √(Σ (KLᵢ − R·blindᵢ)² / (n(n − 1))) / mean blind with R = mean KL / mean blind; 0 for
    /// one task).
    #[serde(default)]
    pub gap_se: f64,
    pub bytes_ratio: f64,
    /// The largest patch record / its chunk's canonical record over every patched chunk of
    /// every task (the per-chunk reading of "added bytes").
    #[serde(default)]
    pub chunk_bytes_max: f64,
    /// Mean blind KL on the orderings this method was evaluated on (its gap's reference).
    #[serde(default)]
    pub blind_kl: f64,
    /// Orderings per task it was evaluated on (every orbit ordering for orbit methods).
    #[serde(default)]
    pub orderings: f64,
    pub assemble_ms: f64,
    pub patch_ms: f64,
    /// patch_ms / (full_ms − assemble_ms): reuses after which forming the patch has paid for
    /// itself against re-prefilling every time (null without a patch or without a saving).
    pub break_even_reuses: Option<f64>,
    pub recompute_share: f64,
}

/// One layer's deficit diagnostics (means over chunks with antecedents and tasks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerEnergy {
    pub layer: usize,
    pub k_top8: f64,
    pub k_top16: f64,
    pub k_top32: f64,
    pub v_top8: f64,
    pub v_top16: f64,
    pub v_top32: f64,
    /// ‖Δ_K‖² / ‖K canonical‖².
    pub k_rel_energy: f64,
    pub v_rel_energy: f64,
}

/// A point of the oracle token curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OraclePoint {
    pub share: f64,
    pub kl: f64,
    pub gap_recovered: f64,
}

/// Why the orbit mean fails, per layer, at full rank (means over chunks, orderings and tasks).
/// `*_err_*` = ‖Δ − D‖²/‖Δ‖² for a chunk that is not first, with D the plain mean over every
/// ordering (`mean`), the mean over the orderings that do not put the chunk first (`later`) or
/// over those that put it at the same slot (`slot`). For a chunk that is first: the energy of
/// the plain mean it is given (`first_spurious`) and of its true deficit (`first_true`), both
/// relative to the mean energy of its deficits at later slots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrbitLayer {
    pub layer: usize,
    pub k_err_mean: f64,
    pub k_err_later: f64,
    pub k_err_slot: f64,
    pub v_err_mean: f64,
    pub v_err_later: f64,
    pub v_err_slot: f64,
    pub k_first_spurious: f64,
    pub v_first_spurious: f64,
    pub k_first_true: f64,
    pub v_first_true: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Diagnostics {
    pub deficit_energy: Vec<LayerEnergy>,
    pub oracle_curve: Vec<OraclePoint>,
    #[serde(default)]
    pub orbit: Vec<OrbitLayer>,
}

/// The `kamera eval` report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub model: String,
    pub tasks: usize,
    pub methods: BTreeMap<String, MethodSummary>,
    /// Methods in command-line order.
    pub method_order: Vec<String>,
    pub blind_kl: f64,
    pub full_ms: f64,
    pub mean_chunk_tokens: f64,
    pub settings: EvalConfig,
    /// The arithmetic of the model's long prefills in this run (`None` in reports from before
    /// it was recorded: those ran f32 up to 2026-12-01, the fastest the CPU runs after).
    #[serde(default)]
    pub prefill_precision: Option<kamera_model::PrefillPrecision>,
    /// The full re-prefill's answer moved by the other precision, when measured.
    #[serde(default)]
    pub noise_floor: Option<NoiseFloor>,
    pub diagnostics: Diagnostics,
    /// Which tasks were scored (`None` in reports from before it was recorded).
    #[serde(default)]
    pub selection: Option<TaskSelection>,
    /// The patch methods the runtime forms for this model (kamera-sched's cost model), where
    /// known to the caller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime_methods: Vec<String>,
    pub per_task: Vec<TaskResult>,
}

/// The task standard error of 1 − mean(kl) / mean(blind) ([`MethodSummary::gap_se`]).
pub fn gap_se(kl: &[f64], blind: &[f64]) -> f64 {
    let n = kl.len().min(blind.len());
    let mb = mean(blind.iter().take(n).copied());
    if n < 2 || mb <= 0.0 {
        return 0.0;
    }
    let r = mean(kl.iter().take(n).copied()) / mb;
    let ss: f64 = kl.iter().zip(blind).map(|(k, b)| (k - r * b).powi(2)).sum();
    (ss / (n * (n - 1)) as f64).sqrt() / mb
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// Aggregates per-task results.
// Long: one aggregate per field of the summary.
pub fn summarize(model: &str, order: &[String], settings: &EvalConfig, per_task: Vec<TaskResult>) -> Report {
    let blind_kl = mean(per_task.iter().map(|t| t.blind_kl));
    let full_ms = mean(per_task.iter().map(|t| t.full_ms));
    let mut methods = BTreeMap::new();
    for spec in order {
        let rows: Vec<_> = per_task.iter().filter_map(|t| t.methods.get(spec)).collect();
        let m = |f: &dyn Fn(&TaskMethod) -> f64| mean(rows.iter().map(|r| f(r)));
        let kl = m(&|r| r.kl);
        // Each method's gap is against blind on the orderings it was evaluated on.
        let method_blind = m(&|r| if r.orderings > 0 { r.blind_kl } else { f64::NAN });
        let method_blind = if method_blind.is_finite() {
            method_blind
        } else {
            blind_kl
        };
        let assemble_ms = m(&|r| r.assemble_ms);
        let patch_ms = m(&|r| r.patch_ms);
        let saving = full_ms - assemble_ms;
        methods.insert(
            spec.clone(),
            MethodSummary {
                kl,
                top1: m(&|r| r.top1),
                exact_match: m(&|r| f64::from(u8::from(r.exact_match))),
                answer_logprob: m(&|r| r.answer_logprob),
                gap_recovered: gap_recovered(kl, method_blind),
                gap_recovered_task_mean: m(&|r| r.gap_recovered),
                gap_se: {
                    let pairs = per_task.iter().filter_map(|t| {
                        let r = t.methods.get(spec)?;
                        Some((r.kl, if r.orderings > 0 { r.blind_kl } else { t.blind_kl }))
                    });
                    let (kls, blinds): (Vec<f64>, Vec<f64>) = pairs.unzip();
                    gap_se(&kls, &blinds)
                },
                bytes_ratio: m(&|r| r.bytes_ratio),
                chunk_bytes_max: rows.iter().map(|r| r.chunk_bytes_max).fold(0.0, f64::max),
                blind_kl: method_blind,
                orderings: m(&|r| r.orderings.max(1) as f64),
                assemble_ms,
                patch_ms,
                break_even_reuses: (patch_ms > 0.0 && saving > 0.0).then(|| patch_ms / saving),
                recompute_share: m(&|r| r.recompute_share),
            },
        );
    }
    let mut diagnostics = Diagnostics::default();
    let with_layers: Vec<_> = per_task.iter().filter(|t| !t.diagnostics.layers.is_empty()).collect();
    if let Some(first) = with_layers.first() {
        for l in 0..first.diagnostics.layers.len() {
            let c = |i: usize| mean(with_layers.iter().map(|t| t.diagnostics.layers[l][i]));
            diagnostics.deficit_energy.push(LayerEnergy {
                layer: l,
                k_top8: c(0),
                k_top16: c(1),
                k_top32: c(2),
                v_top8: c(3),
                v_top16: c(4),
                v_top32: c(5),
                k_rel_energy: c(6),
                v_rel_energy: c(7),
            });
        }
        for (i, &(share, _)) in first.diagnostics.oracle_curve.iter().enumerate() {
            let kl = mean(
                with_layers
                    .iter()
                    .filter_map(|t| t.diagnostics.oracle_curve.get(i).map(|p| p.1)),
            );
            diagnostics.oracle_curve.push(OraclePoint {
                share,
                kl,
                gap_recovered: gap_recovered(kl, blind_kl),
            });
        }
    }
    let with_orbit: Vec<_> = per_task
        .iter()
        .filter(|t| !t.diagnostics.orbit_layers.is_empty())
        .collect();
    if let Some(first) = with_orbit.first() {
        for l in 0..first.diagnostics.orbit_layers.len() {
            let c = |i: usize| mean(with_orbit.iter().map(|t| t.diagnostics.orbit_layers[l][i]));
            diagnostics.orbit.push(OrbitLayer {
                layer: l,
                k_err_mean: c(0),
                k_err_later: c(1),
                k_err_slot: c(2),
                v_err_mean: c(3),
                v_err_later: c(4),
                v_err_slot: c(5),
                k_first_spurious: c(6),
                v_first_spurious: c(7),
                k_first_true: c(8),
                v_first_true: c(9),
            });
        }
    }
    let mean_chunk_tokens = mean(per_task.iter().flat_map(|t| t.chunk_tokens.iter().map(|&n| n as f64)));
    Report {
        model: model.to_string(),
        tasks: per_task.len(),
        methods,
        method_order: order.to_vec(),
        blind_kl,
        full_ms,
        mean_chunk_tokens,
        settings: settings.clone(),
        prefill_precision: None,
        noise_floor: None,
        diagnostics,
        selection: None,
        runtime_methods: Vec::new(),
        per_task,
    }
}

impl Report {
    /// The method table and the diagnostics as Markdown.
    // Long: the tables' columns and the diagnostics, in print order.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# kamera eval: {} ({} tasks, {:.0} tokens per chunk on average)\n",
            self.model, self.tasks, self.mean_chunk_tokens
        );
        let _ = writeln!(
            s,
            "Mean blind KL {:.4}; full re-prefill of the chunks {:.0} ms.\n",
            self.blind_kl, self.full_ms
        );
        if let Some(sel) = &self.selection {
            let range = sel.range.map_or("all".to_string(), |r| format!("{r}"));
            let split = sel.split.as_deref().map_or(String::new(), |x| format!(" (split {x})"));
            let limit = sel.limit.map_or(String::new(), |n| format!(", first {n} of them"));
            let _ = writeln!(s, "Tasks {range}{split} of {}{limit}.\n", sel.file);
        }
        if !self.runtime_methods.is_empty() {
            let _ = writeln!(
                s,
                "The runtime forms {} patches for this model (kamera-sched's cost model).\n",
                self.runtime_methods.join(", ")
            );
        }
        if let Some(p) = self.prefill_precision {
            let _ = writeln!(
                s,
                "Prefill precision {p} (the chunks', the system prefix's and the full re-prefill's).\n"
            );
        }
        if let Some(n) = &self.noise_floor {
            let _ = writeln!(
                s,
                "Noise floor: KL(full {} ‖ full {}) {:.2e} per answer token = {:.4} of the {} blind KL {:.4} ({} blind KL {:.4}).\n",
                n.reference,
                n.other,
                n.kl,
                n.share_of_gap,
                n.reference,
                n.blind_kl_reference,
                n.other,
                n.blind_kl_other
            );
        }
        s.push_str("| method | KL(full‖m) | blind KL (same orderings) | orderings | gap recovered | ± s.e. | top-1 | exact match | answer logprob | bytes ratio | assemble ms | patch ms | break-even reuses | recompute share |\n");
        s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for spec in &self.method_order {
            let Some(m) = self.methods.get(spec) else { continue };
            let be = m.break_even_reuses.map_or("-".to_string(), |b| format!("{b:.2}"));
            let _ = writeln!(
                s,
                "| {spec} | {:.4} | {:.4} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.1} | {be} | {:.3} |",
                m.kl,
                m.blind_kl,
                m.orderings,
                m.gap_recovered,
                m.gap_se,
                m.top1,
                m.exact_match,
                m.answer_logprob,
                m.bytes_ratio,
                m.assemble_ms,
                m.patch_ms,
                m.recompute_share
            );
        }
        s.push_str(&self.pareto_markdown());
        if !self.diagnostics.orbit.is_empty() {
            s.push_str("\n## Why the orbit mean fails (per layer, full rank)\n\nNot-first chunk: ‖Δ − D‖²/‖Δ‖² for D = mean over every ordering / over the orderings where the chunk is not first / over those with the chunk at the same slot. First chunk: energy of the mean it is given, and of its true deficit, over its mean deficit energy at later slots.\n\n| layer | K mean | K later | K slot | V mean | V later | V slot | K first: mean given | V first: mean given | K first: true | V first: true |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
            for e in &self.diagnostics.orbit {
                let _ = writeln!(
                    s,
                    "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1e} | {:.1e} |",
                    e.layer,
                    e.k_err_mean,
                    e.k_err_later,
                    e.k_err_slot,
                    e.v_err_mean,
                    e.v_err_later,
                    e.v_err_slot,
                    e.k_first_spurious,
                    e.v_first_spurious,
                    e.k_first_true,
                    e.v_first_true
                );
            }
        }
        if !self.diagnostics.oracle_curve.is_empty() {
            s.push_str("\n## Oracle token curve (true conditioned KV for the most-deviating tokens)\n\n| token share | KL | gap recovered |\n|---:|---:|---:|\n");
            for p in &self.diagnostics.oracle_curve {
                let _ = writeln!(s, "| {:.2} | {:.4} | {:.3} |", p.share, p.kl, p.gap_recovered);
            }
        }
        if !self.diagnostics.deficit_energy.is_empty() {
            s.push_str("\n## Deficit spectrum per layer (energy share in the top 8/16/32 directions; deficit energy relative to the canonical KV)\n\n| layer | K top8 | K top16 | K top32 | V top8 | V top16 | V top32 | ‖ΔK‖²/‖K‖² | ‖ΔV‖²/‖V‖² |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
            for e in &self.diagnostics.deficit_energy {
                let _ = writeln!(
                    s,
                    "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.4} | {:.4} |",
                    e.layer,
                    e.k_top8,
                    e.k_top16,
                    e.k_top32,
                    e.v_top8,
                    e.v_top16,
                    e.v_top32,
                    e.k_rel_energy,
                    e.v_rel_energy
                );
            }
        }
        s
    }

    /// Methods that serve the pages from stored bytes alone (no recomputed token: not `full`,
    /// `prefix`, `cacheblend`, `epic`, which pay a forward pass on every reuse) with their added bytes (bytes ratio − 1), sorted by them; a method is on the
    /// Pareto front when no method adds fewer or equal bytes and recovers more of the gap.
    pub fn pareto(&self) -> Vec<(String, f64, f64, bool)> {
        let mut pts: Vec<(String, f64, f64)> = self
            .method_order
            .iter()
            .filter_map(|k| {
                self.methods
                    .get(k)
                    .filter(|m| m.recompute_share == 0.0)
                    .map(|m| (k.clone(), m.bytes_ratio - 1.0, m.gap_recovered))
            })
            .collect();
        pts.sort_by(|a, b| a.1.total_cmp(&b.1).then(b.2.total_cmp(&a.2)));
        pts.iter()
            .map(|(k, x, y)| {
                let dominated = pts
                    .iter()
                    .any(|(k2, x2, y2)| k2 != k && *x2 <= *x && (*y2 > *y || (*y2 == *y && *x2 < *x)));
                (k.clone(), *x, *y, !dominated)
            })
            .collect()
    }

    fn pareto_markdown(&self) -> String {
        let mut s = String::from(
            "\n## Pareto: gap recovered against bytes added (÷ the chunks' canonical KV bytes; methods without recompute)\n\n| method | added bytes | most added to one patched chunk | gap recovered | Pareto |\n|---|---:|---:|---:|:---:|\n",
        );
        for (k, x, y, front) in self.pareto() {
            let per = self.methods.get(&k).map_or(0.0, |m| m.chunk_bytes_max);
            let _ = writeln!(
                s,
                "| {k} | {x:.3} | {per:.4} | {y:.3} | {} |",
                if front { "●" } else { "" }
            );
        }
        s
    }

    /// Gap recovered (y) against bytes stored per chunk relative to its KV (x), one labelled
    /// point per method, the Pareto front joined by a line.
    pub fn svg(&self) -> String {
        let (w, h, ml, mr, mt, mb) = (720.0, 440.0, 70.0, 170.0, 40.0, 60.0);
        let pts: Vec<(&str, f64, f64)> = self
            .method_order
            .iter()
            .filter_map(|k| {
                self.methods
                    .get(k)
                    .map(|m| (k.as_str(), m.bytes_ratio, m.gap_recovered))
            })
            .collect();
        let xmax = pts.iter().map(|p| p.1).fold(1.0f64, f64::max) * 1.1;
        let ymin = pts.iter().map(|p| p.2).fold(0.0f64, f64::min).max(-2.0);
        let ymax = 1.05f64;
        let sx = |x: f64| ml + (x / xmax) * (w - ml - mr);
        let sy = |y: f64| mt + (ymax - y.max(ymin)) / (ymax - ymin) * (h - mt - mb);
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" font-size=\"14\">{}: gap recovered vs bytes stored ({} tasks)</text>\n",
            ml,
            xml(&self.model),
            self.tasks
        );
        let _ = writeln!(
            s,
            "<line x1=\"{ml}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{ml}\" y1=\"{mt}\" x2=\"{ml}\" y2=\"{}\" stroke=\"black\"/>",
            h - mb,
            w - mr,
            h - mb,
            h - mb
        );
        for i in 0..=5 {
            let x = xmax * i as f64 / 5.0;
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x:.2}</text>",
                sx(x),
                h - mb + 18.0
            );
            let y = ymin + (ymax - ymin) * i as f64 / 5.0;
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{y:.2}</text><line x1=\"{ml}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"#ddd\"/>",
                ml - 6.0,
                sy(y) + 4.0,
                sy(y),
                w - mr,
                sy(y)
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">bytes stored / chunk KV bytes</text><text x=\"18\" y=\"{:.1}\" transform=\"rotate(-90 18 {:.1})\" text-anchor=\"middle\">gap recovered (1 − KL/KL_blind)</text>",
            (ml + w - mr) / 2.0,
            h - 15.0,
            (mt + h - mb) / 2.0,
            (mt + h - mb) / 2.0
        );
        let colors = [
            "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf",
        ];
        for (i, (name, x, y)) in pts.iter().enumerate() {
            let c = colors[i % colors.len()];
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" fill=\"{c}\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"{c}\">{}</text>",
                sx(*x),
                sy(*y),
                sx(*x) + 7.0,
                sy(*y) - 6.0,
                xml(name)
            );
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{} ({x:.2}, {y:.2})</text>",
                w - mr + 10.0,
                mt + 16.0 * i as f64,
                xml(name)
            );
        }
        let front: Vec<(f64, f64)> = self
            .pareto()
            .into_iter()
            .filter(|p| p.3)
            .map(|p| (sx(p.1 + 1.0), sy(p.2)))
            .collect();
        if front.len() > 1 {
            let path: Vec<String> = front.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"#555\" stroke-dasharray=\"4 3\"/>",
                path.join(" ")
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
