//! kamera-ops: the Kamera operator, the exact CPU reference every backend is tested against.
//! A chunk's canonical KV is relocated to any position by exact RoPE re-rotation and given back
//! its cross-chunk conditioning by a low-rank patch: KV^(B|A) = R(δ)·(KV(B|∅) + U_m V_mᵀ).
//!
//! ```
//! use kamera_ops::{ChunkKv, KvLayout, LayerKv, Mat, PairLayout, RopeSpec, relocate};
//! let layout = KvLayout::gqa(1, 4, 2, 8);
//! let rope = RopeSpec::new(8, 10_000.0, PairLayout::HalfSplit);
//! let keys: Vec<f32> = (0..3 * 16).map(|i| (i as f32 * 0.37).sin()).collect();
//! let layer = LayerKv { k: Mat::from_f32(3, 16, keys.clone())?, v: Mat::from_f32(3, 16, keys)? };
//! let chunk = ChunkKv::new(layout, 0, vec![layer])?;
//! let there = relocate(&chunk, &rope, 1000)?;
//! let back = relocate(&there, &rope, 0)?;
//! let err = back.layers()[0].k.to_f32_vec().iter().zip(chunk.layers()[0].k.to_f32_vec())
//!     .map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
//! assert!(err < 1e-5);
//! # Ok::<(), kamera_ops::Error>(())
//! ```

mod basis;
mod chunk;
mod coding;
mod deficit;
mod error;
mod lanes;
mod layout;
mod lowrank;
mod orbit;
mod patch;
mod quant;
mod relocate;
mod reuse;
mod rope;
mod stream;
mod svd;
mod tensor;
pub mod testkit;
mod transform;
mod weights;

pub use basis::{Bases, BasisFp, PatchBasis};
pub use chunk::{ChunkKv, LayerKv};
pub use coding::{CodedColumn, WIDTHS};
pub use deficit::{Deficit, deficit};
pub use error::{Error, Result};
pub use layout::{Attention, KvLayout};
pub use orbit::{orbit_orderings, orbit_patch, slot_orbit_patches};
pub use patch::{
    LayerPatch, Patch, PatchConfig, RankPolicy, apply_patch, form_patch, patch_from_deficit,
    patch_from_deficit_weighted, patch_from_svds, patch_from_weighted_svds, policy_ranks,
};
pub use quant::{
    Grain, Grains, INT4_GROUP, Quant, Scales, codes as quant_codes, dequantise, pack_nibbles, quantise_auto,
    quantise_grains, quantise_refit, quantise_refit_ranges, unpack_nibbles,
};
pub use relocate::relocate;
pub use reuse::{Heads, Placement, assemble, check_place, check_reuse, reuse, reuse_heads, reuse_into, reuse_rows};
pub use rope::{PairLayout, RopeScaling, RopeSpec, Rotation};
pub use svd::{LowRank, Svd};
pub use tensor::{Buf, DType, Elem, Mat};
pub use transform::{
    BasisCode, BasisCoding, Coefficients, SENSITIVITY_FLOOR, code_coefficients, coefficients, sensitivity_gain,
    transform_patch,
};
pub use weights::{
    MatWeights, PatchWeights, key_feature_weights, normalise_weights, token_weights, value_feature_weights,
};
