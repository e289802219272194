//! The bit-level coding of transform-coded patches: a coefficient column quantised to 2-8 bits
//! with an f16 scale per 32 tokens, its codes fixed-width or canonical-Huffman-coded (whichever is
//! shorter), and the width map naming each basis column's coding (4 bits, or Huffman-coded).

use half::f16;

use crate::error::{Result, invalid};
use crate::quant::INT4_GROUP;

/// The bit widths a coefficient column may take (index = its width code in a record).
pub const WIDTHS: [u8; 7] = [0, 2, 3, 4, 5, 6, 8];

/// Longest Huffman code; a column whose optimal code is longer stays fixed-width.
const MAX_CODE_LEN: u8 = 15;

/// Symbols of the width map: width index · 2 + Huffman flag.
pub(crate) const MAP_SYMBOLS: usize = 2 * WIDTHS.len() + 1;

/// Clip ratios tried per group for widths up to 4 bits (least squared error wins): coarse codes
/// lose less to clipping a few large values than to rounding all the others.
const CLIPS: [f32; 4] = [1.0, 0.85, 0.7, 0.55];

/// One stored coefficient column: basis column `index`, `bits` wide, its codes Huffman-coded or
/// not, one f16 scale per [`INT4_GROUP`] tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct CodedColumn {
    pub index: u16,
    pub bits: u8,
    pub huffman: bool,
    pub scales: Vec<f16>,
    pub codes: Vec<i8>,
}

fn qmax(bits: u8) -> i32 {
    (1i32 << (bits - 1)) - 1
}

impl CodedColumn {
    /// Checks a column of `n` tokens: a stored width (not 0), `n` codes within its range, one
    /// finite, non-negative scale per [`INT4_GROUP`] tokens.
    pub fn check(&self, op: &'static str, n: usize) -> Result<()> {
        let j = self.index;
        if self.bits == 0 || !WIDTHS.contains(&self.bits) {
            return Err(invalid(
                op,
                "coded column",
                format!("column {j}: {} bits (one of {WIDTHS:?} but 0)", self.bits),
            ));
        }
        let q = qmax(self.bits);
        if self.codes.len() != n || self.scales.len() != n.div_ceil(INT4_GROUP) {
            return Err(invalid(
                op,
                "coded column",
                format!(
                    "column {j}: {} codes and {} scales for {n} tokens",
                    self.codes.len(),
                    self.scales.len()
                ),
            ));
        }
        if let Some(c) = self.codes.iter().find(|&&c| (c as i32).abs() > q) {
            return Err(invalid(
                op,
                "coded column",
                format!("column {j}: code {c} outside ±{q}"),
            ));
        }
        if let Some(s) = self.scales.iter().find(|s| !s.is_finite() || s.is_sign_negative()) {
            return Err(invalid(op, "coded column", format!("column {j}: scale {s}")));
        }
        Ok(())
    }
    /// code · scale per token.
    pub fn values(&self) -> Vec<f32> {
        self.codes
            .iter()
            .enumerate()
            .map(|(i, &c)| c as f32 * self.scales[i / INT4_GROUP].to_f32())
            .collect()
    }
    /// Its symbol in the width map.
    pub(crate) fn symbol(&self) -> usize {
        symbol(self.bits, self.huffman)
    }
    /// Stored bytes: scales, then codes (each column starts on a byte).
    pub(crate) fn bytes(&self) -> usize {
        2 * self.scales.len() + code_bytes(&self.codes, self.bits, self.huffman).unwrap_or(usize::MAX / 4)
    }
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        self.scales
            .iter()
            .for_each(|s| out.extend_from_slice(&s.to_bits().to_le_bytes()));
        let mut w = BitWriter::default();
        let q = qmax(self.bits);
        let sym = |c: i8| (c as i32 + q) as u32;
        if self.huffman {
            let lens = huffman_lengths(&counts(&self.codes, q)).expect("a Huffman column has code lengths");
            put_codes(&mut w, &lens, self.codes.iter().map(|&c| sym(c) as usize));
        } else {
            self.codes.iter().for_each(|&c| w.put(sym(c), self.bits as u32));
        }
        out.extend_from_slice(&w.out);
    }
    /// Reads a column of `n` tokens written by [`CodedColumn::write`].
    pub(crate) fn read(r: &mut &[u8], n: usize, index: u16, bits: u8, huffman: bool) -> Result<CodedColumn> {
        const OP: &str = "coded column";
        let groups = n.div_ceil(INT4_GROUP);
        let raw = take(r, 2 * groups)?;
        let scales: Vec<f16> = raw
            .chunks_exact(2)
            .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])))
            .collect();
        if let Some(i) = scales.iter().position(|s| !s.is_finite() || s.is_sign_negative()) {
            return Err(invalid(
                OP,
                "scale",
                format!("column {index}: scale {i} is {}", scales[i]),
            ));
        }
        let q = qmax(bits);
        let mut br = BitReader { b: r, pos: 0 };
        let codes: Vec<i8> = if huffman {
            let lens: Vec<u8> = (0..2 * q as usize + 1)
                .map(|_| br.get(4).map(|x| x as u8))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid(OP, "Huffman table", format!("column {index}: ends early")))?;
            let dec = Decoder::new(&lens).ok_or_else(|| {
                invalid(
                    OP,
                    "Huffman table",
                    format!("column {index}: lengths {lens:?} are no prefix code"),
                )
            })?;
            (0..n)
                .map(|_| dec.symbol(&mut br).map(|s| (s as i32 - q) as i8))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid(OP, "Huffman codes", format!("column {index}: {n} codes do not decode")))?
        } else {
            (0..n)
                .map(|_| br.get(bits as u32).map(|x| x as i32 - q))
                .collect::<Option<Vec<i32>>>()
                .ok_or_else(|| invalid(OP, "codes", format!("column {index}: ends early")))?
                .into_iter()
                .map(|c| if c.abs() <= q { Ok(c as i8) } else { Err(c) })
                .collect::<std::result::Result<_, i32>>()
                .map_err(|c| invalid(OP, "code", format!("column {index}: {c} outside ±{q}")))?
        };
        let used = br.pos.div_ceil(8);
        *r = &r[used..];
        Ok(CodedColumn {
            index,
            bits,
            huffman,
            scales,
            codes,
        })
    }
}

