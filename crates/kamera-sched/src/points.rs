//! Measured patch points and blind-placement KLs per model, keyed by the model's fingerprint: the
//! runtime looks its model up here ([`measured_points`], [`measured_blind_kl`]) and never by
//! name. A model not in the table gets [`default_patch_points`] (SmolLM2-135M's) and the cost
//! model's default blind KLs (0.1: never blind under the default budget), and the runtime says so.

use kamera_ops::{DType, PatchConfig, Quant, RankPolicy};
use kamera_store::ModelFp;

use crate::cost::PatchPoint;

/// A model whose patch points were measured: its fingerprint and points.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    /// For people (logs, docs); nothing matches on it.
    pub name: &'static str,
    /// `ModelFp::of(model.base_fingerprint())`: the weights' sha256 and the configuration,
    /// whatever the prefill precision.
    pub fp: ModelFp,
    pub points: fn() -> Vec<PatchPoint>,
    /// The answer KL its blind placements cost, measured on the agent's own workload.
    pub blind: Option<BlindKl>,
}

/// The mean next-token KL (to a full re-prefill of the same window) that a model pays for a
/// placement without a forward pass, measured by `kamera bench session --front 1` (every
/// placement blind; bench/session/README.md): the mean KL of the steps that recall a page, of
/// the steps that add a new page after an eviction (whose survivors were re-rotated blind), and
/// of the question steps (the answer's distribution, read from a page placed blind). The cost
/// model compares them with its KL budget ([`crate::CostModel::recall_blind_kl`],
/// [`crate::CostModel::survivor_blind_kl`], [`crate::CostModel::read_blind_kl`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlindKl {
    pub recall: f64,
    pub survivors: f64,
    pub read: f64,
    /// The window (tokens) they were measured at ([`crate::CostModel::blind_kl_window`]).
    pub window: usize,
}

/// 32 hex digits as a fingerprint (compile-time; a bad literal fails the build).
const fn fp(hex: &str) -> ModelFp {
    let h = hex.as_bytes();
    assert!(h.len() == 32, "a model fingerprint is 32 hex digits");
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = nibble(h[2 * i]) << 4 | nibble(h[2 * i + 1]);
        i += 1;
    }
    ModelFp(out)
}

const fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("a model fingerprint is lower-case hex"),
    }
}

/// The models measured by `kamera eval` (kamera-lab README), as kamera-model fetches them
/// (`kamera models fetch NAME`); their fingerprints are checked against the fetched models by
/// this crate's tests (tests/points.rs).
pub const KNOWN_MODELS: [KnownModel; 3] = [
    KnownModel {
        name: "SmolLM2-135M-Instruct Q4_1",
        fp: fp("ea72c5c787770588bbcef4a10cea6e81"),
        points: default_patch_points,
        // w512-s100-lazy, `kamera@kl1`: 58 recall steps 7.0e-2, 9 new-page steps 3.5e-2, 13
        // question steps 1.18e-1.
        blind: Some(BlindKl {
            recall: 7.0e-2,
            survivors: 3.5e-2,
            read: 1.18e-1,
            window: 512,
        }),
    },
    KnownModel {
        name: "Qwen2.5-Coder-0.5B-Instruct",
        fp: fp("731f56d74faf4dec69531fc36e565573"),
        points: qwen25_patch_points,
        // qwen-w512-s60-lazy, `kamera@kl1`: 32 recall steps 5.8e-3, 9 new-page steps 5.1e-3, 7
        // question steps 2.9e-2 (qwen-w512-rows, blind by default: 13 question steps 3.1e-2).
        blind: Some(BlindKl {
            recall: 5.8e-3,
            survivors: 5.1e-3,
            read: 2.9e-2,
            window: 512,
        }),
    },
    KnownModel {
        name: "Gemma 3 270M Q4_K_M",
        fp: fp("645b57f2c3dd137e786de12d4a47771d"),
        points: gemma3_patch_points,
        // Not measured on the session bench yet: the cost model's defaults.
        blind: None,
    },
];

/// The measured patch points of the model with fingerprint `fp` (`ModelFp::of` its
/// `base_fingerprint`), or `None` for a model never measured.
pub fn measured_points(fp: &ModelFp) -> Option<Vec<PatchPoint>> {
    KNOWN_MODELS.iter().find(|m| m.fp == *fp).map(|m| (m.points)())
}

/// The measured blind-placement KLs of the model with fingerprint `fp`, or `None` for a model
/// never measured on the session bench.
pub fn measured_blind_kl(fp: &ModelFp) -> Option<BlindKl> {
    KNOWN_MODELS.iter().find(|m| m.fp == *fp).and_then(|m| m.blind)
}

