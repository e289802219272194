//! Content addresses. A chunk id hashes the observation bytes with the encoder and model
//! fingerprints; a patch id adds the antecedent chunk ids and their placement; an orbit-patch id
//! adds the (unordered) chunk set. Keys start with the model fingerprint, so a prefix scan lists
//! one model's records and no key of one model can name another model's record.

use std::fmt;

use crate::error::{Error, Result};

/// 128-bit digest of a model fingerprint string (e.g. kamera-model's weights + config hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelFp(pub [u8; 16]);

impl ModelFp {
    /// The digest of `fingerprint` (any string that changes whenever the KV would change).
    pub fn of(fingerprint: &str) -> ModelFp {
        let h = derive("kamera.model.v1", &[fingerprint.as_bytes()]);
        let mut out = [0u8; 16];
        out.copy_from_slice(&h[..16]);
        ModelFp(out)
    }
}

/// Content hash of one chunk's observation under one encoder and model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub [u8; 32]);

impl ChunkId {
    /// blake3 of the observation bytes (screenshot PNG, token bytes, ...) with the encoder's
    /// and the model's fingerprints.
    pub fn of(observation: &[u8], encoder: &str, model: ModelFp) -> ChunkId {
        ChunkId(derive("kamera.chunk.v1", &[observation, encoder.as_bytes(), &model.0]))
    }
}

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// KV(B|∅): the chunk prefilled alone at positions 0..n.
    Canonical = 0,
    /// A conditioning patch for one fixed earlier context.
    Patch = 1,
    /// An orbit patch serving every ordering of one chunk set.
    Orbit = 2,
}

impl Kind {
    pub fn from_u8(b: u8) -> Option<Kind> {
        match b {
            0 => Some(Kind::Canonical),
            1 => Some(Kind::Patch),
            2 => Some(Kind::Orbit),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Kind::Canonical => "canonical",
            Kind::Patch => "patch",
            Kind::Orbit => "orbit",
        }
    }
}

/// The address of one record: model, kind, chunk, and the context hash (zero for canonical KV).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub model: ModelFp,
    pub kind: Kind,
    pub chunk: ChunkId,
    pub context: [u8; 32],
}

/// Encoded key length: model 16 + kind 1 + chunk 32 + context 32.
pub const KEY_LEN: usize = 81;

impl Key {
    /// The canonical KV of `chunk`.
    pub fn canonical(model: ModelFp, chunk: ChunkId) -> Key {
        Key {
            model,
            kind: Kind::Canonical,
            chunk,
            context: [0; 32],
        }
    }

    /// The patch of `chunk` placed at `at` after `antecedents` (each with its start position), in
    /// that order.
    pub fn patch(model: ModelFp, chunk: ChunkId, antecedents: &[(ChunkId, i64)], at: i64) -> Key {
        let mut h = blake3::Hasher::new_derive_key("kamera.patch.v1");
        h.update(&(antecedents.len() as u64).to_le_bytes());
        for (id, pos) in antecedents {
            h.update(&id.0);
            h.update(&pos.to_le_bytes());
        }
        h.update(&at.to_le_bytes());
        Key {
            model,
            kind: Kind::Patch,
            chunk,
            context: *h.finalize().as_bytes(),
        }
    }

    /// The orbit patch of `chunk` over the chunk set `set` (order and duplicates ignored).
    pub fn orbit(model: ModelFp, chunk: ChunkId, set: &[ChunkId]) -> Key {
        let mut ids = set.to_vec();
        ids.sort();
        ids.dedup();
        let mut h = blake3::Hasher::new_derive_key("kamera.orbit.v1");
        h.update(&(ids.len() as u64).to_le_bytes());
        for id in &ids {
            h.update(&id.0);
        }
        Key {
            model,
            kind: Kind::Orbit,
            chunk,
            context: *h.finalize().as_bytes(),
        }
    }

    /// The slot-conditioned orbit patch of `chunk` over `set` (order and duplicates ignored) for
    /// when `chunk` sits at `slot` (0-based) among the set's chunks: the mean deficit over the
    /// orderings that put it there.
    pub fn orbit_slot(model: ModelFp, chunk: ChunkId, set: &[ChunkId], slot: usize) -> Key {
        let mut ids = set.to_vec();
        ids.sort();
        ids.dedup();
        let mut h = blake3::Hasher::new_derive_key("kamera.orbit-slot.v1");
        h.update(&(ids.len() as u64).to_le_bytes());
        for id in &ids {
            h.update(&id.0);
        }
        h.update(&(slot as u64).to_le_bytes());
        Key {
            model,
            kind: Kind::Orbit,
            chunk,
            context: *h.finalize().as_bytes(),
        }
    }