pub(crate) fn symbol(bits: u8, huffman: bool) -> usize {
    let w = WIDTHS.iter().position(|&b| b == bits).expect("a known width");
    2 * w + huffman as usize
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if n > r.len() {
        return Err(invalid(
            "coded patch",
            "payload",
            format!("ends early: need {n} bytes, {} left", r.len()),
        ));
    }
    let (head, rest) = r.split_at(n);
    *r = rest;
    Ok(head)
}

/// `x` quantised to `bits`-bit symmetric codes with an f16 scale per group of 32 (the clip ratio
/// with the least squared error, weighted per token by `w`): the column, and that error.
pub(crate) fn quantise_column(x: &[f32], w: Option<&[f32]>, index: u16, bits: u8) -> (CodedColumn, f64) {
    let wt = |i: usize| w.map_or(1.0, |w| w[i] as f64);
    let groups = x.len().div_ceil(INT4_GROUP);
    let mut col = CodedColumn {
        index,
        bits,
        huffman: false,
        scales: vec![f16::ZERO; if bits == 0 { 0 } else { groups }],
        codes: vec![0; if bits == 0 { 0 } else { x.len() }],
    };
    let energy = |from: usize, xs: &[f32]| -> f64 {
        xs.iter()
            .enumerate()
            .map(|(i, &v)| wt(from + i) * (v as f64).powi(2))
            .sum()
    };
    if bits == 0 {
        return (col, energy(0, x));
    }
    let q = qmax(bits) as f32;
    let clips: &[f32] = if bits <= 4 { &CLIPS } else { &CLIPS[..1] };
    let mut total = 0.0;
    for (g, xs) in x.chunks(INT4_GROUP).enumerate() {
        let base = g * INT4_GROUP;
        let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let mut best: Option<(f64, f16)> = None;
        for &c in clips {
            let s = f16::from_f32(c * max / q);
            let sf = s.to_f32();
            if !(sf > 0.0 && sf.is_finite()) {
                continue;
            }
            let e: f64 = xs
                .iter()
                .enumerate()
                .map(|(i, &v)| wt(base + i) * ((v - (v / sf).round().clamp(-q, q) * sf) as f64).powi(2))
                .sum();
            if best.is_none_or(|(be, _)| e < be) {
                best = Some((e, s));
            }
        }
        let Some((e, s)) = best else {
            total += energy(base, xs);
            continue;
        };
        total += e;
        col.scales[g] = s;
        for (i, &v) in xs.iter().enumerate() {
            col.codes[base + i] = (v / s.to_f32()).round().clamp(-q, q) as i8;
        }
    }
    (col, total)
}

