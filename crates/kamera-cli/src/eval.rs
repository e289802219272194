//! `kamera eval`: every reuse method side by side on a task suite (kamera-lab), as JSON, an
//! optional Markdown report and an SVG plot of gap recovered against bytes stored.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Args;
use kamera_lab::{EvalConfig, Split, TaskRange, TaskSelection, evaluate, load_tasks, parse_methods};

/// Every method at the settings the targets name.
pub const DEFAULT_METHODS: &str = "full,prefix,blind,kamera:8,kamera:16,kamera:32,kamera-budget:0.1,kamera:32/q8,kamera:64/q4,kamera-budget:0.1/q4,orbit:32,orbit-later:32,orbit-slot:32,cacheblend:0.15,epic:32,oracle-tokens:0.5";

#[derive(Args)]
pub struct EvalArgs {
    /// Model name (smollm2-135m, qwen2.5-0.5b, gemma3-270m) or path to a .gguf file.
    #[arg(long)]
    model: String,
    /// JSONL task file: {"id", "chunks": [...], "question", "answer"} per line.
    #[arg(long)]
    tasks: PathBuf,
    /// Comma-separated methods: full, prefix, blind, kamera:R, kamera-budget:B, kamera-share:B,
    /// kamera-kv:BK+BV, kamera-energy:E[+EV], orbit:R, orbit-later:R, orbit-slot:R,
    /// orbit-unseen:R, cacheblend:F, epic:K, oracle-tokens:F. Patch methods take modifiers:
    /// /q8 or /q4 (quantised factors; /q4d, /q4g: 4-bit with per-direction or per-group scales,
    /// /q4a: chosen per factor matrix, /q4=XXXX: d or g for K's P, K's Wᵀ, V's P, V's Wᵀ),
    /// /f32 /f16 /bf16 (float factors; bf16 by default),
    /// /drop=S (drop layers holding under share S of the deficit energy), and more (the
    /// kamera-lab README): /w=LETTERS, /rf, /rel, /ls, /kx=F, /gx=F, /klt and /klte
    /// (transform-coded in --deficit-basis), /t2=F, /t3=F (mixed-bit factors, simulated bytes);
    /// oracle-layer:L[k|v],
    /// oracle-except:L[k|v] probe one layer's sensitivity. The runtime's case: recall:SPEC
    /// (each page's patch formed after the task's other pages in reverse order, scored in the
    /// task's order), recall-foreign:SPEC (formed after another task's pages); the equal-bytes
    /// baseline: kvq:B (each later page's conditioned KV quantised to B of its bf16 bytes),
    /// kvq-deficit:B (its deficit so). `runtime` stands for the patch method the runtime forms
    /// for this model (kamera-sched's cost model), also inside recall:runtime.
    #[arg(long, default_value = DEFAULT_METHODS)]
    methods: String,
    /// Where to write the JSON report (required unless --calibrate-queries or
    /// --calibrate-basis).
    #[arg(long, required_unless_present_any = ["calibrate_queries", "calibrate_basis"])]
    json: Option<PathBuf>,
    /// Also write a Markdown report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Where to write the SVG plot (default: the JSON path with .svg).
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Only the first N tasks (of the split or range, when given).
    #[arg(long)]
    limit: Option<usize>,
    /// A split of tasks/default.jsonl by position: dev (tasks 1-8, where configurations were
    /// picked), calibration (9-24: bases, sensitivity and query tables) or heldout (25-40, for
    /// headline figures). Recorded in the report.
    #[arg(long, conflicts_with = "task_range")]
    split: Option<Split>,
    /// Tasks A..=B (or A-B, or A..B with B excluded) of --tasks, 1-based. Recorded in the report.
    #[arg(long)]
    task_range: Option<TaskRange>,
    /// The most orderings of a task's pages an orbit is formed from (and its methods scored
    /// on): all of them when there are at most this many (up to 4 pages at 24), else this many
    /// sampled, the task's own first.
    #[arg(long, default_value_t = 24)]
    orbit_orderings: usize,
    /// CacheBlend's check layer.
    #[arg(long, default_value_t = 1)]
    check_layer: usize,
    /// Token shares of the oracle token curve (empty to skip).
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.1, 0.25, 0.5, 0.75])]
    oracle_curve: Vec<f64>,
    /// System prefix before the pages (shared by every method; the canonical KV of a page is
    /// prefilled after it). Empty for none.
    #[arg(long, default_value = kamera_lab::DEFAULT_SYSTEM)]
    system: String,
    /// Skip the deficit spectrum and the oracle curve.
    #[arg(long)]
    no_diagnostics: bool,
    /// A JSON report of a run with `oracle-except:Lk,oracle-except:Lv` for every layer L (on
    /// other tasks): the per-layer sensitivities `/ls` budgets weigh the layers by.
    #[arg(long)]
    layer_sensitivity: Option<PathBuf>,
    /// A table of the question queries' second moments (written by --calibrate-queries on
    /// other tasks than the scored ones): what `/wq=cal` weighs K's feature columns by.
    #[arg(long)]
    query_calibration: Option<PathBuf>,
    /// Measure that table on --tasks (calibration tasks) and write it here; runs no methods.
    #[arg(long)]
    calibrate_queries: Option<PathBuf>,
    /// A per-model deficit basis (written by --calibrate-basis on other tasks than the scored
    /// ones): the basis `/klt` patches are coded in.
    #[arg(long)]
    deficit_basis: Option<PathBuf>,
    /// Measure the deficit basis on --tasks (calibration tasks) and write it here (a JSON
    /// header line, then f32 second moments), with --layer-sensitivity's table when given (the
    /// runtime weighs layers by it); runs no methods. Installed as
    /// `$KAMERA_HOME/bases/<model>.bin`, `kamera run` codes the model's patches in it.
    #[arg(long)]
    calibrate_basis: Option<PathBuf>,
    /// Arithmetic of the model's long prefills (the chunks', the system prefix's, the full
    /// re-prefill's): `f32` (the operator's reference) or `bf16` (AVX512_BF16 CPUs, what the
    /// runtime runs); default the fastest this CPU runs. Recorded in the report.
    #[arg(long)]
    prefill_precision: Option<kamera_model::PrefillPrecision>,
    /// Also measure the noise floor: KL(full in f32 ‖ full in bf16) of the answer tokens as a
    /// share of the f32 blind KL, per task (recorded in the report).
    #[arg(long)]
    noise_floor: bool,
}