/// SmolLM2-135M's measured points (`kamera eval`, first 4 tasks of the default suite: 3 pages of
/// ~300 tokens; kamera-lab README, issue 16), for the default cost model. 4-bit is grouped
/// (`/q4`): per-direction scales (`/q4d`) lose on SmolLM2 and Gemma 3 and win on Qwen2.5, so
/// Qwen2.5 has its own points ([`qwen25_patch_points`]).
pub fn default_patch_points() -> Vec<PatchPoint> {
    let point = |label: &str, rank: RankPolicy, dtype: DType, quant: Quant, gap: f64, bytes: f64| PatchPoint {
        label: label.into(),
        config: PatchConfig {
            rank,
            quant,
            ..PatchConfig::fixed(0, dtype)
        },
        gap,
        bytes,
        coded: None,
        form_us_per_token: 0.0,
    };
    vec![
        point(
            "kamera:16",
            RankPolicy::Fixed(16),
            DType::Bf16,
            Quant::None,
            0.552,
            0.135,
        ),
        point(
            "kamera:32/q8",
            RankPolicy::Fixed(32),
            DType::Bf16,
            Quant::Int8,
            0.831,
            0.137,
        ),
        point(
            "kamera-budget:0.1/q8",
            RankPolicy::Budget { fraction: 0.1 },
            DType::Bf16,
            Quant::Int8,
            0.841,
            0.101,
        ),
        point(
            "kamera-budget:0.05/q4",
            RankPolicy::Budget { fraction: 0.05 },
            DType::Bf16,
            Quant::Int4,
            0.759,
            0.051,
        ),
        point(
            "kamera-budget:0.095/q4",
            RankPolicy::Budget { fraction: 0.095 },
            DType::Bf16,
            Quant::Int4,
            0.904,
            0.096,
        ),
        point(
            "kamera-budget:0.1/q4",
            RankPolicy::Budget { fraction: 0.1 },
            DType::Bf16,
            Quant::Int4,
            0.911,
            0.101,
        ),
        // Error-aware 4-bit factors (`/rf`: clipped scales, Wᵀ refitted to the quantised P),
        // formed from the deficit alone like every point here. The attention-weighted points
        // (`/w`, 0.954-0.968 at +9.6% on SmolLM2) need the query statistics of a probed
        // conditioned prefill, which the runtime's patch formation does not take yet.
        PatchPoint {
            label: "kamera-budget:0.095/q4/rf".into(),
            config: PatchConfig {
                rank: RankPolicy::Budget { fraction: 0.095 },
                quant: Quant::Int4,
                refit: true,
                ..PatchConfig::fixed(0, DType::Bf16)
            },
            gap: 0.933,
            bytes: 0.096,
            coded: None,
            form_us_per_token: 0.0,
        },
    ]
}

/// A point of int4 factors with refitted scales under a byte budget (deficit only).
fn refit_point(label: &str, fraction: f64, gap: f64, bytes: f64) -> PatchPoint {
    PatchPoint {
        label: label.into(),
        config: PatchConfig {
            rank: RankPolicy::Budget { fraction },
            quant: Quant::Int4,
            refit: true,
            ..PatchConfig::fixed(0, DType::Bf16)
        },
        gap,
        bytes,
        coded: None,
        form_us_per_token: 0.0,
    }
}

/// Gemma 3 270M's measured points (kamera-lab README, issue 16, bf16 prefills, tasks 1-8 and
/// 25-40): int4 factors reach 0.908 at +9.6%; transform-coded patches in the model's basis (from
/// 96 calibration tasks, layers weighed by the basis' KL sensitivities: `/klte/ls`) 0.954 at
/// +10.0%, chosen when that basis is loaded; forming those took 8.9 s per 3-chunk task of 912
/// tokens on 2 cores (~9.8 ms per token, of which the coder's greedy is most).
pub fn gemma3_patch_points() -> Vec<PatchPoint> {
    vec![
        refit_point("kamera-budget:0.095/q4/rf", 0.095, 0.908, 0.096),
        PatchPoint {
            label: "kamera-budget:0.1/klte/ls".into(),
            config: PatchConfig {
                rank: RankPolicy::Budget { fraction: 0.1 },
                ..PatchConfig::fixed(0, DType::F32)
            },
            gap: 0.954,
            bytes: 0.100,
            coded: Some(true),
            form_us_per_token: 9500.0,
        },
    ]
}

/// Qwen2.5-0.5B's measured points (kamera-lab README, issue 16, deficit-only factors, tasks 1-8):
/// int4 factors with refitted scales, 0.943 at +9.8%.
pub fn qwen25_patch_points() -> Vec<PatchPoint> {
    vec![refit_point("kamera-budget:0.098/q4/rf", 0.098, 0.943, 0.098)]
}
