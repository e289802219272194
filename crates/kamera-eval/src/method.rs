//! Reuse methods, parsed from their command-line spelling (`kamera:32`, `cacheblend:0.15`...).

use std::fmt;
use std::str::FromStr;

use kamera_ops::{DType, Grain, Grains, PatchConfig, Quant, RankPolicy};

use crate::alloc::Alloc;
use crate::mixed::Form;

use crate::error::{Error, Result};

/// How a patch method forms and stores its patches: the rank policy, the float dtype of the
/// factors (bf16 by default, as kamera-store writes them), quantisation and dropped layers.
/// Spelled `NAME:ARG[/q8|/q4|/q4d|/q4g|/q4a|/q4=XXXX][/f32|/f16|/bf16][/drop=S]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchSpec {
    pub rank: RankPolicy,
    pub dtype: DType,
    pub quant: Quant,
    /// The scale layouts of `Int4Mixed` factors (`None`: chosen per factor matrix).
    pub grain: Option<Grains>,
    /// Layers whose K (V) deficit holds less than this share of the chunk's are dropped.
    pub drop_below: f64,
    /// Attention-aware weights of the factorisation (`/w`, `/w=LETTERS`); none by default.
    pub weighting: Weighting,
    /// Quantised factors: Wᵀ refitted to the quantised P (`/rf`; kamera-ops `quantise_refit`).
    pub refit: bool,
    /// How a byte budget weighs the layers (`/rel`, `/ls`, `/kx=F`, `/gx=F`; `kamera-budget`
    /// only).
    pub alloc: Alloc,
    /// Mixed-bit factors, simulated (`/t2=F`, `/t3=F`; `kamera-budget` with `/q4/rf` only):
    /// share F of the budget on 4-bit directions, the rest on 2-bit (ternary) or 3-bit ones
    /// after them.
    pub tail: Option<Tail>,
    /// Mixed storage per matrix, simulated (`/m8=N`, `/d8=N`, `/d4=N`; `kamera-budget` with
    /// `/q4/rf` only): the N (layer, K/V) matrices with the largest `--layer-sensitivity` get
    /// int8 factors, or their dense deficit in int8 or int4, the rest int4 factors, in one byte
    /// budget.
    pub mixed: Option<(Form, usize)>,
    /// Transform-coded patches, simulated (`/klt`; `kamera-budget` only): the deficit in the
    /// per-model basis of `--deficit-basis`, its coefficient columns at bit widths from the
    /// byte budget (kamera-eval `klt`).
    pub klt: bool,
    /// With `klt`: entropy-coded records (`/klte`): codes and width map Huffman-coded where that is
    /// shorter.
    pub klt_entropy: bool,
}

/// The split of a mixed-bit budget ([`PatchSpec::tail`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tail {
    /// Share of the byte budget on the 4-bit directions the budget's greedy picks (1: none
    /// after them, the int4 patch).
    pub head_share: f64,
    /// Bits of each tail code: 2 (codes −1..=1) or 3 (−3..=3).
    pub bits: u8,
}

/// Which attention statistics of the conditioned prefill weigh the deficit's factorisation
/// (kamera-ops `Svd::compute_weighted`): letters `q` (K's feature columns by the second moment
/// of the queries of the chunk's own and later tokens, per RoPE pair), `k` / `v` (K's / V's token
/// rows by the attention each token receives from the later tokens' queries), `2` (rows by
/// Σ a² instead of Σ a), `o` (V's feature columns by the output projection's column norms),
/// `p` (ranks chosen from the plain spectra, directions from the weighted ones), `a` (rows by
/// the attention of the chunk's own tokens' queries too).
/// `/wq=cal` weighs K's feature columns by a per-model table of the question queries' second
/// moments measured on calibration tasks (`--query-calibration`; kamera-eval `qcal`) instead.
/// `floor` bounds every weight below, relative to their mean of 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weighting {
    pub k_cols: bool,
    /// K's feature columns from the calibration table (`/wq=cal`). Quantised factors are then
    /// stored in the weighted domain (K's Wᵀ columns times √c before quantising, divided by √c
    /// when read: the table is a per-model constant, so a record needs no extra bytes), unless
    /// `cal_raw` (`/wq=calraw`: the unweighted factors quantised, as for `w=q`).
    pub k_cols_cal: bool,
    pub cal_raw: bool,
    pub k_rows: bool,
    pub v_rows: bool,
    pub v_cols: bool,
    pub squared_mass: bool,
    /// Ranks from the plain spectra (the policy's allocation as unweighted), directions from the
    /// weighted ones (`p`).
    pub plain_ranks: bool,
    /// Rows by the attention of the chunk's own and later tokens' queries, not only the later
    /// ones' (`a`).
    pub own_mass: bool,
    pub floor: f32,
    /// Bounds every weight above, relative to their mean of 1 (`/wc=X`; none by default).
    pub cap: Option<f32>,
}