/// The patch methods the runtime forms for `model`: the cost model's choice among the model's
/// measured patch points (SmolLM2-135M's for a model never measured), without a basis.
fn runtime_methods(model: &kamera_model::Model) -> Vec<String> {
    let fp = kamera_store::ModelFp::of(model.base_fingerprint());
    let points = kamera_sched::measured_points(&fp).unwrap_or_else(kamera_sched::default_patch_points);
    let cost = kamera_sched::CostModel {
        patch_points: points,
        ..kamera_sched::CostModel::default()
    };
    cost.patch_point().map(|p| p.label.clone()).into_iter().collect()
}

/// `list` with every `runtime` (alone or after `recall:` / `recall-foreign:`) replaced by
/// `runtime`'s method.
fn expand_runtime(list: &str, runtime: &str) -> String {
    list.split(',')
        .map(|m| {
            let m = m.trim();
            match m.strip_suffix("runtime") {
                Some(head) if head.is_empty() || head.ends_with(':') => format!("{head}{runtime}"),
                _ => m.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The tasks of `a`'s file, split or range, and limit, and what was selected.
fn select_tasks(a: &EvalArgs) -> Result<(Vec<kamera_lab::Task>, TaskSelection)> {
    let mut tasks = load_tasks(&a.tasks)?;
    let range = a.split.map(Split::range).or(a.task_range);
    if let Some(r) = range {
        tasks = r.select(tasks)?;
    }
    if let Some(n) = a.limit {
        tasks.truncate(n);
    }
    let sel = TaskSelection {
        file: a.tasks.display().to_string(),
        split: a.split.map(|s| s.name().to_string()),
        range,
        limit: a.limit,
        ids: tasks.iter().map(|t| t.id.clone()).collect(),
    };
    Ok((tasks, sel))
}

// Long: reads every option of `kamera eval` into the evaluator's config, then runs and writes the report.
pub fn run(a: EvalArgs) -> Result<()> {
    let uses_runtime = a.methods.split(',').any(|m| m.trim().ends_with("runtime"));
    if !uses_runtime {
        parse_methods(&a.methods)?;
    }
    let (tasks, selection) = select_tasks(&a)?;
    let mut model = crate::models::load_with(&a.model, a.prefill_precision)?;
    eprintln!("{}: prefill precision {}", a.model, model.prefill_precision());
    let runtime = runtime_methods(&model);
    let methods = match runtime.first() {
        Some(r) => parse_methods(&expand_runtime(&a.methods, r))?,
        None => parse_methods(&a.methods)?,
    };
    let layer_sensitivity = match &a.layer_sensitivity {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let report: kamera_lab::Report =
                serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
            kamera_lab::layer_sensitivity(&report)?
        }
        None => Vec::new(),
    };
    let (query_calibration, query_calibration_tasks) = match &a.query_calibration {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let table: kamera_lab::QueryCalibration =
                serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
            let c = model.config();
            table.check(c.n_layers, c.heads * c.head_dim)?;
            let mut from = vec![table.model.clone()];
            from.extend(table.tasks);
            (table.q_sq, from)
        }
        None => (Vec::new(), Vec::new()),
    };
    let deficit_basis = match &a.deficit_basis {
        Some(p) => {
            let b = kamera_lab::DeficitBasis::load(p)?;
            b.check(&model.layout())?;
            Some(std::sync::Arc::new(b))
        }
        None => None,
    };
    let cfg = EvalConfig {
        orbit_orderings: a.orbit_orderings,
        check_layer: a.check_layer,
        oracle_curve: if a.no_diagnostics {
            vec![]
        } else {
            a.oracle_curve.clone()
        },
        diagnostics: !a.no_diagnostics,
        seed: 0,
        system: a.system.clone(),
        layer_sensitivity,
        query_calibration,
        query_calibration_tasks,
        deficit_basis_from: deficit_basis.as_ref().map(|b| b.header.clone()),
        deficit_basis,
    };
    if let Some(out) = &a.calibrate_basis {
        let bar = crate::progress::bar(tasks.len(), "calibration tasks");
        let basis =
            kamera_lab::calibrate_basis(&model, &a.model, &tasks, cfg, &mut |i| bar.set_position(i as u64 + 1))?;
        bar.finish_and_clear();
        basis.save(out)?;
        eprintln!(
            "deficit basis of {} layers from {} tasks written to {}",
            basis.header.layers,
            basis.header.tasks.len(),
            out.display()
        );
        return Ok(());
    }
    if let Some(out) = &a.calibrate_queries {
        let table = kamera_lab::calibrate_queries(&model, &a.model, &tasks, cfg)?;
        std::fs::write(out, serde_json::to_string(&table)?).with_context(|| format!("writing {}", out.display()))?;
        eprintln!(
            "query calibration of {} layers from {} tasks written to {}",
            table.q_sq.len(),
            table.tasks.len(),
            out.display()
        );
        return Ok(());
    }
    let json = a.json.clone().context("--json is required")?;
    let noise = if a.noise_floor {
        use kamera_model::PrefillPrecision::{Bf16, F32};
        let n = kamera_lab::precision_noise(&mut model, &tasks, &cfg, F32, Bf16)?;
        eprintln!(
            "noise floor: KL(full f32 || full bf16) {:.3e} = {:.4} of the f32 blind KL {:.4}",
            n.kl, n.share_of_gap, n.blind_kl_reference
        );
        Some(n)
    } else {
        None
    };
    let bar = crate::progress::bar(tasks.len(), "tasks");
    let mut report = evaluate(&model, &a.model, &tasks, &methods, cfg, &mut |i, r| {
        bar.set_position(i as u64 + 1);
        bar.set_message(format!("{} blind KL {:.3}", r.id, r.blind_kl));
        tracing::info!(task = %r.id, blind_kl = r.blind_kl, "task done");
    })?;
    bar.finish_and_clear();
    report.noise_floor = noise;
    report.selection = Some(selection);
    report.runtime_methods = runtime;
    let write = |p: &PathBuf, s: &str| std::fs::write(p, s).with_context(|| format!("writing {}", p.display()));
    write(&json, &serde_json::to_string_pretty(&report)?)?;
    let svg = a.svg.clone().unwrap_or_else(|| json.with_extension("svg"));
    write(&svg, &report.svg())?;
    let md = report.markdown();
    if let Some(r) = &a.report {
        let link = if svg.parent() == r.parent() {
            svg.file_name()
                .map_or(svg.display().to_string(), |f| f.to_string_lossy().into_owned())
        } else {
            svg.display().to_string()
        };
        write(r, &format!("{md}\n![gap recovered vs bytes]({link})\n"))?;
    }
    print!("{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::expand_runtime;

    #[test]
    fn runtime_stands_for_the_runtimes_method_alone_or_recalled() {
        let got = expand_runtime(
            "full, runtime,recall:runtime,recall-foreign:runtime,kamera:8,xruntime",
            "kamera-budget:0.095/q4/rf",
        );
        assert_eq!(
            got,
            "full,kamera-budget:0.095/q4/rf,recall:kamera-budget:0.095/q4/rf,recall-foreign:kamera-budget:0.095/q4/rf,kamera:8,xruntime"
        );
        assert!(kamera_lab::parse_methods(&got.replace(",xruntime", "")).is_ok());
    }
}
