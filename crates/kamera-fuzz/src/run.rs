//! The runner: mutates seeds, decodes each input under `catch_unwind` and the counting
//! allocator, and counts what held. A run is reproducible from its RNG seed and count.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use crate::alloc::measure;
use crate::mutate::Mutator;
use crate::targets::{Outcome, Target};

/// One input that broke a rule.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Index of the input in the run (replay with the same seed and count).
    pub input: u64,
    /// `panic`, `alloc` or `invariant`.
    pub kind: &'static str,
    pub detail: String,
    pub bytes: Vec<u8>,
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub target: String,
    pub seed: u64,
    pub inputs: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub panics: u64,
    pub over_bound: u64,
    pub invariant: u64,
    /// Distinct error texts (first 48 characters): a rough count of the paths exercised.
    pub distinct_errors: usize,
    /// The most bytes one decode held live, and that input's length; None without the counting
    /// allocator installed.
    pub peak_alloc: Option<(usize, usize)>,
    pub bound_text: String,
    pub slowest: Duration,
    pub slowest_len: usize,
    pub elapsed: Duration,
    /// The first failures (at most 8), with their inputs.
    pub failures: Vec<Failure>,
}

impl Report {
    /// No panic, nothing over the allocation bound, every invariant held.
    pub fn held(&self) -> bool {
        self.panics == 0 && self.over_bound == 0 && self.invariant == 0
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peak = match self.peak_alloc {
            Some((p, n)) => format!("{:.1} MiB (input {n} B)", p as f64 / (1 << 20) as f64),
            None => "not measured".into(),
        };
        writeln!(
            f,
            "{:<10} {} inputs (seed {}): {} accepted, {} rejected ({} distinct errors); {} panics, {} over the \
             allocation bound ({}), {} invariant failures; peak {peak}; slowest {:.1} ms ({} B); {:.1} s",
            self.target,
            self.inputs,
            self.seed,
            self.accepted,
            self.rejected,
            self.distinct_errors,
            self.panics,
            self.over_bound,
            self.bound_text,
            self.invariant,
            self.slowest.as_secs_f64() * 1e3,
            self.slowest_len,
            self.elapsed.as_secs_f64()
        )?;
        for x in &self.failures {
            writeln!(f, "  input {} {}: {}", x.input, x.kind, x.detail)?;
        }
        Ok(())
    }
}

/// Runs targets with a seeded mutator.
#[derive(Debug)]
pub struct Runner {
    seed: u64,
}

impl Runner {
    pub fn new(seed: u64) -> Runner {
        Runner { seed }
    }

    /// Decodes `count` inputs: every seed as is first, then mutated seeds.
    pub fn run(&self, target: &Target, count: u64) -> Report {
        let mut m = Mutator::new(self.seed);
        let mut r = Report {
            target: target.name.to_string(),
            seed: self.seed,
            bound_text: target.bound_text.to_string(),
            ..Report::default()
        };
        let mut errors = BTreeSet::new();
        let start = Instant::now();
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        for i in 0..count {
            let input = if (i as usize) < target.seeds.len() {
                target.seeds[i as usize].clone()
            } else {
                let s = &target.seeds[m.below(target.seeds.len())];
                let mut b = m.mutate(s, &target.seeds, &target.dict);
                if let Some(fix) = target.fixup
                    && m.below(10) != 0
                {
                    fix(&mut b);
                }
                b
            };
            let t0 = Instant::now();
            let (out, peak) = measure(|| catch_unwind(AssertUnwindSafe(|| (target.decode)(&input))));
            let dt = t0.elapsed();
            if dt > r.slowest {
                (r.slowest, r.slowest_len) = (dt, input.len());
            }
            r.inputs += 1;
            let fail = |kind: &'static str, detail: String, r: &mut Report| {
                if r.failures.len() < 8 {
                    r.failures.push(Failure {
                        input: i,
                        kind,
                        detail: detail.chars().take(600).collect(),
                        bytes: input.clone(),
                    });
                }
            };
            if let Some(p) = peak {
                if r.peak_alloc.is_none_or(|(q, _)| p > q) {
                    r.peak_alloc = Some((p, input.len()));
                }
                let bound = (target.bound)(input.len());
                if p > bound {
                    r.over_bound += 1;
                    fail(
                        "alloc",
                        format!("held {p} bytes live for a {} byte input (bound {bound})", input.len()),
                        &mut r,
                    );
                }
            }
            match out {
                Ok(Ok(Outcome::Accepted)) => r.accepted += 1,
                Ok(Ok(Outcome::Rejected(e))) => {
                    r.rejected += 1;
                    errors.insert(e.chars().filter(|c| !c.is_ascii_digit()).take(48).collect::<String>());
                }
                Ok(Err(broken)) => {
                    r.invariant += 1;
                    fail("invariant", broken, &mut r);
                }
                Err(payload) => {
                    r.panics += 1;
                    let msg = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "(non-string panic)".into());
                    fail("panic", msg, &mut r);
                }
            }
        }
        std::panic::set_hook(hook);
        r.distinct_errors = errors.len();
        r.elapsed = start.elapsed();
        r
    }
}