/// The floor of a weight relative to the mean weight (1) when none is given.
pub const WEIGHT_FLOOR: f32 = 0.2;

impl Default for Weighting {
    fn default() -> Weighting {
        Weighting {
            k_cols: false,
            k_cols_cal: false,
            cal_raw: false,
            k_rows: false,
            v_rows: false,
            v_cols: false,
            squared_mass: false,
            plain_ranks: false,
            own_mass: false,
            floor: WEIGHT_FLOOR,
            cap: None,
        }
    }
}

impl Weighting {
    /// What `/w` alone means.
    pub const DEFAULT_LETTERS: &'static str = "qkv";
    pub fn any(&self) -> bool {
        self.k_cols || self.k_cols_cal || self.k_rows || self.v_rows || self.v_cols
    }
    /// Whether the weights need the task's probed prefill (everything but `/wq=cal`).
    pub fn needs_probe(&self) -> bool {
        self.k_cols || self.k_rows || self.v_rows || self.v_cols
    }
    /// `letters` on top of `prev`'s floor, cap and calibrated K columns.
    fn parse(spec: &str, letters: &str, prev: Weighting) -> Result<Weighting> {
        let mut w = Weighting {
            floor: prev.floor,
            cap: prev.cap,
            k_cols_cal: prev.k_cols_cal,
            cal_raw: prev.cal_raw,
            ..Weighting::default()
        };
        for c in letters.chars() {
            match c {
                'q' => w.k_cols = true,
                'k' => w.k_rows = true,
                'v' => w.v_rows = true,
                'o' => w.v_cols = true,
                '2' => w.squared_mass = true,
                'p' => w.plain_ranks = true,
                'a' => w.own_mass = true,
                _ => {
                    return Err(Error::Method {
                        spec: spec.into(),
                        detail: format!("w={letters}: letters q, k, v, o, 2, p, a expected"),
                    });
                }
            }
        }
        Ok(w)
    }
    fn letters(&self) -> String {
        [
            (self.k_cols, 'q'),
            (self.k_rows, 'k'),
            (self.v_rows, 'v'),
            (self.v_cols, 'o'),
            (self.squared_mass, '2'),
            (self.plain_ranks, 'p'),
            (self.own_mass, 'a'),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, c)| *c)
        .collect()
    }
}

impl PatchSpec {
    pub fn rank(rank: RankPolicy) -> PatchSpec {
        PatchSpec {
            rank,
            dtype: DType::Bf16,
            quant: Quant::None,
            grain: None,
            drop_below: 0.0,
            weighting: Weighting::default(),
            refit: false,
            alloc: Alloc::default(),
            tail: None,
            mixed: None,
            klt: false,
            klt_entropy: false,
        }
    }
    /// The operator's patch settings.
    pub fn config(&self) -> PatchConfig {
        PatchConfig {
            rank: self.rank.clone(),
            dtype: self.dtype,
            quant: self.quant,
            grain: self.grain,
            drop_below: self.drop_below,
            refit: self.refit,
            basis: None,
        }
    }
}

/// Which orbit patch a chunk gets (KAMERA.md, "Reorder"); every ordering sampled for the set
/// (all of them for up to 4 chunks) is prefilled once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrbitKind {
    /// The paper's orbit patch: the mean deficit over every ordering of the set, one patch per
    /// chunk, evaluated on every ordering of the set.
    Mean,
    /// The mean over the orderings that do not put the chunk first, applied only when it is not
    /// first (a chunk right after the shared prefix has no deficit): one patch per chunk.
    Later,
    /// One patch per slot of the chunk within the set (the mean over the orderings that put it
    /// there; none for the first slot): set size − 1 patches per chunk.
    Slot,
    /// The old out-of-orbit check: the mean over the sampled orderings other than the task's,
    /// evaluated on the task's ordering only.
    Unseen,
}

