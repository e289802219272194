//! Reports of the maintenance work a persistent store offers (`kamera store stats | verify |
//! gc`): usage by model and kind, verification, garbage collection. One shape for the sled store
//! and for Redis, so the CLI prints both the same way.

use std::collections::BTreeMap;

use crate::id::{Key, Kind, ModelFp};

/// Records and encoded bytes of one (model, kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageRow {
    pub model: ModelFp,
    pub kind: Kind,
    pub records: u64,
    /// Encoded record bytes (the codec's length; Redis' own overhead is not included).
    pub bytes: u64,
}

/// What a store holds, by model and kind (`SledStore::usage`, `RedisStore::usage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// One row per (model, kind), in that order.
    pub rows: Vec<UsageRow>,
    /// Entries whose size could not be read (a Redis manifest header that does not verify);
    /// `verify` names them.
    pub unreadable: u64,
}

impl Usage {
    /// Totals of `(key, encoded bytes)` entries by model and kind.
    pub fn of(entries: impl IntoIterator<Item = (Key, u64)>) -> Usage {
        let mut by: BTreeMap<(ModelFp, Kind), (u64, u64)> = BTreeMap::new();
        for (key, bytes) in entries {
            let e = by.entry((key.model, key.kind)).or_default();
            e.0 += 1;
            e.1 += bytes;
        }
        Usage {
            rows: by
                .into_iter()
                .map(|((model, kind), (records, bytes))| UsageRow {
                    model,
                    kind,
                    records,
                    bytes,
                })
                .collect(),
            unreadable: 0,
        }
    }

    /// Records over all rows.
    pub fn records(&self) -> u64 {
        self.rows.iter().map(|r| r.records).sum()
    }

    /// Encoded bytes over all rows.
    pub fn bytes(&self) -> u64 {
        self.rows.iter().map(|r| r.bytes).sum()
    }
}

/// Result of `verify` (`SledStore::verify`, `RedisStore::verify`).
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    pub ok: u64,
    /// (key or raw key hex, why) of every unusable record.
    pub bad: Vec<(String, String)>,
    /// (kind, records, encoded bytes, tokens) of the healthy records.
    pub by_kind: Vec<(Kind, u64, u64, u64)>,
    /// Pieces that no manifest names (Redis only): a put still in flight, or a writer that died
    /// before publishing. Not damage: nothing reads them; `gc` removes them.
    pub orphan_pieces: u64,
}

impl VerifyReport {
    /// Counts a healthy record of `kind` (in `ok` and its `by_kind` row).
    pub fn healthy(&mut self, kind: Kind, bytes: u64, tokens: u64) {
        self.ok += 1;
        let at = self.by_kind.partition_point(|r| r.0 < kind);
        match self.by_kind.get_mut(at) {
            Some(r) if r.0 == kind => {
                r.1 += 1;
                r.2 += bytes;
                r.3 += tokens;
            }
            _ => self.by_kind.insert(at, (kind, 1, bytes, tokens)),
        }
    }
}

/// Result of `gc` (`SledStore::gc`, `RedisStore::gc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub removed_bad: u64,
    /// Records evicted to meet a byte budget (sled only: Redis evicts by its own
    /// `maxmemory-policy`).
    pub evicted: u64,
    /// Orphan pieces removed (Redis only).
    pub orphan_pieces: u64,
    pub freed_bytes: u64,
    pub remaining_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::ChunkId;

    #[test]
    fn usage_sums_by_model_and_kind() {
        let (a, b) = (ModelFp::of("a"), ModelFp::of("b"));
        let id = |s: &[u8], m| ChunkId::of(s, "e", m);
        let u = Usage::of([
            (Key::canonical(a, id(b"1", a)), 10),
            (Key::canonical(a, id(b"2", a)), 5),
            (Key::orbit(a, id(b"1", a), &[id(b"1", a)]), 7),
            (Key::canonical(b, id(b"1", b)), 1),
        ]);
        assert_eq!((u.records(), u.bytes(), u.rows.len()), (4, 23, 3));
        let row = |m, k| u.rows.iter().find(|r| r.model == m && r.kind == k).copied();
        assert_eq!(row(a, Kind::Canonical).map(|r| (r.records, r.bytes)), Some((2, 15)));
        assert_eq!(row(a, Kind::Orbit).map(|r| (r.records, r.bytes)), Some((1, 7)));
        assert_eq!(row(b, Kind::Canonical).map(|r| (r.records, r.bytes)), Some((1, 1)));
    }

    #[test]
    fn verify_rows_stay_in_kind_order() {
        let mut v = VerifyReport::default();
        for (kind, bytes) in [
            (Kind::Orbit, 3),
            (Kind::Canonical, 10),
            (Kind::Orbit, 4),
            (Kind::Patch, 1),
        ] {
            v.healthy(kind, bytes, 2);
        }
        assert_eq!(v.ok, 4);
        assert_eq!(
            v.by_kind,
            vec![
                (Kind::Canonical, 1, 10, 2),
                (Kind::Patch, 1, 1, 2),
                (Kind::Orbit, 2, 7, 4)
            ]
        );
    }
}
