//! Methods spelled back the way they are parsed (`Display`), so a report names each method as
//! the command line would.

use std::fmt;

use kamera_ops::{DType, Grain, Quant, RankPolicy};

use super::{Method, PatchSpec, WEIGHT_FLOOR, parse::grain_letters};

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
