//! Parsing the method language: `name:arg` and the patch modifiers after `/` (`q4`, `rf`,
//! `w=…`, `ls`, `klt`…), each checked against the others, with an error that names the spec.

use std::str::FromStr;

use kamera_ops::{DType, Grain, Grains, Quant, RankPolicy};

use super::{Method, OrbitKind, PatchSpec, Tail, Visit, Weighting};
use crate::error::{Error, Result};
use crate::mixed::Form;

pub(super) fn fraction(spec: &str, arg: &str) -> Result<f64> {
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

pub(super) fn count(spec: &str, arg: &str) -> Result<usize> {
    arg.parse().map_err(|_| Error::Method {
        spec: spec.into(),
        detail: format!("{arg:?} is not a non-negative integer"),
    })
}

/// `A+B` as two fractions, or `A` for both.
pub(super) fn pair(spec: &str, arg: &str) -> Result<(f64, f64)> {
    match arg.split_once('+') {
        Some((a, b)) => Ok((fraction(spec, a)?, fraction(spec, b)?)),
        None => {
            let a = fraction(spec, arg)?;
            Ok((a, a))
        }
    }
}

/// Four letters `d` (per-direction scales) or `g` (per-group scales) for K's P, K's Wᵀ, V's P
/// and V's Wᵀ.
pub(super) fn grains(spec: &str, s: &str) -> Result<Grains> {
    let g: Vec<Grain> = s
        .chars()
        .map(|c| match c {
            'd' => Ok(Grain::Direction),
            'g' => Ok(Grain::Group),
            _ => Err(()),
        })
        .collect::<std::result::Result<_, ()>>()
        .ok()
        .filter(|g: &Vec<Grain>| g.len() == 4)
        .ok_or_else(|| Error::Method {
            spec: spec.into(),
            detail: format!("q4={s}: four letters d or g expected (K's P, K's Wᵀ, V's P, V's Wᵀ)"),
        })?;
    Ok([[g[0], g[1]], [g[2], g[3]]])
}

pub(super) fn grain_letters(g: Grains) -> String {
    g.iter()
        .flatten()
        .map(|g| if *g == Grain::Direction { 'd' } else { 'g' })
        .collect()
}

// Long: one match arm per modifier of the method language, then the checks between modifiers.
pub(super) fn modifiers(spec: &str, mut p: PatchSpec, mods: &[&str]) -> Result<PatchSpec> {
    for m in mods {
        match *m {
            "q8" => p.quant = Quant::Int8,
            "q4" => p.quant = Quant::Int4,
            "q4d" | "q4g" | "q4a" => {
                p.quant = Quant::Int4Mixed;
                p.grain = match *m {
                    "q4d" => Some(Grain::Direction.everywhere()),
                    "q4g" => Some(Grain::Group.everywhere()),
                    _ => None,
                };
            }
            g if g.starts_with("q4=") => {
                p.quant = Quant::Int4Mixed;
                p.grain = Some(grains(spec, &g[3..])?);
            }
            "f32" => p.dtype = DType::F32,
            "f16" => p.dtype = DType::F16,
            "bf16" => p.dtype = DType::Bf16,
            d if d.starts_with("drop=") => p.drop_below = fraction(spec, &d[5..])?,
            "rf" => p.refit = true,
            t if t.starts_with("t2=") || t.starts_with("t3=") => {
                let x = fraction(spec, &t[3..])?;
                if x <= 0.0 {
                    return Err(Error::Method {
                        spec: spec.into(),
                        detail: format!("{t}: the 4-bit share of the budget must be > 0"),
                    });
                }
                p.tail = Some(Tail {
                    head_share: x,
                    bits: if t.starts_with("t2") { 2 } else { 3 },
                });
            }
            e if e == "da4" || (e.len() > 3 && e.as_bytes()[2] == b'=' && Form::parse(&e[..2]).is_some()) => {
                if p.mixed.is_some() {
                    return Err(Error::Method {
                        spec: spec.into(),
                        detail: format!("{e}: one of m8, d8, d4, da4 per method"),
                    });
                }
                p.mixed = match e.split_once('=') {
                    None => Some((Form::DenseAuto4, 0)),
                    Some((f, n)) => {
                        let n = count(spec, n)?;
                        Form::parse(f).filter(|_| n > 0).map(|f| (f, n))
                    }
                };
            }
            "klt" => p.klt = true,
            "klte" => {
                p.klt = true;
                p.klt_entropy = true;
            }
            "rel" => p.alloc.relative = true,
            "ls" => p.alloc.sensitivity = true,
            g if g.starts_with("kx=") || g.starts_with("gx=") => {
                let x: f64 = g[3..].parse().map_err(|_| Error::Method {
                    spec: spec.into(),
                    detail: format!("{g}: a number > 0 expected"),
                })?;
                if !(x.is_finite() && x > 0.0) {
                    return Err(Error::Method {
                        spec: spec.into(),
                        detail: format!("{g}: a layer gain must be finite and > 0"),
                    });
                }
                if g.starts_with('k') {
                    p.alloc.k_gain = x;
                } else {
                    p.alloc.global_gain = x;
                }
            }
            "w" => p.weighting = Weighting::parse(spec, Weighting::DEFAULT_LETTERS, p.weighting)?,
            w if w.starts_with("w=") => p.weighting = Weighting::parse(spec, &w[2..], p.weighting)?,
            "wq=cal" => p.weighting.k_cols_cal = true,
            "wq=calraw" => {
                p.weighting.k_cols_cal = true;
                p.weighting.cal_raw = true;
            }
            w if w.starts_with("wq=") => {
                return Err(Error::Method {
                    spec: spec.into(),
                    detail: format!(
                        "{w}: wq=cal (the --query-calibration table) is the one query source (wq=calraw: its factors quantised unweighted)"
                    ),
                });
            }
            c if c.starts_with("wc=") => {
                let x: f32 = c[3..].parse().map_err(|_| Error::Method {
                    spec: spec.into(),
                    detail: format!("wc={}: a number >= 1 expected", &c[3..]),
                })?;
                if !(x.is_finite() && x >= 1.0) {
                    return Err(Error::Method {
                        spec: spec.into(),
                        detail: "wc: the weight cap must be finite and >= 1".into(),
                    });
                }
                p.weighting.cap = Some(x);
            }
            f if f.starts_with("wf=") => {
                let x = fraction(spec, &f[3..])? as f32;
                if x <= 0.0 {
                    return Err(Error::Method {
                        spec: spec.into(),
                        detail: "wf: the weight floor must be > 0".into(),
                    });
                }
                p.weighting.floor = x;
            }
            other => {
                return Err(Error::Method {
                    spec: spec.into(),
                    detail: format!(
                        "unknown modifier {other:?} (q8, q4, q4d, q4g, q4a, q4=XXXX, f32, f16, bf16, drop=S, w, w=LETTERS, wq=cal, wf=F, wc=C, rf, t2=F, t3=F, m8=N, d8=N, d4=N, da4, klt, klte, rel, ls, kx=F, gx=F)"
                    ),
                });
            }
        }
    }
    let w = &p.weighting;
    if (w.plain_ranks || w.squared_mass || w.own_mass) && !w.any() {
        return Err(Error::Method {
            spec: spec.into(),
            detail: format!("w={}: weighs nothing (q, k, v, o or wq=cal)", w.letters()),
        });
    }
    if p.weighting.k_cols && p.weighting.k_cols_cal {
        return Err(Error::Method {
            spec: spec.into(),
            detail: "w=q and wq=cal both weigh K's columns: one of them".into(),
        });
    }
    if p.alloc.any() && !matches!(p.rank, RankPolicy::Budget { .. }) {
        return Err(Error::Method {
            spec: spec.into(),
            detail: "rel, ls, kx and gx weigh a byte budget's layers (kamera-budget only)".into(),
        });
    }
    if p.tail.is_some() && !(matches!(p.rank, RankPolicy::Budget { .. }) && p.quant == Quant::Int4 && p.refit) {
        return Err(Error::Method {
            spec: spec.into(),
            detail: "t2 and t3 split a byte budget of error-aware 4-bit factors (kamera-budget:B/q4/rf only)".into(),
        });
    }
    if p.mixed.is_some()
        && (!(matches!(p.rank, RankPolicy::Budget { .. }) && p.quant == Quant::Int4 && p.refit)
            || p.tail.is_some()
            || (p.weighting.k_cols_cal && !p.weighting.cal_raw))
    {
        return Err(Error::Method {
            spec: spec.into(),
            detail: "m8, d8, d4 and da4 mix matrix forms in a byte budget of error-aware 4-bit factors (kamera-budget:B/q4/rf, without t2/t3 or wq=cal)".into(),
        });
    }
    if p.klt
        && (!matches!(p.rank, RankPolicy::Budget { .. })
            || p.quant != Quant::None
            || p.refit
            || p.tail.is_some()
            || p.mixed.is_some()
            || p.weighting.k_cols
            || (p.weighting.k_cols_cal && p.weighting.cal_raw))
    {
        return Err(Error::Method {
            spec: spec.into(),
            detail: "klt codes a byte budget's deficit in the per-model basis (kamera-budget:B/klt, with ls, rel, kx, gx, row weights w=k, w=v and the per-model column metrics wq=cal, w=o; no factor quantisation, t2/t3, m8/d8/d4 or per-chunk query columns w=q)".into(),
        });
    }
    Ok(p)
}

impl FromStr for Method {
    type Err = Error;
    fn from_str(spec: &str) -> Result<Method> {
        let s = spec.trim();
        for visit in [Visit::Reordered, Visit::Foreign] {
            if let Some(inner) = s.strip_prefix(visit.prefix()) {
                return recall(spec, visit, inner);
            }
        }
        let mut parts = s.split('/');
        let head = parts.next().unwrap_or_default();
        let mods: Vec<&str> = parts.collect();
        let (name, arg) = match head.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (head, None),
        };
        let bad = |detail: String| Error::Method {
            spec: spec.into(),
            detail,
        };
        let need = || arg.ok_or_else(|| bad(format!("{name} needs an argument ({name}:VALUE)")));
        let patch = |rank: RankPolicy| modifiers(spec, PatchSpec::rank(rank), &mods);
        let orbit = |kind: OrbitKind| -> Result<Method> {
            let patch = patch(RankPolicy::Fixed(count(spec, need()?)?))?;
            if patch.weighting.any() {
                return Err(bad("orbit patches are not weighted (w is for kamera methods)".into()));
            }
            Ok(Method::Orbit { kind, patch })
        };
        let plain = |m: Method| {
            if arg.is_some() || !mods.is_empty() {
                Err(bad(format!("{name} takes no argument")))
            } else {
                Ok(m)
            }
        };
        let no_mods = |m: Method| {
            if mods.is_empty() {
                Ok(m)
            } else {
                Err(bad(format!("{name} takes no modifiers")))
            }
        };
        match name {
            "full" => plain(Method::Full),
            "prefix" => plain(Method::Prefix),
            "blind" => plain(Method::Blind),
            "kamera" => Ok(Method::Kamera(patch(RankPolicy::Fixed(count(spec, need()?)?))?)),
            "kamera-budget" => Ok(Method::Kamera(patch(RankPolicy::Budget {
                fraction: fraction(spec, need()?)?,
            })?)),
            "kamera-share" => Ok(Method::Kamera(patch(RankPolicy::BudgetShare {
                fraction: fraction(spec, need()?)?,
            })?)),
            "kamera-kv" => {
                let (k, v) = pair(spec, need()?)?;
                Ok(Method::Kamera(patch(RankPolicy::BudgetKv { k, v })?))
            }
            "kamera-energy" => {
                let (k, v) = pair(spec, need()?)?;
                Ok(Method::Kamera(patch(RankPolicy::Energy { k, v })?))
            }
            "orbit" => orbit(OrbitKind::Mean),
            "orbit-later" => orbit(OrbitKind::Later),
            "orbit-slot" => orbit(OrbitKind::Slot),
            "orbit-unseen" => orbit(OrbitKind::Unseen),
            "cacheblend" => no_mods(Method::CacheBlend {
                fraction: fraction(spec, need()?)?,
            }),
            "epic" => no_mods(Method::Epic {
                tokens: count(spec, need()?)?,
            }),
            "oracle-tokens" => no_mods(Method::OracleTokens {
                fraction: fraction(spec, need()?)?,
            }),
            "oracle-layer" | "oracle-except" => {
                let a = need()?;
                let (num, k, v) = match a.strip_suffix('k') {
                    Some(n) => (n, true, false),
                    None => match a.strip_suffix('v') {
                        Some(n) => (n, false, true),
                        None => (a, true, true),
                    },
                };
                no_mods(Method::OracleLayer {
                    layer: count(spec, num)?,
                    k,
                    v,
                    except: name == "oracle-except",
                })
            }
            "kvq" | "kvq-deficit" => no_mods(Method::KvQuant {
                fraction: fraction(spec, need()?)?,
                deficit: name == "kvq-deficit",
            }),
            _ => Err(bad("unknown method".into())),
        }
    }
}

/// `recall:SPEC` / `recall-foreign:SPEC`: SPEC a `kamera*` patch method without attention
/// weights (those come from a probed prefill in the scored context, which a first visit elsewhere
/// does not have).
pub(super) fn recall(spec: &str, visit: Visit, inner: &str) -> Result<Method> {
    let bad = |detail: &str| Error::Method {
        spec: spec.into(),
        detail: detail.into(),
    };
    match inner.parse::<Method>()? {
        Method::Kamera(p) if p.weighting.any() => Err(bad(
            "the runtime's case forms patches from the deficit alone (no w=, wq=)",
        )),
        Method::Kamera(patch) => Ok(Method::Recall { visit, patch }),
        _ => Err(bad(
            "recall takes a kamera patch method (recall:kamera-budget:0.095/q4/rf)",
        )),
    }
}