fn counts(codes: &[i8], q: i32) -> Vec<usize> {
    let mut c = vec![0usize; 2 * q as usize + 1];
    codes.iter().for_each(|&x| c[(x as i32 + q) as usize] += 1);
    c
}

/// Bytes of `codes` at `bits` bits, fixed-width or (`huffman`) Huffman-coded: a 4-bit code length
/// per symbol of the alphabet, then the codes; `None` where a Huffman code would pass 15 bits.
pub(crate) fn code_bytes(codes: &[i8], bits: u8, huffman: bool) -> Option<usize> {
    if bits == 0 {
        return Some(0);
    }
    if !huffman {
        return Some((codes.len() * bits as usize).div_ceil(8));
    }
    let c = counts(codes, qmax(bits));
    let lens = huffman_lengths(&c)?;
    let bits: usize = 4 * c.len() + c.iter().zip(&lens).map(|(n, &l)| n * l as usize).sum::<usize>();
    Some(bits.div_ceil(8))
}

/// Chooses fixed-width or (with `entropy`, where strictly shorter) Huffman-coded codes; returns
/// the column's bytes ([`CodedColumn::bytes`]).
pub(crate) fn choose_huffman(col: &mut CodedColumn, entropy: bool) -> usize {
    let fixed = code_bytes(&col.codes, col.bits, false).unwrap_or(0);
    let coded = if entropy && col.bits > 0 {
        code_bytes(&col.codes, col.bits, true).filter(|&h| h < fixed)
    } else {
        None
    };
    col.huffman = coded.is_some();
    2 * col.scales.len() + coded.unwrap_or(fixed)
}

/// Optimal code lengths for `counts` (0 for unused symbols; a lone symbol gets 1): the two
/// lightest groups merged until one is left. `None` where a length would pass 15.
pub(crate) fn huffman_lengths(counts: &[usize]) -> Option<Vec<u8>> {
    let mut groups: Vec<(usize, Vec<usize>)> = (0..counts.len())
        .filter(|&i| counts[i] > 0)
        .map(|i| (counts[i], vec![i]))
        .collect();
    let mut depth = vec![0u8; counts.len()];
    if groups.len() == 1 {
        depth[groups[0].1[0]] = 1;
    }
    while groups.len() > 1 {
        groups.sort_by_key(|g| std::cmp::Reverse(g.0));
        let (wa, a) = groups.pop()?;
        let (wb, b) = groups.pop()?;
        for &i in a.iter().chain(&b) {
            depth[i] = depth[i].saturating_add(1);
        }
        groups.push((wa + wb, [a, b].concat()));
    }
    depth.iter().all(|&d| d <= MAX_CODE_LEN).then_some(depth)
}

/// Canonical codes of `lens` (RFC 1951 §3.2.2), by symbol.
fn canonical(lens: &[u8]) -> Vec<u32> {
    let mut per_len = [0u32; 16];
    lens.iter().filter(|&&l| l > 0).for_each(|&l| per_len[l as usize] += 1);
    let mut next = [0u32; 16];
    let mut code = 0;
    for l in 1..16 {
        code = (code + per_len[l - 1]) << 1;
        next[l] = code;
    }
    lens.iter()
        .map(|&l| {
            if l == 0 {
                return 0;
            }
            let c = next[l as usize];
            next[l as usize] += 1;
            c
        })
        .collect()
}

