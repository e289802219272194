//! The per-layer KL sensitivities `/ls` budgets weigh layers by, read from the report of an
//! `oracle-except` run (`--layer-sensitivity`).

use crate::error::{Error, Result};
use crate::report::Report;

/// Per layer, the (K, V) sensitivities of a report that ran `oracle-except:Lk` and
/// `oracle-except:Lv` for every layer L: the mean KL with that layer's K (V) left blind and
/// every other exact, over the mean blind KL.
pub fn layer_sensitivity(report: &Report) -> Result<Vec<(f64, f64)>> {
    let blind = report.blind_kl;
    let get = |name: String| {
        report
            .methods
            .get(&name)
            .map(|m| m.kl / blind)
            .ok_or_else(|| Error::Invalid {
                op: "layer sensitivity",
                detail: format!("the report lacks {name}"),
            })
    };
    let mut out = Vec::new();
    while report.methods.contains_key(&format!("oracle-except:{}k", out.len())) {
        let l = out.len();
        out.push((get(format!("oracle-except:{l}k"))?, get(format!("oracle-except:{l}v"))?));
    }
    if out.is_empty() || blind.is_nan() || blind <= 0.0 {
        return Err(Error::Invalid {
            op: "layer sensitivity",
            detail: "the report has no oracle-except:0k or no blind KL".into(),
        });
    }
    Ok(out)
}
