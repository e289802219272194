//! Issue 35's pieces: the task splits select the right tasks of the default suite, the
//! equal-bytes quantiser keeps its byte budget and round-trips within its error bound (no model
//! needed), and the runtime's case and the equal-bytes baseline run on real weights.

use std::path::Path;

use anyhow::{Context as _, Result};
use kamera_lab::{
    EvalConfig, GenConfig, GroupQuant, Rng, Split, TaskRange, evaluate, generate, load_tasks, parse_methods,
};
use kamera_model::{Model, ModelName, default_home, fetch};

#[test]
fn splits_select_their_tasks_of_the_default_suite() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kamera-eval/tasks/default.jsonl");
    let all = load_tasks(&path).unwrap();
    for (split, first, last) in [
        (Split::Dev, 1, 8),
        (Split::Calibration, 9, 24),
        (Split::HeldOut, 25, 40),
    ] {
        assert_eq!(split.range(), TaskRange { first, last });
        assert_eq!(split.name().parse::<Split>().unwrap(), split);
        let got = split.range().select(all.clone()).unwrap();
        assert_eq!(got, all[first - 1..last].to_vec(), "{}", split.name());
    }
    for spelling in ["25..=40", "25-40", "25..41"] {
        assert_eq!(
            spelling.parse::<TaskRange>().unwrap(),
            Split::HeldOut.range(),
            "{spelling}"
        );
    }
    for bad in ["0..=3", "5..=3", "3", "a-b", "4..4", "heldout"] {
        assert!(bad.parse::<TaskRange>().is_err(), "{bad}");
    }
    assert!("test".parse::<Split>().is_err());
    let past = TaskRange { first: 100, last: 121 }.select(all).unwrap_err();
    assert!(past.to_string().contains("100..=121"), "{past}");
}

fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            // Box-Muller from two uniforms in (0, 1].
            let mut unit = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let (u, v) = (1.0 - unit(), unit());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32 + 0.3
        })
        .collect()
}

#[test]
fn equal_bytes_quantiser_keeps_its_budget_and_round_trips() {
    let n = 3 * 64 * 300;
    let x = gaussian(n, 5);
    let energy: f64 = x.iter().map(|v| (*v as f64 - 0.3).powi(2)).sum();
    // (share of the bf16 bytes, code width, the bound on ‖x − x̂‖² / ‖x − 0.3‖²): 1-bit codes
    // of a Gaussian keep at best 1 − 2/π ≈ 0.36 of its energy as error.
    for (fraction, bits, bound) in [(0.096, 1, 0.40), (0.3, 4, 0.02), (0.6, 8, 1e-4)] {
        let budget = (fraction * (2 * n) as f64) as usize;
        let q = GroupQuant::for_budget(n, budget).unwrap();
        assert_eq!(q.bits, bits, "{fraction}");
        let bytes = q.bytes(n);
        assert!(
            bytes <= budget && bytes as f64 >= 0.99 * budget as f64,
            "{fraction}: {bytes} of {budget}"
        );
        let y = q.round_trip(&x);
        let err: f64 = x.iter().zip(&y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        assert!(err / energy < bound, "{fraction}: relative error {}", err / energy);
    }
    // At ~10% of bf16: 1-bit codes in groups of ~60 values (1.54 bits a value).
    let q = GroupQuant::for_budget(n, (0.096 * (2 * n) as f64) as usize).unwrap();
    assert!((55..=70).contains(&q.group), "{q:?}");
    assert!(GroupQuant::for_budget(n, n / 8).is_err());
    assert!(GroupQuant::for_budget(0, 100).is_err());
    // A constant group reads back exactly (up to the f16 offset).
    assert_eq!(q.round_trip(&[0.5; 64]), vec![0.5; 64]);
}

fn model() -> Result<Model> {
    let home = default_home();
    let path = fetch(ModelName::Smollm2_135m, &home)
        .with_context(|| format!("fetching smollm2-135m into {}", home.display()))?;
    Ok(Model::load(&path)?)
}

#[test]
fn runtimes_case_and_equal_bytes_baseline_run_on_smollm2() -> Result<()> {
    let m = model()?;
    let tasks = generate(&GenConfig {
        seed: 13,
        tasks: 2,
        pages: 3,
        filler: 0,
    });
    let cfg = EvalConfig {
        diagnostics: false,
        oracle_curve: vec![],
        ..EvalConfig::default()
    };
    let methods = parse_methods(
        "blind,kamera-budget:0.2/q4/rf,recall:kamera-budget:0.2/q4/rf,recall-foreign:kamera-budget:0.2/q4/rf,kvq:0.1,kvq-deficit:0.6",
    )?;
    // One task: the reordered first visit runs; another task's pages are needed for foreign.
    let one = evaluate(
        &m,
        "smollm2-135m",
        &tasks[..1],
        &methods[..3],
        cfg.clone(),
        &mut |_, _| {},
    )?;
    let r = &one.methods["recall:kamera-budget:0.2/q4/rf"];
    assert!(
        r.kl.is_finite() && r.chunk_bytes_max > 0.0 && r.chunk_bytes_max < 0.21,
        "{r:?}"
    );
    let err = evaluate(&m, "smollm2-135m", &tasks[..1], &methods, cfg.clone(), &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("another task"), "{err}");
    let two = evaluate(&m, "smollm2-135m", &tasks, &methods, cfg, &mut |_, _| {})?;
    let g = |s: &str| two.methods[s].gap_recovered;
    // The page's own deficit at 8 bits is nearly exact; the patch formed in place beats blind.
    assert!(g("kvq-deficit:0.6") > 0.9, "kvq-deficit:0.6 {}", g("kvq-deficit:0.6"));
    assert!(g("kamera-budget:0.2/q4/rf") > 0.5, "{}", g("kamera-budget:0.2/q4/rf"));
    let q = &two.methods["kvq:0.1"];
    assert!(
        q.chunk_bytes_max > 0.09 && q.chunk_bytes_max <= 0.1,
        "kvq:0.1 per chunk {}",
        q.chunk_bytes_max
    );
    assert!(two.methods["recall-foreign:kamera-budget:0.2/q4/rf"].kl.is_finite());
    assert!(two.methods.values().all(|m| m.gap_se.is_finite() && m.gap_se >= 0.0));
    Ok(())
}
