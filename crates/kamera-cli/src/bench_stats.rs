//! What the benches share for timing on a shared machine: pairs of two methods measured in
//! alternation (so a slow spell falls on both sides alike) and the median with its spread.

use anyhow::Result;
use serde::Serialize;

use kamera_gpu::median;

use crate::bench_session_report::percentile;

/// The median of a set of measurements with its interquartile range and extremes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    /// First and third quartiles (nearest rank).
    pub q1: f64,
    pub q3: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    pub fn of(xs: &[f64]) -> Spread {
        let v = xs.to_vec();
        Spread {
            median: median(v.clone()),
            q1: percentile(v.clone(), 0.25),
            q3: percentile(v.clone(), 0.75),
            min: v.iter().copied().reduce(f64::min).unwrap_or(f64::NAN),
            max: v.iter().copied().reduce(f64::max).unwrap_or(f64::NAN),
            n: v.len(),
        }
    }

    /// `median [q1-q3]` with `digits` decimals.
    pub fn md(&self, digits: usize) -> String {
        format!("{:.d$} [{:.d$}-{:.d$}]", self.median, self.q1, self.q3, d = digits)
    }
}

/// `pairs` pairs of measurements of `a` and `b`, alternating which runs first (a b, b a, a b, ...)
/// so that neither side always meets the machine after the other; each closure returns the
/// milliseconds it timed (what it does untimed, before or after, is its own business).
pub fn paired(
    pairs: usize,
    mut a: impl FnMut() -> Result<f64>,
    mut b: impl FnMut() -> Result<f64>,
) -> Result<Vec<(f64, f64)>> {
    let mut out = Vec::with_capacity(pairs);
    for i in 0..pairs {
        out.push(if i % 2 == 0 {
            let x = a()?;
            (x, b()?)
        } else {
            let y = b()?;
            (a()?, y)
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_alternation() {
        let s = Spread::of(&[5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!((s.median, s.q1, s.q3, s.min, s.max, s.n), (3.0, 2.0, 4.0, 1.0, 5.0, 5));
        let order = std::cell::RefCell::new(String::new());
        let pairs = paired(
            4,
            || {
                order.borrow_mut().push('a');
                Ok(1.0)
            },
            || {
                order.borrow_mut().push('b');
                Ok(2.0)
            },
        )
        .unwrap();
        assert_eq!(order.into_inner(), "abbaabba");
        assert!(pairs.iter().all(|p| *p == (1.0, 2.0)));
    }
}