impl OrbitKind {
    fn name(self) -> &'static str {
        match self {
            OrbitKind::Mean => "orbit",
            OrbitKind::Later => "orbit-later",
            OrbitKind::Slot => "orbit-slot",
            OrbitKind::Unseen => "orbit-unseen",
        }
    }
}

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
    /// Blind plus one patch per chunk from one conditioned forward over its true antecedents:
    /// `kamera:R` (fixed rank), `kamera-budget:B` (greedy σ² per byte under B × the chunk's KV
    /// bytes), `kamera-share:B` (greedy by energy share), `kamera-kv:BK+BV` (K and V budgets
    /// apart), `kamera-energy:E` or `kamera-energy:EK+EV` (per-matrix energy share).
    Kamera(PatchSpec),
    /// Orbit patches of rank R: `orbit:R`, `orbit-later:R`, `orbit-slot:R`, `orbit-unseen:R`.
    Orbit { kind: OrbitKind, patch: PatchSpec },
    /// CacheBlend: recompute fraction F of each chunk's tokens, picked by KV deviation at a
    /// check layer, through the remaining layers.
    CacheBlend { fraction: f64 },
    /// EPIC LegoLink: recompute the first K tokens of each chunk.
    Epic { tokens: usize },
    /// Upper bound of token selection: the F most-deviating tokens of each chunk get their
    /// true conditioned KV in every layer.
    OracleTokens { fraction: f64 },
    /// A layer-sensitivity probe: blind, with the true conditioned K and/or V of one layer
    /// (`oracle-layer:L`, `oracle-layer:Lk`, `oracle-layer:Lv`); with `except`, the conditioned
    /// KV with that layer's K and/or V blind (`oracle-except:L`...).
    OracleLayer {
        layer: usize,
        k: bool,
        v: bool,
        except: bool,
    },
    /// The runtime's case (`recall:SPEC`, `recall-foreign:SPEC`; kamera-eval `recall`): each
    /// page's patch formed at a first visit in another context A, then applied after its
    /// canonical KV is recalled into the task's ordering B.
    Recall { visit: Visit, patch: PatchSpec },
    /// The equal-bytes baseline (`kvq:B`; kamera-eval `kvq`): each page's conditioned KV itself
    /// (`kvq-deficit:B`: its deficit on top of the relocated canonical KV) stored in B of its
    /// bf16 KV bytes by a per-group uniform quantiser.
    KvQuant { fraction: f64, deficit: bool },
}

/// Context A of the runtime's case: what preceded the page at its first visit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// The task's other pages, in the reverse of their order in the task (`recall:`).
    Reordered,
    /// The first pages of another task of the run, as many as precede the page in the task
    /// (`recall-foreign:`).
    Foreign,
}

impl Visit {
    fn prefix(self) -> &'static str {
        match self {
            Visit::Reordered => "recall:",
            Visit::Foreign => "recall-foreign:",
        }
    }
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

