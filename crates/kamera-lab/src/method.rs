//! Reuse methods, parsed from their command-line spelling (`kamera:32`, `cacheblend:0.15`...).

use kamera_ops::{DType, Grains, PatchConfig, Quant, RankPolicy};

use crate::alloc::Alloc;
use crate::error::{Error, Result};
use crate::mixed::Form;
use crate::tail::Tail;

mod display;
mod parse;

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
    /// byte budget (kamera-lab `klt`).
    pub klt: bool,
    /// With `klt`: entropy-coded records (`/klte`): codes and width map Huffman-coded where that is
    /// shorter.
    pub klt_entropy: bool,
}

/// Which attention statistics of the conditioned prefill weigh the deficit's factorisation
/// (kamera-ops `Svd::compute_weighted`): letters `q` (K's feature columns by the second moment
/// of the queries of the chunk's own and later tokens, per RoPE pair), `k` / `v` (K's / V's token
/// rows by the attention each token receives from the later tokens' queries), `2` (rows by
/// Σ a² instead of Σ a), `o` (V's feature columns by the output projection's column norms),
/// `p` (ranks chosen from the plain spectra, directions from the weighted ones), `a` (rows by
/// the attention of the chunk's own tokens' queries too).
/// `/wq=cal` weighs K's feature columns by a per-model table of the question queries' second
/// moments measured on calibration tasks (`--query-calibration`; kamera-lab `qcal`) instead.
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
    /// The runtime's case (`recall:SPEC`, `recall-foreign:SPEC`; kamera-lab `recall`): each
    /// page's patch formed at a first visit in another context A, then applied after its
    /// canonical KV is recalled into the task's ordering B.
    Recall { visit: Visit, patch: PatchSpec },
    /// The equal-bytes baseline (`kvq:B`; kamera-lab `kvq`): each page's conditioned KV itself
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
    use kamera_ops::Grain;

    #[test]
    // Long: one table of method spellings, each checked against its parse and its spelling back.
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