    /// The 81 key bytes (model | kind | chunk | context).
    pub fn to_bytes(&self) -> [u8; KEY_LEN] {
        let mut b = [0u8; KEY_LEN];
        b[..16].copy_from_slice(&self.model.0);
        b[16] = self.kind as u8;
        b[17..49].copy_from_slice(&self.chunk.0);
        b[49..].copy_from_slice(&self.context);
        b
    }

    /// Parses key bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Key> {
        let bad = |detail: String| Error::Invalid {
            op: "Key::from_bytes",
            what: "key",
            detail,
        };
        if b.len() != KEY_LEN {
            return Err(bad(format!("{} bytes, expected {KEY_LEN}", b.len())));
        }
        let kind = Kind::from_u8(b[16]).ok_or_else(|| bad(format!("kind byte {}", b[16])))?;
        let mut model = [0u8; 16];
        model.copy_from_slice(&b[..16]);
        let mut chunk = [0u8; 32];
        chunk.copy_from_slice(&b[17..49]);
        let mut context = [0u8; 32];
        context.copy_from_slice(&b[49..]);
        Ok(Key {
            model: ModelFp(model),
            kind,
            chunk: ChunkId(chunk),
            context,
        })
    }
}

fn derive(context: &str, parts: &[&[u8]]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(context);
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    *h.finalize().as_bytes()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl fmt::Display for ModelFp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.name(), &hex(&self.chunk.0)[..16])?;
        if self.kind != Kind::Canonical {
            write!(f, "/{}", &hex(&self.context)[..12])?;
        }
        write!(f, "@{}", &hex(&self.model.0)[..8])
    }
}

fn unhex<const N: usize>(s: &str, what: &'static str) -> Result<[u8; N]> {
    let bad = |detail: String| Error::Invalid {
        op: "parse",
        what,
        detail,
    };
    if s.len() != 2 * N || !s.is_ascii() {
        return Err(bad(format!("{s:?} is not {} hex digits", 2 * N)));
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad(format!("{s:?} is not hex")))?;
    }
    Ok(out)
}

impl std::str::FromStr for ChunkId {
    type Err = Error;
    /// 64 hex digits, as [`ChunkId`]'s `Display` writes them.
    fn from_str(s: &str) -> Result<ChunkId> {
        unhex::<32>(s, "chunk id").map(ChunkId)
    }
}

impl Key {
    /// The key's 81 bytes as 162 hex digits (what serde writes; [`Key::from_hex`] reads it).
    pub fn to_hex(&self) -> String {
        hex(&self.to_bytes())
    }
    /// Parses [`Key::to_hex`].
    pub fn from_hex(s: &str) -> Result<Key> {
        Key::from_bytes(&unhex::<KEY_LEN>(s, "key")?)
    }
}

// Ids and keys travel in traces and reports as hex strings.
impl serde::Serialize for ChunkId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ChunkId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<ChunkId, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for Key {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Key, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Key::from_hex(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_keys_round_trip_as_hex() {
        let m = ModelFp::of("m");
        let id = ChunkId::of(b"page", "text", m);
        assert_eq!(id.to_string().parse::<ChunkId>().unwrap(), id);
        let key = Key::patch(m, id, &[(id, 3)], 9);
        assert_eq!(Key::from_hex(&key.to_hex()).unwrap(), key);
        assert!("xyz".parse::<ChunkId>().is_err());
        assert!(Key::from_hex(&"0".repeat(162)).is_ok());
        assert!(Key::from_hex(&"g".repeat(162)).is_err());
    }

    #[test]
    fn slot_orbit_keys_depend_on_the_set_and_the_slot_only() {
        let m = ModelFp::of("m");
        let (a, b) = (ChunkId::of(b"a", "text", m), ChunkId::of(b"b", "text", m));
        let k = |set: &[ChunkId], slot| Key::orbit_slot(m, a, set, slot);
        assert_eq!(k(&[a, b], 1), k(&[b, a, a], 1));
        assert_ne!(k(&[a, b], 0), k(&[a, b], 1));
        assert_ne!(k(&[a, b], 0), Key::orbit(m, a, &[a, b]));
        assert_eq!(k(&[a, b], 0).kind, Kind::Orbit);
    }
}
