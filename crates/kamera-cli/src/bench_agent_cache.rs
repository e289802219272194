//! `kamera bench agent --action-cache DIR --passes N`: what later passes over one action cache
//! save. Episodes are paired across passes by model, decoding, task and seed; a pass's row says
//! how many of the episodes that passed in pass 1 made no model call and still passed.

use serde::{Deserialize, Serialize};

use crate::bench_agent::Episode;

/// One pass of one model x decoding over the cache.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CachePass {
    pub model: String,
    /// The decoding, without the pass label.
    pub decoding: String,
    pub pass: usize,
    pub episodes: usize,
    pub success: usize,
    pub model_calls: usize,
    pub cache_hits: usize,
    pub wall_s: f64,
    /// Episodes that passed in pass 1, and of those, the ones that made no model call here and
    /// the ones that passed again here.
    pub first_passed: usize,
    pub first_passed_no_calls: usize,
    pub first_passed_again: usize,
}

/// `label` without its ` pass N` suffix.
fn base(label: &str) -> &str {
    label.rsplit_once(" pass ").map_or(label, |(d, _)| d)
}

/// A row per (model, decoding, pass) in the episodes' order.
pub fn passes(episodes: &[Episode]) -> Vec<CachePass> {
    let mut keys: Vec<(String, String, usize)> = Vec::new();
    for e in episodes
        .iter()
        .filter(|e| e.model != crate::bench_agent_baseline::LABEL)
    {
        let k = (e.model.clone(), base(&e.decoding).to_string(), e.pass);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let same = |e: &Episode, m: &str, d: &str| e.model == m && base(&e.decoding) == d;
    keys.into_iter()
        .map(|(model, decoding, pass)| {
            let eps: Vec<&Episode> = episodes
                .iter()
                .filter(|e| same(e, &model, &decoding) && e.pass == pass)
                .collect();
            let first_ok = |e: &Episode| {
                episodes.iter().any(|f| {
                    same(f, &model, &decoding) && f.pass == 1 && f.task == e.task && f.seed == e.seed && f.success
                })
            };
            let fp: Vec<&&Episode> = eps.iter().filter(|e| first_ok(e)).collect();
            CachePass {
                episodes: eps.len(),
                success: eps.iter().filter(|e| e.success).count(),
                model_calls: eps.iter().map(|e| e.model_calls).sum(),
                cache_hits: eps.iter().map(|e| e.cache_hits).sum(),
                wall_s: eps.iter().map(|e| e.wall_ms / 1e3).sum(),
                first_passed: fp.len(),
                first_passed_no_calls: fp.iter().filter(|e| e.model_calls == 0).count(),
                first_passed_again: fp.iter().filter(|e| e.success).count(),
                model,
                decoding,
                pass,
            }
        })
        .collect()
}

/// The passes table (empty without an action cache).
pub fn markdown(rows: &[CachePass], dir: Option<&str>) -> String {
    let Some(dir) = dir else {
        return String::new();
    };
    let mut s = format!(
        "\nAction cache `{dir}`, shared by every model episode: per pass, the model calls and cache hits, and of the episodes that passed in pass 1, how many made no model call and passed again.\n\n"
    );
    s += "| model | decoding | pass | episodes | success | model calls | cache hits | wall (s) | passed in pass 1: no model call | passed again |\n";
    s += "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {}/{} | {}/{} |\n",
            r.model,
            r.decoding,
            r.pass,
            r.episodes,
            r.success,
            r.model_calls,
            r.cache_hits,
            r.wall_s,
            r.first_passed_no_calls,
            r.first_passed,
            r.first_passed_again,
            r.first_passed
        );
    }
    s
}