/// The length table (4 bits per symbol), then each symbol's code, most significant bit first.
fn put_codes(w: &mut BitWriter, lens: &[u8], symbols: impl Iterator<Item = usize>) {
    lens.iter().for_each(|&l| w.put(l as u32, 4));
    let codes = canonical(lens);
    for s in symbols {
        for i in (0..lens[s]).rev() {
            w.put(codes[s] >> i & 1, 1);
        }
    }
}

/// A canonical Huffman decoder (counts per length, symbols in code order).
struct Decoder {
    per_len: [u32; 16],
    sorted: Vec<usize>,
}

impl Decoder {
    /// `None` for an over-subscribed table (no prefix code) or one without symbols.
    fn new(lens: &[u8]) -> Option<Decoder> {
        let mut per_len = [0u32; 16];
        lens.iter().filter(|&&l| l > 0).for_each(|&l| per_len[l as usize] += 1);
        let mut left: i64 = 1;
        for &n in &per_len[1..] {
            left = 2 * left - n as i64;
            if left < 0 {
                return None;
            }
        }
        let mut sorted: Vec<usize> = (0..lens.len()).filter(|&s| lens[s] > 0).collect();
        sorted.sort_by_key(|&s| (lens[s], s));
        (!sorted.is_empty()).then_some(Decoder { per_len, sorted })
    }
    fn symbol(&self, r: &mut BitReader<'_>) -> Option<usize> {
        let (mut code, mut first, mut index) = (0u32, 0u32, 0u32);
        for l in 1..16 {
            code |= r.get(1)?;
            let n = self.per_len[l];
            if code < first + n {
                return Some(self.sorted[(index + code - first) as usize]);
            }
            index += n;
            first = (first + n) << 1;
            code <<= 1;
        }
        None
    }
}

/// Bytes of the width map of `symbols`: 4 bits each, or with `entropy` a byte naming the form
/// and, where shorter, the symbols Huffman-coded (a 4-bit length per symbol, then the codes).
pub(crate) fn map_bytes(symbols: &[usize], entropy: bool) -> usize {
    let fixed = symbols.len().div_ceil(2);
    if !entropy {
        return fixed;
    }
    1 + map_huffman_bytes(symbols).map_or(fixed, |h| h.min(fixed))
}

fn map_counts(symbols: &[usize]) -> Vec<usize> {
    let mut c = vec![0usize; MAP_SYMBOLS];
    symbols.iter().for_each(|&s| c[s] += 1);
    c
}

fn map_huffman_bytes(symbols: &[usize]) -> Option<usize> {
    let c = map_counts(symbols);
    let lens = huffman_lengths(&c)?;
    Some((4 * c.len() + c.iter().zip(&lens).map(|(n, &l)| n * l as usize).sum::<usize>()).div_ceil(8))
}

/// Writes the width map as [`map_bytes`] counts it.
pub(crate) fn write_map(out: &mut Vec<u8>, symbols: &[usize], entropy: bool) {
    let fixed = symbols.len().div_ceil(2);
    let huffman = entropy && map_huffman_bytes(symbols).is_some_and(|h| h < fixed);
    if entropy {
        out.push(huffman as u8);
    }
    let mut w = BitWriter::default();
    if huffman {
        let lens = huffman_lengths(&map_counts(symbols)).expect("checked above");
        put_codes(&mut w, &lens, symbols.iter().copied());
    } else {
        symbols.iter().for_each(|&s| w.put(s as u32, 4));
    }
    out.extend_from_slice(&w.out);
}