/// `A+B` as two fractions, or `A` for both.
fn pair(spec: &str, arg: &str) -> Result<(f64, f64)> {
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
fn grains(spec: &str, s: &str) -> Result<Grains> {
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

fn grain_letters(g: Grains) -> String {
    g.iter()
        .flatten()
        .map(|g| if *g == Grain::Direction { 'd' } else { 'g' })
        .collect()
}

fn modifiers(spec: &str, mut p: PatchSpec, mods: &[&str]) -> Result<PatchSpec> {
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
fn recall(spec: &str, visit: Visit, inner: &str) -> Result<Method> {
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

impl fmt::Display for PatchSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.quant {
            Quant::Int8 => write!(f, "/q8")?,
            Quant::Int4 => write!(f, "/q4")?,
            Quant::Int4Mixed => match self.grain {
                Some(g) if g == Grain::Direction.everywhere() => write!(f, "/q4d")?,
                Some(g) if g == Grain::Group.everywhere() => write!(f, "/q4g")?,
                Some(g) => write!(f, "/q4={}", grain_letters(g))?,
                None => write!(f, "/q4a")?,
            },
            Quant::None => match self.dtype {
                DType::Bf16 => {}
                DType::F32 => write!(f, "/f32")?,
                DType::F16 => write!(f, "/f16")?,
            },
        }
        if self.drop_below > 0.0 {
            write!(f, "/drop={}", self.drop_below)?;
        }
        if !self.weighting.letters().is_empty() {
            write!(f, "/w={}", self.weighting.letters())?;
        }
        if self.weighting.k_cols_cal {
            write!(f, "/wq={}", if self.weighting.cal_raw { "calraw" } else { "cal" })?;
        }
        if self.weighting.floor != WEIGHT_FLOOR {
            write!(f, "/wf={}", self.weighting.floor)?;
        }
        if let Some(c) = self.weighting.cap {
            write!(f, "/wc={c}")?;
        }
        if self.refit {
            write!(f, "/rf")?;
        }
        if let Some(t) = self.tail {
            write!(f, "/t{}={}", t.bits, t.head_share)?;
        }
        match self.mixed {
            Some((form, _)) if form.auto() => write!(f, "/{}", form.letters())?,
            Some((form, n)) => write!(f, "/{}={n}", form.letters())?,
            None => {}
        }
        if self.klt {
            write!(f, "/{}", if self.klt_entropy { "klte" } else { "klt" })?;
        }
        if self.alloc.relative {
            write!(f, "/rel")?;
        }
        if self.alloc.sensitivity {
            write!(f, "/ls")?;
        }
        if self.alloc.k_gain != 1.0 {
            write!(f, "/kx={}", self.alloc.k_gain)?;
        }
        if self.alloc.global_gain != 1.0 {
            write!(f, "/gx={}", self.alloc.global_gain)?;
        }
        Ok(())
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Method::Full => write!(f, "full"),
            Method::Prefix => write!(f, "prefix"),
            Method::Blind => write!(f, "blind"),
            Method::Kamera(p) => {
                match &p.rank {
                    RankPolicy::Fixed(r) => write!(f, "kamera:{r}")?,
                    RankPolicy::Budget { fraction } => write!(f, "kamera-budget:{fraction}")?,
                    RankPolicy::BudgetShare { fraction } => write!(f, "kamera-share:{fraction}")?,
                    RankPolicy::BudgetKv { k, v } => write!(f, "kamera-kv:{k}+{v}")?,
                    RankPolicy::BudgetGains { fraction, .. } => write!(f, "kamera-budget:{fraction}")?,
                    RankPolicy::Energy { k, v } => write!(f, "kamera-energy:{k}+{v}")?,
                    RankPolicy::PerLayer(rs) => write!(f, "kamera-per-layer:{rs:?}")?,
                    RankPolicy::PerLayerKv(rs) => write!(f, "kamera-per-layer-kv:{rs:?}")?,
                }
                write!(f, "{p}")
            }
            Method::Orbit { kind, patch } => match &patch.rank {
                RankPolicy::Fixed(r) => write!(f, "{}:{r}{patch}", kind.name()),
                other => write!(f, "{}:{other:?}{patch}", kind.name()),
            },
            Method::CacheBlend { fraction } => write!(f, "cacheblend:{fraction}"),
            Method::Epic { tokens } => write!(f, "epic:{tokens}"),
            Method::OracleTokens { fraction } => write!(f, "oracle-tokens:{fraction}"),
            Method::OracleLayer { layer, k, v, except } => {
                let ch = match (k, v) {
                    (true, false) => "k",
                    (false, true) => "v",
                    _ => "",
                };
                let name = if *except { "oracle-except" } else { "oracle-layer" };
                write!(f, "{name}:{layer}{ch}")
            }
            Method::Recall { visit, patch } => {
                write!(f, "{}{}", visit.prefix(), Method::Kamera(patch.clone()))
            }
            Method::KvQuant { fraction, deficit } => {
                write!(f, "kvq{}:{fraction}", if *deficit { "-deficit" } else { "" })
            }
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
            "full, prefix,blind,kamera:32,kamera-budget:0.1,orbit:16,cacheblend:0.15,epic:32,oracle-tokens:0.5,\
             kamera:32/q4/drop=0.01,kamera-kv:0.02+0.06/q8,kamera-energy:0.9,orbit-slot:8/f32,kamera:4/f16,\
             kamera:32/q4d,kamera-budget:0.1/q4a,orbit-slot:16/q4g,kamera:8/q4=gddg,kamera-budget:0.1/q4/w,\
             kamera:32/w=qkvo2/wf=0.1/q8/rf,kamera-budget:0.095/q4/rf/rel/ls/kx=2/gx=0.5,oracle-layer:3,oracle-layer:17v,oracle-except:2k,\
             kamera-budget:0.1/q4/rf/ls/t2=0.6,kamera-budget:0.1/q4/rf/t3=0.5,kamera-budget:0.1/q4/wq=cal/rf/ls,\
             kamera-budget:0.1/q4/wq=cal/w=v/wf=0.5/rf,kamera-budget:0.1/q4/w=p/wq=cal,kamera:8/q4/wq=calraw,\
             kamera-budget:0.098/q4/rf/ls/gx=2/m8=2,kamera-budget:0.1/q4/rf/d4=3,kamera-budget:0.1/q4/rf/ls/da4,\
             recall:kamera-budget:0.095/q4/rf,recall-foreign:kamera:8,kvq:0.096,kvq-deficit:0.1",
        )
        .unwrap();
        assert_eq!(ms.len(), 37);
        let Method::Recall { visit, patch } = &ms[33].1 else {
            panic!()
        };
        assert_eq!(
            (*visit, patch.quant, patch.refit),
            (Visit::Reordered, Quant::Int4, true)
        );
        assert_eq!(ms[34].1.to_string(), "recall-foreign:kamera:8");
        assert_eq!(
            ms[35].1,
            Method::KvQuant {
                fraction: 0.096,
                deficit: false
            }
        );
        assert_eq!(ms[36].1.to_string(), "kvq-deficit:0.1");
        let klt =
            parse_methods("kamera-budget:0.098/klt/wq=cal/wf=1/ls,kamera-budget:0.1/klt/w=vo,kamera-budget:0.1/klte")
                .unwrap();
        let Method::Kamera(e) = &klt[2].1 else { panic!() };
        assert!(e.klt && e.klt_entropy);
        assert_eq!(klt[2].1.to_string(), "kamera-budget:0.1/klte");
        let Method::Kamera(k) = &klt[0].1 else { panic!() };
        assert!(k.klt && k.weighting.k_cols_cal && k.alloc.sensitivity && k.quant == Quant::None);
        assert_eq!(klt[0].1.to_string(), "kamera-budget:0.098/wq=cal/wf=1/klt/ls");
        assert_eq!(klt[1].1.to_string(), "kamera-budget:0.1/w=vo/klt");
        let Method::Kamera(da) = &ms[32].1 else { panic!() };
        assert_eq!(da.mixed, Some((Form::DenseAuto4, 0)));
        assert_eq!(ms[32].1.to_string(), "kamera-budget:0.1/q4/rf/da4/ls");
        let Method::Kamera(m8) = &ms[30].1 else { panic!() };
        assert_eq!((m8.mixed, m8.alloc.global_gain), (Some((Form::Int8Factors, 2)), 2.0));
        let Method::Kamera(d4) = &ms[31].1 else { panic!() };
        assert_eq!(d4.mixed, Some((Form::Dense4, 3)));
        assert_eq!(ms[30].1.to_string(), "kamera-budget:0.098/q4/rf/m8=2/ls/gx=2");
        assert_eq!(ms[29].1.to_string(), "kamera:8/q4/wq=calraw");
        assert_eq!(ms[28].1.to_string(), "kamera-budget:0.1/q4/w=p/wq=cal");
        let Method::Kamera(c) = &ms[26].1 else { panic!() };
        assert!(c.weighting.k_cols_cal && c.weighting.any() && !c.weighting.needs_probe());
        assert_eq!(ms[26].1.to_string(), "kamera-budget:0.1/q4/wq=cal/rf/ls");
        let Method::Kamera(c) = &ms[27].1 else { panic!() };
        assert!(c.weighting.k_cols_cal && c.weighting.v_rows && !c.weighting.k_cols && c.weighting.floor == 0.5);
        assert_eq!(ms[27].1.to_string(), "kamera-budget:0.1/q4/w=v/wq=cal/wf=0.5/rf");
        let Method::Kamera(t) = &ms[24].1 else { panic!() };
        assert_eq!(
            t.tail,
            Some(Tail {
                head_share: 0.6,
                bits: 2
            })
        );
        assert_eq!(ms[24].1.to_string(), "kamera-budget:0.1/q4/rf/t2=0.6/ls");
        assert_eq!(
            ms[22].1,
            Method::OracleLayer {
                layer: 17,
                k: false,
                v: true,
                except: false
            }
        );
        assert_eq!(ms[23].1.to_string(), "oracle-except:2k");
        let Method::Kamera(a) = &ms[20].1 else { panic!() };
        assert_eq!(
            a.alloc,
            Alloc {
                relative: true,
                sensitivity: true,
                k_gain: 2.0,
                global_gain: 0.5
            }
        );
        let Method::Kamera(w) = &ms[18].1 else { panic!() };
        assert_eq!(
            (
                w.weighting.k_cols,
                w.weighting.k_rows,
                w.weighting.v_rows,
                w.weighting.floor
            ),
            (true, true, true, WEIGHT_FLOOR)
        );
        assert_eq!(ms[18].1.to_string(), "kamera-budget:0.1/q4/w=qkv");
        let Method::Kamera(w) = &ms[19].1 else { panic!() };
        assert!(
            w.refit && w.weighting.k_rows && w.weighting.v_cols && w.weighting.squared_mass && w.weighting.floor == 0.1
        );
        let Method::Kamera(d) = &ms[14].1 else { panic!() };
        assert_eq!(
            (d.quant, d.grain),
            (Quant::Int4Mixed, Some(Grain::Direction.everywhere()))
        );
        let Method::Kamera(m) = &ms[17].1 else { panic!() };
        let (dd, gg) = (Grain::Direction, Grain::Group);
        assert_eq!(m.grain, Some([[gg, dd], [dd, gg]]));
        let Method::Kamera(a) = &ms[15].1 else { panic!() };
        assert_eq!((a.quant, a.grain), (Quant::Int4Mixed, None));
        assert_eq!(ms[3].1, Method::Kamera(PatchSpec::rank(RankPolicy::Fixed(32))));
        assert_eq!(ms[6].1, Method::CacheBlend { fraction: 0.15 });
        let Method::Kamera(q) = &ms[9].1 else {
            panic!("{:?}", ms[9])
        };
        assert_eq!(
            (q.quant, q.drop_below, &q.rank),
            (Quant::Int4, 0.01, &RankPolicy::Fixed(32))
        );
        assert_eq!(ms[10].1.to_string(), "kamera-kv:0.02+0.06/q8");
        assert_eq!(ms[11].1.to_string(), "kamera-energy:0.9+0.9");
        let Method::Orbit { kind, patch } = &ms[12].1 else {
            panic!()
        };
        assert_eq!((*kind, patch.dtype), (OrbitKind::Slot, DType::F32));
        for (spec, m) in &ms {
            assert_eq!(m.to_string().parse::<Method>().unwrap(), *m, "{spec}");
        }
        for bad in [
            "kamera:32/q4/rf/t2=0.5",
            "kamera-budget:0.1/t2=0.5",
            "kamera-budget:0.1/q4/t2=0.5",
            "kamera-budget:0.1/q4/rf/t2=0",
            "kamera-budget:0.1/q4/m8=2",
            "kamera:32/q4/rf/m8=2",
            "kamera-budget:0.1/q4/rf/t3=0.5/m8=1",
            "kamera-budget:0.1/q4/rf/wq=cal/m8=1",
            "kamera-budget:0.1/q4/rf/m8=x",
            "kamera-budget:0.1/q4/da4",
            "kamera-budget:0.1/q4/rf/d4=6/m8=2",
            "kamera:32/klt",
            "kamera-budget:0.1/q4/klt",
            "kamera-budget:0.1/klt/w=q",
            "kamera-budget:0.1/rf/klt",
            "kamera",
            "kamera:x",
            "cacheblend:2",
            "blind:3",
            "nope",
            "",
            "full,full",
            "kamera:8/q3",
            "blind/q8",
            "kamera-kv:0.1+x",
            "epic:3/q8",
            "kamera:8/drop=2",
            "kamera:8/q4=ddd",
            "kamera:8/q4=ddgx",
            "kamera:8/w=x",
            "kamera:8/w=2",
            "kamera:8/wf=0",
            "orbit:8/w",
            "kamera:8/rel",
            "orbit-slot:8/ls",
            "kamera-kv:0.1+0.1/kx=2",
            "kamera-budget:0.1/kx=0",
            "kamera-budget:0.1/gx=x",
            "oracle-layer:x",
            "oracle-layer:3/q4",
            "kamera:8/w=q/wq=cal",
            "kamera:8/w=p",
            "kamera:8/wq=page",
            "orbit:8/wq=cal",
            "recall:blind",
            "recall:kamera:8/w=v",
            "recall:orbit:8",
            "recall:",
            "kvq:2",
            "kvq:0.1/q4",
        ] {
            assert!(parse_methods(bad).is_err(), "{bad}");
        }
    }
}
