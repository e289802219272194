//! Reuse methods, parsed from their command-line spelling (`kamera:32`, `cacheblend:0.15`...).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// How a method builds the context of a task's chunks.
#[derive(Debug, Clone, PartialEq)]
pub enum Method {
    /// Re-prefill of everything: the ceiling.
    Full,
    /// A prefix cache: reuse the exact token prefix (the first chunk, cached after the shared
    /// system prefix), recompute from the first mismatch.
    Prefix,
    /// Every chunk from its canonical KV, relocated, no patch.
    Blind,
    /// Blind plus a rank-R patch from one conditioned forward over the true antecedents.
    Kamera { rank: usize },
    /// Kamera with per-layer ranks under a byte budget (fraction of the chunk's KV bytes).
    KameraBudget { fraction: f64 },
    /// Kamera with per-layer K/V ranks under the same byte budget, chosen by each matrix's
    /// energy share (σ²/‖Δ‖²) per byte, so layers weigh equally whatever their KV scale.
    KameraShare { fraction: f64 },
    /// One orbit patch per chunk over sampled orderings, evaluated on an unseen ordering.
    Orbit { rank: usize },
    /// CacheBlend: recompute fraction F of each chunk's tokens, picked by KV deviation at a
    /// check layer, through the remaining layers.
    CacheBlend { fraction: f64 },
    /// EPIC LegoLink: recompute the first K tokens of each chunk.
    Epic { tokens: usize },
    /// Upper bound of token selection: the F most-deviating tokens of each chunk get their
    /// true conditioned KV in every layer.
    OracleTokens { fraction: f64 },
}

fn fraction(spec: &str, arg: &str) -> Result<f64> {
    let f: f64 = arg.parse().map_err(|_| Error::Method {
        spec: spec.into(),
        detail: format!("{arg:?} is not a number"),
    })?;
    if !(0.0..=1.0).contains(&f) {
        return Err(Error::Method {
            spec: spec.into(),
            detail: format!("fraction {f} outside 0..=1"),
        });
    }
    Ok(f)
}

fn count(spec: &str, arg: &str) -> Result<usize> {
    arg.parse().map_err(|_| Error::Method {
        spec: spec.into(),
        detail: format!("{arg:?} is not a non-negative integer"),
    })
}

impl FromStr for Method {
    type Err = Error;
    fn from_str(spec: &str) -> Result<Method> {
        let s = spec.trim();
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        fn need<'s>(spec: &str, name: &str, a: Option<&'s str>) -> Result<&'s str> {
            a.ok_or_else(|| Error::Method {
                spec: spec.into(),
                detail: format!("{name} needs an argument ({name}:VALUE)"),
            })
        }
        let none = |a: Option<&str>, m: Method| match a {
            None => Ok(m),
            Some(_) => Err(Error::Method {
                spec: spec.into(),
                detail: format!("{name} takes no argument"),
            }),
        };
        match name {
            "full" => none(arg, Method::Full),
            "prefix" => none(arg, Method::Prefix),
            "blind" => none(arg, Method::Blind),
            "kamera" => Ok(Method::Kamera {
                rank: count(spec, need(spec, name, arg)?)?,
            }),
            "kamera-budget" => Ok(Method::KameraBudget {
                fraction: fraction(spec, need(spec, name, arg)?)?,
            }),
            "kamera-share" => Ok(Method::KameraShare {
                fraction: fraction(spec, need(spec, name, arg)?)?,
            }),
            "orbit" => Ok(Method::Orbit {
                rank: count(spec, need(spec, name, arg)?)?,
            }),
            "cacheblend" => Ok(Method::CacheBlend {
                fraction: fraction(spec, need(spec, name, arg)?)?,
            }),
            "epic" => Ok(Method::Epic {
                tokens: count(spec, need(spec, name, arg)?)?,
            }),
            "oracle-tokens" => Ok(Method::OracleTokens {
                fraction: fraction(spec, need(spec, name, arg)?)?,
            }),
            _ => Err(Error::Method {
                spec: spec.into(),
                detail: "unknown method".into(),
            }),
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::Full => write!(f, "full"),
            Method::Prefix => write!(f, "prefix"),
            Method::Blind => write!(f, "blind"),
            Method::Kamera { rank } => write!(f, "kamera:{rank}"),
            Method::KameraBudget { fraction } => write!(f, "kamera-budget:{fraction}"),
            Method::KameraShare { fraction } => write!(f, "kamera-share:{fraction}"),
            Method::Orbit { rank } => write!(f, "orbit:{rank}"),
            Method::CacheBlend { fraction } => write!(f, "cacheblend:{fraction}"),
            Method::Epic { tokens } => write!(f, "epic:{tokens}"),
            Method::OracleTokens { fraction } => write!(f, "oracle-tokens:{fraction}"),
        }
    }
}

/// Parses a comma-separated list, keeping each method's spelling as given.
pub fn parse_methods(list: &str) -> Result<Vec<(String, Method)>> {
    let mut out: Vec<(String, Method)> = Vec::new();
    for spec in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let m: Method = spec.parse()?;
        if out.iter().any(|(s, _)| s == spec) {
            return Err(Error::Method {
                spec: spec.into(),
                detail: "listed twice".into(),
            });
        }
        out.push((spec.to_string(), m));
    }
    if out.is_empty() {
        return Err(Error::Method {
            spec: list.into(),
            detail: "no methods given".into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_method_and_rejects_bad_ones() {
        let ms = parse_methods(
            "full, prefix,blind,kamera:32,kamera-budget:0.1,orbit:16,cacheblend:0.15,epic:32,oracle-tokens:0.5",
        )
        .unwrap();
        assert_eq!(ms.len(), 9);
        assert_eq!(ms[3].1, Method::Kamera { rank: 32 });
        assert_eq!(ms[6].1, Method::CacheBlend { fraction: 0.15 });
        for bad in ["kamera", "kamera:x", "cacheblend:2", "blind:3", "nope", "", "full,full"] {
            assert!(parse_methods(bad).is_err(), "{bad}");
        }
    }
}
