//! The manifest of a record in Redis, version 1 (see the crate README): a 56-byte header that
//! names the record's length, its pieces and its checksum, itself checksummed over the key
//! prefix, the record key and the header; a record that fits one piece follows it inline.

use crate::error::{Error, Result};
use crate::id::Key;

/// "KMRP".
pub const MAGIC: [u8; 4] = *b"KMRP";
/// The manifest version this build writes and reads.
pub const VERSION: u16 = 1;
/// Header bytes (an inline record follows them).
pub const HEADER_LEN: usize = 56;
const SUM_LEN: usize = 16;

/// Where the record's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// After the header, in the manifest value itself.
    Inline,
    /// In `count` pieces of `piece_bytes` each (the last one shorter), keys
    /// `{manifest}:{generation}:{i}`.
    Pieces { count: u32, piece_bytes: u32 },
}

/// A parsed, verified manifest header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Manifest {
    pub layout: Layout,
    /// Encoded record length in bytes.
    pub record_len: u64,
    /// The record's own trailing checksum (its last 16 bytes).
    pub record_sum: [u8; 16],
}

impl Manifest {
    /// The manifest of the encoded `record`, split in pieces of `piece_bytes` when larger.
    pub fn of(record: &[u8], piece_bytes: usize) -> Result<Manifest> {
        let mut record_sum = [0u8; 16];
        let tail = record.len().checked_sub(16).ok_or_else(|| Error::Invalid {
            op: "Manifest::of",
            what: "record",
            detail: format!("{} bytes, shorter than a checksum", record.len()),
        })?;
        record_sum.copy_from_slice(&record[tail..]);
        let layout = if record.len() <= piece_bytes {
            Layout::Inline
        } else {
            let count = record.len().div_ceil(piece_bytes);
            let fit = |x: usize, what| {
                u32::try_from(x).map_err(|_| Error::Invalid {
                    op: "Manifest::of",
                    what,
                    detail: format!("{x} does not fit in u32"),
                })
            };
            Layout::Pieces {
                count: fit(count, "piece count")?,
                piece_bytes: fit(piece_bytes, "piece size")?,
            }
        };
        Ok(Manifest {
            layout,
            record_len: record.len() as u64,
            record_sum,
        })
    }

    /// Distinguishes the pieces of two versions of one record: the first 8 bytes of the
    /// record checksum, as 16 hex digits.
    pub fn generation(&self) -> String {
        self.record_sum[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The header bytes for `key` under `prefix`.
    pub fn header(&self, prefix: &str, key: &Key) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4..6].copy_from_slice(&VERSION.to_le_bytes());
        let (tag, count, piece) = match self.layout {
            Layout::Inline => (0u8, 0, 0),
            Layout::Pieces { count, piece_bytes } => (1, count, piece_bytes),
        };
        h[6] = tag;
        h[8..16].copy_from_slice(&self.record_len.to_le_bytes());
        h[16..20].copy_from_slice(&count.to_le_bytes());
        h[20..24].copy_from_slice(&piece.to_le_bytes());
        h[24..40].copy_from_slice(&self.record_sum);
        let sum = checksum(prefix, key, &h[..40]);
        h[40..].copy_from_slice(&sum);
        h
    }

    /// Parses and verifies the header at the start of `bytes` (a manifest value) for `key`.
    pub fn parse(prefix: &str, key: &Key, bytes: &[u8]) -> Result<Manifest> {
        const OP: &str = "redis manifest";
        let bad = |detail: String| Error::corrupt(OP, key, detail);
        if bytes.len() < HEADER_LEN {
            return Err(bad(format!("{} bytes, shorter than a manifest header", bytes.len())));
        }
        if bytes[..4] != MAGIC {
            return Err(bad("bad manifest magic".into()));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != VERSION {
            return Err(Error::Version {
                op: OP,
                key: key.to_string(),
                found: version,
                expected: VERSION,
            });
        }
        if checksum(prefix, key, &bytes[..40]) != bytes[40..HEADER_LEN] {
            return Err(bad(
                "manifest checksum mismatch (damaged, or written for another key or prefix)".into(),
            ));
        }
        let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&bytes[8..16]);
        let record_len = u64::from_le_bytes(len);
        let (count, piece_bytes) = (u32_at(16), u32_at(20));
        let layout = match bytes[6] {
            0 => Layout::Inline,
            1 => Layout::Pieces { count, piece_bytes },
            t => return Err(bad(format!("layout tag {t}"))),
        };
        if let Layout::Pieces { count, piece_bytes } = layout
            && (piece_bytes == 0 || record_len.div_ceil(piece_bytes as u64) != count as u64)
        {
            return Err(bad(format!(
                "{count} pieces of {piece_bytes} bytes for a {record_len}-byte record"
            )));
        }
        let mut record_sum = [0u8; 16];
        record_sum.copy_from_slice(&bytes[24..40]);
        Ok(Manifest {
            layout,
            record_len,
            record_sum,
        })
    }

    /// Expected length of piece `i`.
    pub fn piece_len(&self, i: u32) -> u64 {
        match self.layout {
            Layout::Inline => self.record_len,
            Layout::Pieces { count, piece_bytes } => {
                let p = piece_bytes as u64;
                if i + 1 < count {
                    p
                } else {
                    self.record_len - p * (count as u64 - 1)
                }
            }
        }
    }
}

/// blake3 (derive-key `kamera.redis.manifest.v1`) of the length-prefixed prefix, the 81 key
/// bytes and the header's first 40 bytes; first 16 bytes.
fn checksum(prefix: &str, key: &Key, head: &[u8]) -> [u8; SUM_LEN] {
    let mut h = blake3::Hasher::new_derive_key("kamera.redis.manifest.v1");
    h.update(&(prefix.len() as u64).to_le_bytes());
    h.update(prefix.as_bytes());
    h.update(&key.to_bytes());
    h.update(head);
    let mut out = [0u8; SUM_LEN];
    out.copy_from_slice(&h.finalize().as_bytes()[..SUM_LEN]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{ChunkId, ModelFp};

    #[test]
    fn every_byte_flip_of_a_header_is_refused_and_other_keys_do_not_verify() {
        let m = ModelFp::of("m");
        let key = Key::canonical(m, ChunkId::of(b"x", "e", m));
        let record: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let man = Manifest::of(&record, 300).unwrap();
        assert_eq!(
            man.layout,
            Layout::Pieces {
                count: 4,
                piece_bytes: 300
            }
        );
        assert_eq!((0..4).map(|i| man.piece_len(i)).sum::<u64>(), 1000);
        let h = man.header("p", &key);
        assert_eq!(Manifest::parse("p", &key, &h).unwrap(), man);
        for at in 0..HEADER_LEN {
            for mask in [1u8, 0x80, 0xff] {
                let mut b = h;
                b[at] ^= mask;
                assert!(
                    Manifest::parse("p", &key, &b).is_err_and(|e| e.is_miss()),
                    "flip at {at}"
                );
            }
        }
        assert!(Manifest::parse("q", &key, &h).is_err(), "another prefix");
        let other = Key::canonical(m, ChunkId::of(b"y", "e", m));
        assert!(Manifest::parse("p", &other, &h).is_err(), "another key");
        assert!(Manifest::parse("p", &key, &h[..HEADER_LEN - 1]).is_err(), "truncated");
        assert_eq!(Manifest::of(&record, 1000).unwrap().layout, Layout::Inline);
    }
}
