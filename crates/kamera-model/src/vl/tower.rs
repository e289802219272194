//! The Qwen2.5-VL vision tower (CPU): 14-pixel patches with a temporal patch of 2 embedded by
//! one linear map, 2-D rotary, windowed attention with full attention at `fullatt_blocks`,
//! RMSNorm, SwiGLU, and the 2x2 patch merger into the text model's width. In f32 (candle, one
//! product per window: the reference) or, with the bf16 prefill precision, on the runner's bf16
//! tiles: weights held in bf16, every window and head's attention a task of its own.

use candle_core::{D, Device, Tensor};
use std::time::Instant;

use rayon::prelude::*;

use crate::PrefillPrecision;
use crate::activation::gated;
use crate::block::{linear, norm};
use crate::config::Activation;
use crate::error::{CandleCtx, Error, Result};
use crate::hf::SafeDir;
use crate::quant::matmul::gemm_f32;
use crate::quant::{Epilogue, Linear};
use crate::vl::config::VisionConfig;
use crate::vl::positions::{Grid, patch_rows_cols, window_index};

const OP: &str = "vision tower";
/// RMSNorm epsilon of the tower and the merger (fixed in the architecture).
const EPS: f64 = 1e-6;
/// Rotary base of the tower's 2-D rotary.
const THETA: f64 = 10_000.0;

#[derive(Debug)]
struct Block {
    norm1: Tensor,
    norm2: Tensor,
    qkv: (Linear, Tensor),
    proj: (Linear, Tensor),
    gate: (Linear, Tensor),
    up: (Linear, Tensor),
    down: (Linear, Tensor),
}

/// The vision tower's weights.
#[derive(Debug)]
pub(crate) struct Tower {
    cfg: VisionConfig,
    /// `[hidden, C·T·P·P]`: the Conv3d kernel flattened as the patches are.
    patch_embed: Linear,
    blocks: Vec<Block>,
    ln_q: Tensor,
    mlp0: (Linear, Tensor),
    mlp2: (Linear, Tensor),
}

/// Milliseconds of the in-place blocks by phase: products, attention, norms and rotation, activation.
#[derive(Default)]
struct Phases([f64; 4]);

/// What the tower computes for one image.
#[derive(Debug, Clone)]
pub struct VisionOutput {
    /// The last block's output in patch order, `[patches, hidden]` row-major (a parity probe).
    pub blocks_out: Vec<f32>,
    /// Merged image embeddings, `[patches / merge², out_hidden]` row-major: the image tokens.
    pub embeds: Vec<f32>,
}

