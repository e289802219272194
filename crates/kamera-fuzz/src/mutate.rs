//! The mutator: stacked byte-level edits (bit flips, interesting integers at aligned offsets,
//! deleted, inserted, duplicated and spliced ranges, truncation, invalid UTF-8) and dictionary
//! tokens for text formats, all from one seeded RNG so that a run is reproducible.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Integers that break length and offset checks, written little-endian.
const INTERESTING: [u64; 16] = [
    0,
    1,
    2,
    7,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x4000_0000_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
];

/// A seeded input mutator.
#[derive(Debug)]
pub struct Mutator {
    rng: StdRng,
}

impl Mutator {
    pub fn new(seed: u64) -> Mutator {
        Mutator {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { self.rng.random_range(0..n) }
    }

    /// A mutated copy of `seed`: 1 to 8 stacked edits; `others` feed splices, `dict` tokens.
    pub fn mutate(&mut self, seed: &[u8], others: &[Vec<u8>], dict: &[&[u8]]) -> Vec<u8> {
        let mut b = seed.to_vec();
        let n = 1 + self.below(8);
        for _ in 0..n {
            self.edit(&mut b, others, dict);
        }
        b
    }

    fn edit(&mut self, b: &mut Vec<u8>, others: &[Vec<u8>], dict: &[&[u8]]) {
        let len = b.len();
        match self.below(if dict.is_empty() { 10 } else { 13 }) {
            0 if len > 0 => {
                let i = self.below(len);
                b[i] ^= 1 << self.below(8);
            }
            1 if len > 0 => {
                let i = self.below(len);
                b[i] = [0, 1, 0x7f, 0x80, 0xff, self.rng.random()][self.below(6)];
            }
            2 | 3 if len >= 8 => {
                // An interesting integer (or the input length, or a neighbour of the value there)
                // over 2, 4 or 8 bytes at a 4-aligned or any offset.
                let w = [2, 4, 8][self.below(3)];
                let mut at = self.below(len - w + 1);
                if self.rng.random_bool(0.5) {
                    at &= !3;
                }
                let old = b[at..at + w].iter().rev().fold(0u64, |a, &x| a << 8 | x as u64);
                let v = match self.below(4) {
                    0 => len as u64,
                    1 => old.wrapping_add(1 + self.below(16) as u64),
                    2 => old.wrapping_sub(1 + self.below(16) as u64),
                    _ => INTERESTING[self.below(INTERESTING.len())],
                };
                b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
            4 if len > 0 => {
                let at = self.below(len);
                let n = 1 + self.below((len - at).min(64));
                b.drain(at..at + n);
            }
            5 => {
                let at = self.below(len + 1);
                let n = 1 + self.below(32);
                let ins: Vec<u8> = (0..n).map(|_| self.rng.random()).collect();
                b.splice(at..at, ins);
            }
            6 if len > 0 => {
                let from = self.below(len);
                let n = 1 + self.below((len - from).min(256));
                let chunk = b[from..from + n].to_vec();
                let at = self.below(len + 1);
                b.splice(at..at, chunk);
            }
            7 if len > 0 => {
                let keep = self.below(len);
                b.truncate(keep);
            }
            8 if !others.is_empty() => {
                let o = &others[self.below(others.len())];
                if !o.is_empty() {
                    let from = self.below(o.len());
                    let n = 1 + self.below((o.len() - from).min(512));
                    let at = self.below(len + 1);
                    let end = (at + self.below(n + 1)).min(len);
                    b.splice(at..end, o[from..from + n].iter().copied());
                }
            }
            9 => {
                let at = self.below(len + 1);
                let bad: &[u8] =
                    [&[0xc0, 0x80][..], &[0xff], &[0x80], &[0xed, 0xa0, 0x80], &[0xf4, 0x90]][self.below(5)];
                b.splice(at..at, bad.iter().copied());
            }
            10 | 11 => {
                let t = dict[self.below(dict.len())];
                let at = self.below(len + 1);
                let end = if self.rng.random_bool(0.5) {
                    (at + self.below(8)).min(len)
                } else {
                    at
                };
                b.splice(at..end, t.iter().copied());
            }
            12 => {
                // Deep nesting or a long run of one token.
                let t = dict[self.below(dict.len())];
                let at = self.below(len + 1);
                let reps = 1 + self.below(4096);
                let run: Vec<u8> = t.iter().copied().cycle().take(t.len() * reps).collect();
                b.splice(at..at, run);
            }
            _ => {
                if len > 0 {
                    let i = self.below(len);
                    b[i] = self.rng.random();
                }
            }
        }
    }
}