/// Reads `len` width-map symbols written by [`write_map`].
pub(crate) fn read_map(r: &mut &[u8], len: usize, entropy: bool) -> Result<Vec<usize>> {
    const OP: &str = "coded patch";
    let huffman = if entropy {
        match take(r, 1)?[0] {
            0 => false,
            1 => true,
            b => return Err(invalid(OP, "width map", format!("form byte {b} (0 fixed, 1 Huffman)"))),
        }
    } else {
        false
    };
    let mut br = BitReader { b: r, pos: 0 };
    let symbols: Option<Vec<usize>> = if huffman {
        let lens: Option<Vec<u8>> = (0..MAP_SYMBOLS).map(|_| br.get(4).map(|x| x as u8)).collect();
        let dec = lens.as_deref().and_then(Decoder::new);
        dec.and_then(|d| (0..len).map(|_| d.symbol(&mut br)).collect())
    } else {
        (0..len).map(|_| br.get(4).map(|x| x as usize)).collect()
    };
    let symbols = symbols.ok_or_else(|| invalid(OP, "width map", format!("{len} symbols do not decode")))?;
    if let Some(s) = symbols.iter().find(|&&s| s >= 2 * WIDTHS.len()) {
        return Err(invalid(
            OP,
            "width map",
            format!("symbol {s} (at most {})", 2 * WIDTHS.len() - 1),
        ));
    }
    if let Some(s) = symbols.iter().find(|&&s| s == 1 || (!entropy && s % 2 == 1)) {
        return Err(invalid(
            OP,
            "width map",
            format!(
                "symbol {s}: Huffman codes without {}",
                if *s == 1 { "a width" } else { "an entropy-coded record" }
            ),
        ));
    }
    let used = br.pos.div_ceil(8);
    *r = &r[used..];
    Ok(symbols)
}

/// Bits appended least significant first.
#[derive(Default)]
struct BitWriter {
    out: Vec<u8>,
    pos: usize,
}

impl BitWriter {
    fn put(&mut self, value: u32, len: u32) {
        for i in 0..len {
            if self.pos % 8 == 0 {
                self.out.push(0);
            }
            let last = self.out.len() - 1;
            self.out[last] |= ((value >> i & 1) as u8) << (self.pos % 8);
            self.pos += 1;
        }
    }
}

struct BitReader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl BitReader<'_> {
    fn get(&mut self, len: u32) -> Option<u32> {
        let mut v = 0;
        for i in 0..len {
            let byte = *self.b.get(self.pos / 8)?;
            v |= ((byte >> (self.pos % 8) & 1) as u32) << i;
            self.pos += 1;
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huffman_columns_round_trip_and_count_their_bytes_exactly() {
        let x: Vec<f32> = (0..301)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.01 * (i % 7) as f32)
            .collect();
        for bits in [2u8, 3, 4, 5, 6, 8] {
            for entropy in [false, true] {
                let (mut col, _) = quantise_column(&x, None, 9, bits);
                choose_huffman(&mut col, entropy);
                let mut out = Vec::new();
                col.write(&mut out);
                assert_eq!(out.len(), col.bytes(), "bits {bits}");
                let mut r = out.as_slice();
                let back = CodedColumn::read(&mut r, x.len(), 9, bits, col.huffman).unwrap();
                assert!(r.is_empty());
                assert_eq!(back, col, "bits {bits} entropy {entropy}");
            }
        }
        // A peaked column codes shorter Huffman-coded.
        let peaked: Vec<i8> = (0..300).map(|i| i8::from(i % 10 == 0)).collect();
        assert!(code_bytes(&peaked, 4, true) < code_bytes(&peaked, 4, false));
    }

    #[test]
    fn width_maps_round_trip_and_bad_maps_are_refused() {
        let symbols: Vec<usize> = (0..401).map(|i| if i % 8 == 0 { 6 } else { 0 }).collect();
        for entropy in [false, true] {
            let mut out = Vec::new();
            write_map(&mut out, &symbols, entropy);
            assert_eq!(out.len(), map_bytes(&symbols, entropy));
            let mut r = out.as_slice();
            assert_eq!(read_map(&mut r, symbols.len(), entropy).unwrap(), symbols);
        }
        assert!(map_bytes(&symbols, true) < 401 / 8 + 10);
        let bad = [0xffu8; 4];
        let e = read_map(&mut bad.as_slice(), 8, false).unwrap_err().to_string();
        assert!(e.contains("symbol 15"), "{e}");
    }
}
