//! GGUF block formats (ggml's layouts) repacked into [`QMatrix`] codes, exactly: every weight's
//! `scale · code + offset` equals ggml's dequantized value (checked against candle's dequantizer).
//! Scales and offsets the block stores as f16 stay f16; the K-quants' products become f32.

use candle_core::quantized::GgmlDType;
use half::f16;

use super::{Codes, Offsets, QMatrix, Table};

fn h(b: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([b[at], b[at + 1]])
}

/// Q4_K / Q5_K 6-bit scale and min of sub-block `j` (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Repacks `rows x cols` weights stored as `dtype` blocks in `raw`; `None` for a block type
/// without a repacking here (the caller keeps it dense). `raw` must hold exactly the tensor.
// Long: one match arm per GGUF block format.
pub(crate) fn repack(dtype: GgmlDType, raw: &[u8], rows: usize, cols: usize) -> Option<QMatrix> {
    let n = rows * cols;
    let bs = dtype.block_size();
    if cols % bs != 0 || raw.len() != n / bs * dtype.type_size() {
        return None;
    }
    let blocks = raw.chunks_exact(dtype.type_size());
    let m = |group, codes, scales, offsets, source| {
        Some(QMatrix {
            rows,
            cols,
            group,
            codes,
            scales,
            offsets,
            source,
            precision: super::PrefillPrecision::F32,
        })
    };
    match dtype {
        GgmlDType::Q4_0 => {
            let (mut c, mut s) = (Vec::with_capacity(n / 2), Vec::with_capacity(n / 32));
            for b in blocks {
                s.push(h(b, 0));
                c.extend_from_slice(&b[2..18]);
            }
            m(32, Codes::U4(c), Table::F16(s), Offsets::Zero(8.0), "Q4_0")
        }
        GgmlDType::Q4_1 => {
            let (mut c, mut s, mut o) = (
                Vec::with_capacity(n / 2),
                Vec::with_capacity(n / 32),
                Vec::with_capacity(n / 32),
            );
            for b in blocks {
                s.push(h(b, 0));
                o.push(h(b, 2));
                c.extend_from_slice(&b[4..20]);
            }
            m(
                32,
                Codes::U4(c),
                Table::F16(s),
                Offsets::PerGroup(Table::F16(o)),
                "Q4_1",
            )
        }
        GgmlDType::Q5_0 | GgmlDType::Q5_1 => {
            let with_min = dtype == GgmlDType::Q5_1;
            let at = if with_min { 4 } else { 2 };
            // 5-bit codes kept at 5 bits: the block's nibbles, then its fifth bits (Codes::U5).
            let groups = n / 32;
            let (mut c, mut s, mut o) = (Vec::with_capacity(groups * 20), Vec::with_capacity(groups), Vec::new());
            for b in blocks {
                s.push(h(b, 0));
                if with_min {
                    o.push(h(b, 2));
                }
                c.extend_from_slice(&b[at + 4..at + 20]);
                c.extend_from_slice(&b[at..at + 4]);
            }
            if with_min {
                m(
                    32,
                    Codes::U5(c),
                    Table::F16(s),
                    Offsets::PerGroup(Table::F16(o)),
                    "Q5_1",
                )
            } else {
                // w = d · (q − 16): an offset of −16 · scale.
                m(32, Codes::U5(c), Table::F16(s), Offsets::Zero(16.0), "Q5_0")
            }
        }
        GgmlDType::Q8_0 => {
            let (mut c, mut s) = (Vec::with_capacity(n), Vec::with_capacity(n / 32));
            for b in blocks {
                s.push(h(b, 0));
                c.extend(b[2..34].iter().map(|&q| q as i8));
            }
            m(32, Codes::I8(c), Table::F16(s), Offsets::None, "Q8_0")
        }
        GgmlDType::Q4K => {
            let (mut c, mut s, mut o) = (
                Vec::with_capacity(n / 2),
                Vec::with_capacity(n / 32),
                Vec::with_capacity(n / 32),
            );
            for b in blocks {
                let (d, dmin, sc, qs) = (h(b, 0).to_f32(), h(b, 2).to_f32(), &b[4..16], &b[16..144]);
                for j in 0..8 {
                    let (scale, min) = scale_min_k4(j, sc);
                    s.push(d * scale as f32);
                    o.push(-(dmin * min as f32));
                    // Sub-block j: nibble (j % 2) of bytes 32·(j / 2) ..; repack to U4 order.
                    let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                    let code = |t: usize| if j % 2 == 0 { q[t] & 15 } else { q[t] >> 4 };
                    c.extend((0..16).map(|t| code(t) | (code(t + 16) << 4)));
                }
            }
            m(
                32,
                Codes::U4(c),
                Table::F32(s),
                Offsets::PerGroup(Table::F32(o)),
                "Q4_K",
            )
        }
        GgmlDType::Q5K => {
            let (mut c, mut s, mut o) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n / 32),
                Vec::with_capacity(n / 32),
            );
            for b in blocks {
                let (d, dmin, sc, qh, qs) = (h(b, 0).to_f32(), h(b, 2).to_f32(), &b[4..16], &b[16..48], &b[48..176]);
                for j in 0..8 {
                    let (scale, min) = scale_min_k4(j, sc);
                    s.push(d * scale as f32);
                    o.push(-(dmin * min as f32));
                    let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                    c.extend((0..32).map(|l| {
                        let lo = if j % 2 == 0 { q[l] & 15 } else { q[l] >> 4 };
                        lo | (((qh[l] >> j) & 1) << 4)
                    }));
                }
            }
            m(
                32,
                Codes::U8(c),
                Table::F32(s),
                Offsets::PerGroup(Table::F32(o)),
                "Q5_K",
            )
        }
        GgmlDType::Q6K => {
            let (mut c, mut s) = (vec![0u8; n], Vec::with_capacity(n / 16));
            for (bi, b) in blocks.enumerate() {
                let (ql, qh, sc, d) = (&b[..128], &b[128..192], &b[192..208], h(b, 208).to_f32());
                s.extend(sc.iter().map(|&x| d * (x as i8) as f32));
                let out = &mut c[bi * 256..bi * 256 + 256];
                for half in 0..2 {
                    let (ql, qh, y) = (&ql[64 * half..], &qh[32 * half..], &mut out[128 * half..]);
                    for l in 0..32 {
                        y[l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
                        y[l + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
                        y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                        y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                    }
                }
            }
            let c = c.into_iter().map(|q| q as i8 - 32).collect();
            m(16, Codes::I8(c), Table::F32(s), Offsets::None, "Q6_K")
        }
        _ => None,
    }
}
