//! The payload's byte-level pieces: float matrices in a storage dtype, quantised factor codes
//! with their scales, the mixed 4-bit scale-layout flags, and the bounds-checked [`Reader`] that
//! decoding takes them back with.

use half::{bf16, f16};
use kamera_ops::{
    Buf, DType, Grain, LowRank, Mat, Quant, Scales, dequantise, pack_nibbles, quant_codes, unpack_nibbles,
};

use crate::error::{Error, Result};
use crate::id::Key;

pub(super) fn dtype_code(d: DType) -> u8 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Bf16 => 2,
    }
}

pub(super) fn dtype_of(b: u8) -> Option<DType> {
    match b {
        0 => Some(DType::F32),
        1 => Some(DType::F16),
        2 => Some(DType::Bf16),
        _ => None,
    }
}

pub(super) fn put_mat(out: &mut Vec<u8>, m: &Mat, dtype: DType) {
    let conv;
    let m = if m.dtype() == dtype {
        m
    } else {
        conv = m.to_dtype(dtype);
        &conv
    };
    match m.data() {
        Buf::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Buf::F16(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
        Buf::Bf16(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
    }
}

/// The flags byte of a mixed 4-bit layer: bit set = per-direction f32 scales.
pub(super) fn grain_flags(g: [[Grain; 2]; 2]) -> u8 {
    let bit = |g: Grain, at: u8| u8::from(g == Grain::Direction) << at;
    bit(g[0][0], 0) | bit(g[0][1], 1) | bit(g[1][0], 2) | bit(g[1][1], 3)
}

pub(super) fn grains_of(key: &Key, flags: u8) -> Result<[[Grain; 2]; 2]> {
    if flags & 0xf0 != 0 {
        return Err(Error::corrupt(
            "decode",
            key,
            format!("scale layout flags {flags:#04x}"),
        ));
    }
    let g = |at: u8| {
        if flags >> at & 1 == 1 {
            Grain::Direction
        } else {
            Grain::Group
        }
    };
    Ok([[g(0), g(1)], [g(2), g(3)]])
}

pub(super) fn put_codes(out: &mut Vec<u8>, lr: &LowRank, s: &Scales, q: Quant) -> Result<()> {
    let (p, wt) = quant_codes(lr, s).map_err(|source| Error::Ops { op: "encode", source })?;
    for ((codes, scales), g) in [(&p, &s.p), (&wt, &s.wt)].into_iter().zip(s.grain) {
        if q == Quant::Int8 {
            out.extend(codes.iter().map(|&c| c as u8));
        } else {
            out.extend_from_slice(&pack_nibbles(codes));
        }
        match g {
            Grain::Group => scales
                .iter()
                .for_each(|x| out.extend_from_slice(&f16::from_f32(*x).to_bits().to_le_bytes())),
            Grain::Direction => scales.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
    }
    Ok(())
}

pub(super) struct Reader<'a> {
    pub(super) b: &'a [u8],
    pub(super) key: &'a Key,
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.b.len() {
            return Err(Error::corrupt(
                "decode",
                self.key,
                format!("payload ends early: need {n} bytes, {} left", self.b.len()),
            ));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    pub(super) fn u32(&mut self) -> Result<usize> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
    pub(super) fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        let b = self.take(n.saturating_mul(4))?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    fn codes(&mut self, len: usize, q: Quant) -> Result<Vec<i8>> {
        let b = self.take(q.code_bytes(len))?;
        Ok(match q {
            Quant::Int8 => b.iter().map(|&x| x as i8).collect(),
            _ => unpack_nibbles(b, len),
        })
    }
    fn scales(&mut self, len: usize, g: Grain) -> Result<Vec<f32>> {
        match g {
            Grain::Group => {
                let b = self.take(len.saturating_mul(2))?;
                Ok(b.chunks_exact(2)
                    .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                    .collect())
            }
            _ => self.f32s(len),
        }
    }
    /// A quantised factor pair: P codes, P scales, Wᵀ codes, Wᵀ scales.
    pub(super) fn quantised(
        &mut self,
        n: usize,
        m: usize,
        f: usize,
        q: Quant,
        grain: [Grain; 2],
    ) -> Result<(LowRank, Scales)> {
        let p = self.codes(n.saturating_mul(m), q)?;
        let sp = self.scales(m.saturating_mul(grain[0].groups(n)), grain[0])?;
        let wt = self.codes(m.saturating_mul(f), q)?;
        let sw = self.scales(m.saturating_mul(grain[1].groups(f)), grain[1])?;
        let s = Scales { p: sp, wt: sw, grain };
        let lr = dequantise(n, m, f, &p, &wt, &s, Vec::new()).map_err(|source| Error::Ops { op: "decode", source })?;
        Ok((lr, s))
    }
    pub(super) fn mat(&mut self, rows: usize, cols: usize, dtype: DType) -> Result<Mat> {
        let len = rows.saturating_mul(cols);
        let b = self.take(len.saturating_mul(dtype.size()))?;
        let u16s = || b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
        let buf = match dtype {
            DType::F32 => Buf::F32(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            DType::F16 => Buf::F16(u16s().map(f16::from_bits).collect()),
            DType::Bf16 => Buf::Bf16(u16s().map(bf16::from_bits).collect()),
        };
        Mat::new(rows, cols, buf).map_err(|e| Error::corrupt("decode", self.key, e.to_string()))
    }
}