impl Tower {
    /// The tower's weights under `prefix`, its matrices held for `precision` (see
    /// [`Linear::dense`]: a bf16 checkpoint's stay bf16 at either).
    pub fn load(st: &SafeDir, prefix: &str, cfg: &VisionConfig, precision: PrefillPrecision) -> Result<Tower> {
        let (h, f) = (cfg.hidden, cfg.intermediate);
        let m = h * cfg.merge_size * cfg.merge_size;
        let t = |name: &str, shape: &[usize]| st.f32(&format!("{prefix}{name}"), shape);
        let lin = |name: &str, out: usize, inp: usize| -> Result<(Linear, Tensor)> {
            Ok((
                st.linear(&format!("{prefix}{name}.weight"), &[out, inp], precision)?,
                t(&format!("{name}.bias"), &[out])?,
            ))
        };
        let (c, tp, p) = (cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size);
        let patch_embed = st.linear(
            &format!("{prefix}patch_embed.proj.weight"),
            &[h, c, tp, p, p],
            precision,
        )?;
        let blocks = (0..cfg.depth)
            .map(|i| {
                let b = |s: &str| format!("blocks.{i}.{s}");
                Ok(Block {
                    norm1: t(&b("norm1.weight"), &[h])?,
                    norm2: t(&b("norm2.weight"), &[h])?,
                    qkv: lin(&b("attn.qkv"), 3 * h, h)?,
                    proj: lin(&b("attn.proj"), h, h)?,
                    gate: lin(&b("mlp.gate_proj"), f, h)?,
                    up: lin(&b("mlp.up_proj"), f, h)?,
                    down: lin(&b("mlp.down_proj"), h, f)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tower {
            cfg: cfg.clone(),
            patch_embed,
            blocks,
            ln_q: t("merger.ln_q.weight", &[h])?,
            mlp0: lin("merger.mlp.0", m, m)?,
            mlp2: lin("merger.mlp.2", cfg.out_hidden, m)?,
        })
    }

    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// Multiplies the matrices at `p`: on the bf16 tiles (f32 ones rounded) or in f32 (bf16 ones
    /// kept as they are; see [`Linear::set_precision`]).
    pub fn set_precision(&mut self, p: PrefillPrecision) -> Result<()> {
        self.patch_embed.set_precision(p, true)?;
        for (w, _) in [&mut self.mlp0, &mut self.mlp2] {
            w.set_precision(p, true)?;
        }
        for b in &mut self.blocks {
            for (w, _) in [&mut b.qkv, &mut b.proj, &mut b.gate, &mut b.up, &mut b.down] {
                w.set_precision(p, true)?;
            }
        }
        Ok(())
    }

    /// Whether the blocks run on the bf16 tiles (their weights and their attention).
    fn bf16(&self) -> bool {
        self.blocks
            .first()
            .is_some_and(|b| b.qkv.0.precision() == PrefillPrecision::Bf16)
    }

    /// Whether every block's matrices are held in bf16 (a bf16 checkpoint, or the bf16
    /// precision): the blocks then run in place ([`Tower::block_in_place`]).
    fn in_place(&self) -> bool {
        self.blocks.iter().all(|b| {
            [&b.qkv, &b.proj, &b.gate, &b.up, &b.down]
                .iter()
                .all(|(w, _)| matches!(w, Linear::Bf16(_)))
        })
    }

    /// Encodes one image's patches (`[t·h·w, C·T·P·P]` row-major, as the preprocessor makes them).
    pub fn forward(&self, pixel_values: &[f32], grid: Grid) -> Result<VisionOutput> {
        self.run(pixel_values, grid, self.in_place())
    }

    fn run(&self, pixel_values: &[f32], grid: Grid, in_place: bool) -> Result<VisionOutput> {
        let cfg = &self.cfg;
        let [gt, gh, gw] = grid;
        let unit = cfg.merge_size * cfg.merge_size;
        let n = gt * gh * gw;
        if n == 0 || gh % cfg.merge_size != 0 || gw % cfg.merge_size != 0 {
            return Err(Error::Shape {
                op: OP,
                detail: format!(
                    "grid {grid:?} must be non-empty with h and w multiples of {}",
                    cfg.merge_size
                ),
            });
        }
        if pixel_values.len() != n * cfg.patch_values() {
            return Err(Error::Shape {
                op: OP,
                detail: format!(
                    "pixel values: expected {n} patches x {} = {} values for grid {grid:?}, got {}",
                    cfg.patch_values(),
                    n * cfg.patch_values(),
                    pixel_values.len()
                ),
            });
        }
        let dev = Device::Cpu;
        let pv = Tensor::from_slice(pixel_values, (n, cfg.patch_values()), &dev).ctx(OP)?;
        let x = linear(&pv, &self.patch_embed, None)?;
        // Window order: merged tokens (groups of `unit` patches) reordered window by window.
        let (win, cu_win) = window_index(grid, cfg.merge_size, cfg.window_tokens());
        let order: Vec<u32> = win
            .iter()
            .flat_map(|&m| (0..unit).map(move |u| (m * unit + u) as u32))
            .collect();
        let order_t = Tensor::from_slice(&order, n, &dev).ctx(OP)?;
        let mut x = x.index_select(&order_t, 0).ctx(OP)?;
        let rc = patch_rows_cols(grid, cfg.merge_size);
        let angles = self.rotary_angles(order.iter().map(|&i| rc[i as usize]));
        // Every block rotates by the same angles: their sines and cosines once.
        let (sin, cos): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| a.sin_cos()).unzip();
        let cu_full: Vec<usize> = (0..=gt).map(|f| f * gh * gw).collect();
        let cu_of = |i: usize| {
            if cfg.fullatt_blocks.contains(&i) {
                &cu_full
            } else {
                &cu_win
            }
        };
        if in_place {
            let mut xs: Vec<f32> = x.flatten_all().ctx(OP)?.to_vec1().ctx(OP)?;
            let mut time = Phases::default();
            for (i, b) in self.blocks.iter().enumerate() {
                self.block_in_place(b, &mut xs, (&sin, &cos), cu_of(i), &mut time)?;
            }
            let [products, attention, norms, activation] = time.0;
            tracing::debug!(
                patches = n,
                products,
                attention,
                norms,
                activation,
                "vision tower blocks, ms"
            );
            x = Tensor::from_vec(xs, (n, cfg.hidden), &dev).ctx(OP)?;
        } else {
            for (i, b) in self.blocks.iter().enumerate() {
                x = self.block(b, &x, (&sin, &cos), cu_of(i))?;
            }
        }
        // Back to patch order for the probe; the merger works in window order (merged tokens
        // are whole groups either way) and its rows are then put back in order.
        let mut inverse = vec![0u32; n];
        for (dst, &src) in order.iter().enumerate() {
            inverse[src as usize] = dst as u32;
        }
        let inv_t = Tensor::from_slice(&inverse, n, &dev).ctx(OP)?;
        let blocks_out = x.index_select(&inv_t, 0).ctx(OP)?;
        let merged = norm(&blocks_out, &self.ln_q, EPS)?
            .reshape((n / unit, unit * cfg.hidden))
            .ctx(OP)?;
        let y = linear(&merged, &self.mlp0.0, Some(&self.mlp0.1))?.gelu_erf().ctx(OP)?;
        let embeds = linear(&y, &self.mlp2.0, Some(&self.mlp2.1))?;
        Ok(VisionOutput {
            blocks_out: blocks_out.flatten_all().ctx(OP)?.to_vec1().ctx(OP)?,
            embeds: embeds.flatten_all().ctx(OP)?.to_vec1().ctx(OP)?,
        })
    }

    /// Rotary angles `[patches, head_dim/2]`: the first quarter of the head's frequencies read
    /// the patch row, the second the column (HF `rot_pos_emb`: inv_freq over head_dim/2).
    fn rotary_angles(&self, rc: impl Iterator<Item = (usize, usize)>) -> Vec<f32> {
        let half = self.cfg.head_dim() / 2;
        let quarter = half / 2;
        let inv: Vec<f32> = (0..quarter)
            .map(|i| (1.0 / THETA.powf(2.0 * i as f64 / half as f64)) as f32)
            .collect();
        let mut out = Vec::new();
        for (r, c) in rc {
            out.extend(inv.iter().map(|&f| r as f32 * f));
            out.extend(inv.iter().map(|&f| c as f32 * f));
        }
        out
    }

    /// One block in f32 on candle: the reference.
    fn block(&self, b: &Block, x: &Tensor, (sin, cos): (&[f32], &[f32]), cu: &[usize]) -> Result<Tensor> {
        let cfg = &self.cfg;
        let (n, heads, hd) = (x.dim(0).ctx(OP)?, cfg.heads, cfg.head_dim());
        let qkv = linear(&norm(x, &b.norm1, EPS)?, &b.qkv.0, Some(&b.qkv.1))?;
        let mut v: Vec<f32> = qkv.flatten_all().ctx(OP)?.to_vec1().ctx(OP)?;
        rotate(&mut v, (heads, hd), (sin, cos));
        let att = windows_f32(v, (n, heads, hd), cu)?;
        let x = (x + linear(&att, &b.proj.0, Some(&b.proj.1))?).ctx(OP)?;
        let hn = norm(&x, &b.norm2, EPS)?;
        let g = linear(&hn, &b.gate.0, Some(&b.gate.1))?.silu().ctx(OP)?;
        let u = linear(&hn, &b.up.0, Some(&b.up.1))?;
        let m = linear(&(g * u).ctx(OP)?, &b.down.0, Some(&b.down.1))?;
        (x + m).ctx(OP)
    }

    /// One block on the bf16 weights in place on `x` (`[n, hidden]`), outside candle: each
    /// product writes its bias (and the residual adds) as it writes its output; the windows'
    /// attention on the bf16 tiles with the bf16 precision, else in f32 ([`windows_gemm`]).
    fn block_in_place(
        &self,
        b: &Block,
        x: &mut [f32],
        (sin, cos): (&[f32], &[f32]),
        cu: &[usize],
        time: &mut Phases,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (h, heads, hd) = (cfg.hidden, cfg.heads, cfg.head_dim());
        let n = x.len() / h;
        let vec = |t: &Tensor| -> Result<Vec<f32>> { t.to_vec1::<f32>().ctx(OP) };
        let product = |(w, bias): &(Linear, Tensor), x: &[f32], y: &mut [f32], add: bool| -> Result<()> {
            let Linear::Bf16(m) = w else {
                return Err(Error::Invalid {
                    op: OP,
                    detail: "an in-place tower holds every block matrix in bf16".into(),
                });
            };
            let bias = vec(bias)?;
            m.forward_into(x, x.len() / m.cols, y, Epilogue { bias: Some(&bias), add });
            Ok(())
        };
        let mut t = Instant::now();
        let mut lap = |i: usize| {
            time.0[i] += t.elapsed().as_secs_f64() * 1e3;
            t = Instant::now();
        };
        let mut hn = vec![0f32; n * h];
        rms_norm(x, &vec(&b.norm1)?, &mut hn);
        let mut qkv = vec![0f32; n * 3 * h];
        lap(2);
        product(&b.qkv, &hn, &mut qkv, false)?;
        lap(0);
        rotate(&mut qkv, (heads, hd), (sin, cos));
        lap(2);
        let att = if self.bf16() {
            windows_bf16(&qkv, (heads, hd), cu)
        } else {
            windows_gemm(&qkv, (heads, hd), cu)
        };
        lap(1);
        product(&b.proj, &att, x, true)?;
        lap(0);
        rms_norm(x, &vec(&b.norm2)?, &mut hn);
        let f = cfg.intermediate;
        let (mut g, mut u) = (vec![0f32; n * f], vec![0f32; n * f]);
        lap(2);
        product(&b.gate, &hn, &mut g, false)?;
        product(&b.up, &hn, &mut u, false)?;
        lap(0);
        g.par_chunks_mut(f)
            .zip(u.par_chunks(f))
            .for_each(|(g, u)| gated(Activation::Silu, g, u));
        lap(3);
        product(&b.down, &g, x, true)?;
        lap(0);
        Ok(())
    }
}

/// Attention within each window `cu[i]..cu[i + 1]` (every patch sees its window) of rotated
/// `qkv: [n, 3, heads, hd]` row-major, in f32 on candle, one product per window: the reference.
/// `[n, heads·hd]`.
fn windows_f32(qkv: Vec<f32>, (n, heads, hd): (usize, usize, usize), cu: &[usize]) -> Result<Tensor> {
    let qkv = Tensor::from_vec(qkv, (n, 3, heads, hd), &Device::Cpu).ctx(OP)?;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut outs = Vec::with_capacity(cu.len());
    for w in cu.windows(2) {
        let seg = qkv.narrow(0, w[0], w[1] - w[0]).ctx(OP)?;
        let part = |i: usize| -> Result<Tensor> {
            seg.narrow(1, i, 1)
                .ctx(OP)?
                .squeeze(1)
                .ctx(OP)?
                .transpose(0, 1)
                .ctx(OP)?
                .contiguous()
                .ctx(OP)
        };
        let (q, k, vv) = (part(0)?, part(1)?, part(2)?);
        let s = (q.matmul(&k.t().ctx(OP)?).ctx(OP)? * scale).ctx(OP)?;
        let p = candle_nn::ops::softmax(&s, D::Minus1).ctx(OP)?;
        // [heads, len, hd] -> [len, heads·hd]
        let o = p
            .matmul(&vv)
            .ctx(OP)?
            .transpose(0, 1)
            .ctx(OP)?
            .reshape((w[1] - w[0], heads * hd))
            .ctx(OP)?;
        outs.push(o);
    }
    Tensor::cat(&outs, 0).ctx(OP)
}

/// [`windows_f32`] in f32 without candle: every (window, head) a task of its own over the pool,
/// its scores and output two GEMMs read straight from `qkv` through strides (nothing gathered),
/// the softmax between them on [`crate::attention::softmax_row`]. `[n, heads·hd]`.
fn windows_gemm(qkv: &[f32], (heads, hd): (usize, usize), cu: &[usize]) -> Vec<f32> {
    let h = heads * hd;
    let n = cu.last().copied().unwrap_or(0);
    assert_eq!(qkv.len(), n * 3 * h, "windows_gemm: qkv is [n, 3, heads, hd]");
    let mut out = vec![0f32; n * h];
    // Each task writes only its own window's rows of its own head's columns.
    let dst = crate::quant::Out(out.as_mut_ptr());
    let scale = 1.0 / (hd as f32).sqrt();
    let tasks: Vec<(usize, usize)> = (0..cu.len().saturating_sub(1))
        .flat_map(|w| (0..heads).map(move |head| (w, head)))
        .collect();
    tasks.into_par_iter().for_each_init(
        || (Vec::new(), Vec::new()),
        |(scores, probs): &mut (Vec<f32>, Vec<f32>), (w, head)| {
            let (lo, len) = (cu[w], cu[w + 1] - cu[w]);
            if len == 0 {
                return;
            }
            scores.resize(len * len, 0.0);
            probs.resize(len * len, 0.0);
            let (q, k, v) = (
                lo * 3 * h + head * hd,
                lo * 3 * h + h + head * hd,
                lo * 3 * h + 2 * h + head * hd,
            );
            let row = (3 * h) as isize;
            // SAFETY: Q, K and V of rows lo..lo + len of this head lie in `qkv` at the offsets
            // and strides given; scores and probs hold len x len; the output block (rows
            // lo..lo + len, columns head·hd..) is this task's alone and inside `out`.
            unsafe {
                // scores = Q Kᵀ: [len, hd] x [hd, len] (Kᵀ: K's rows read as columns).
                gemm_f32(
                    (len, len, hd),
                    (scores.as_mut_ptr(), len as isize, 1),
                    (qkv.as_ptr().add(q), row, 1),
                    (qkv.as_ptr().add(k), 1, row),
                );
                for (s, p) in scores.chunks_exact(len).zip(probs.chunks_exact_mut(len)) {
                    crate::attention::softmax_row(s, p, scale);
                }
                // out = P V: [len, len] x [len, hd].
                gemm_f32(
                    (len, hd, len),
                    (dst.at(lo * h + head * hd), h as isize, 1),
                    (probs.as_ptr(), len as isize, 1),
                    (qkv.as_ptr().add(v), row, 1),
                );
            }
        },
    );
    out
}

/// [`windows_f32`] on the bf16 tiles (`attention_bf16`): the windows in parallel, each window's
/// heads as the prefill's attention runs them, with every query seeing every key of its window.
fn windows_bf16(qkv: &[f32], (heads, hd): (usize, usize), cu: &[usize]) -> Vec<f32> {
    use crate::attention_bf16::{Rows, attend};
    let h = heads * hd;
    // Heads padded with zero dimensions to a multiple of 32 (the 3B tower's 80 to 96): the
    // scores' 16-pair blocks then all run on AMX, and zeros change no dot product.
    let hp = hd.next_multiple_of(32);
    let outs: Vec<Vec<f32>> = cu
        .par_windows(2)
        .map(|w| {
            let (lo, len) = (w[0], w[1] - w[0]);
            // Q, K, V of the window head-first: [heads, len, hp] each.
            let mut parts = vec![vec![0f32; len * heads * hp]; 3];
            for (i, part) in parts.iter_mut().enumerate() {
                for r in 0..len {
                    let row = &qkv[(lo + r) * 3 * h + i * h..(lo + r) * 3 * h + (i + 1) * h];
                    for (head, src) in row.chunks_exact(hd).enumerate() {
                        part[(head * len + r) * hp..(head * len + r) * hp + hd].copy_from_slice(src);
                    }
                }
            }
            // Every query at the window's last position, the keys at 0..len: all visible.
            let q_pos = vec![len as i64 - 1; len];
            let k_pos: Vec<i64> = (0..len as i64).collect();
            fn rows(data: &[f32], head_stride: usize) -> Rows<'_> {
                Rows { data, head_stride }
            }
            let o = attend(
                &parts[0],
                (heads, 1, len, hp),
                rows(&parts[1], len * hp),
                rows(&parts[2], len * hp),
                &q_pos,
                &k_pos,
                1.0 / (hd as f32).sqrt(),
                None,
            );
            // [heads, len, hp] -> [len, heads·hd]
            let mut out = vec![0f32; len * h];
            for head in 0..heads {
                for r in 0..len {
                    out[r * h + head * hd..r * h + (head + 1) * hd]
                        .copy_from_slice(&o[(head * len + r) * hp..(head * len + r) * hp + hd]);
                }
            }
            out
        })
        .collect();
    outs.concat()
}

/// Rotates q and k of every head of `qkv` (`[n, 3, heads, hd]`) in place, row by row, by the
/// rows' angles (rotate_half pairs (j, j + hd/2); `sin`, `cos`: `[n, hd/2]`).
fn rotate(qkv: &mut [f32], (heads, hd): (usize, usize), (sin, cos): (&[f32], &[f32])) {
    let (h, half) = (heads * hd, hd / 2);
    qkv.par_chunks_mut(3 * h).enumerate().for_each(|(row, r)| {
        let (sr, cr) = (&sin[row * half..(row + 1) * half], &cos[row * half..(row + 1) * half]);
        for head in r[..2 * h].chunks_mut(hd) {
            for j in 0..half {
                let (s, c) = (sr[j], cr[j]);
                let (x0, x1) = (head[j], head[j + half]);
                head[j] = x0 * c - x1 * s;
                head[j + half] = x1 * c + x0 * s;
            }
        }
    });
}

/// The decoder's RMSNorm ([`crate::decode::rms_norm`]) over the rows in parallel.
fn rms_norm(x: &[f32], w: &[f32], out: &mut [f32]) {
    let d = w.len();
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, xr)| crate::decode::rms_norm(xr, w, EPS as f32, o));
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use candle_core::{DType, Device, Tensor};

    /// The tiny golden checkpoint with every tensor in bf16: its tower runs in place (exact bf16
    /// matrices, f32 products and attention); the candle blocks on the same matrices are the
    /// reference.
    #[test]
    fn in_place_blocks_equal_the_candle_blocks_on_a_bf16_checkpoint() {
        let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/qwen25vl-tiny");
        let dir = tempfile::tempdir().unwrap();
        let mut bf16: HashMap<String, Tensor> = HashMap::new();
        for e in std::fs::read_dir(&tiny).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "safetensors") {
                for (k, t) in candle_core::safetensors::load(&p, &Device::Cpu).unwrap() {
                    bf16.insert(k, t.to_dtype(DType::BF16).unwrap());
                }
            } else if p.extension().is_some_and(|x| x == "json") {
                std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
            }
        }
        let _ = std::fs::remove_file(dir.path().join("model.safetensors.index.json"));
        candle_core::safetensors::save(&bf16, dir.path().join("model.safetensors")).unwrap();
        let m = crate::Model::load(dir.path()).unwrap();
        let tower = &m.vision().unwrap().tower;
        assert!(tower.in_place() && !tower.bf16(), "exact bf16 matrices, f32 arithmetic");
        // Two windows' worth of merged tokens and more, so window and full blocks both cut.
        let grid = [1, 8, 12];
        let pv: Vec<f32> = (0..96 * tower.cfg.patch_values())
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 2.0)
            .collect();
        let (a, b) = (tower.forward(&pv, grid).unwrap(), tower.run(&pv, grid, false).unwrap());
        for (x, y, what) in [
            (&a.blocks_out, &b.blocks_out, "blocks"),
            (&a.embeds, &b.embeds, "embeds"),
        ] {
            let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale;
            assert!(err < 1e-5, "{what}: in place vs candle, rel. err {err:.2e}");
        }
    }
}
