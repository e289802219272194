//! The vision tower's outputs kept by image, least recently used out first past a budget of
//! bytes, as SGLang's `MultiModalCache` (`SGLANG_VLM_CACHE_SIZE_MB`, 100 by default): the
//! Session's by image chunk ([`SessionConfig::tower_cache_bytes`](crate::SessionConfig)), the
//! session bench's radix cache's by screenshot. An image whose output has gone is run through
//! the tower again when it is prefilled again; a long session's memory no longer grows with
//! every screenshot it has seen.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// SGLang's default budget for its vision outputs: 100 MiB.
pub const TOWER_CACHE_BYTES: usize = 100 << 20;

/// f32 tower outputs by key within a budget of bytes.
#[derive(Debug)]
pub struct TowerCache<K> {
    budget: usize,
    bytes: usize,
    clock: u64,
    held: HashMap<K, (u64, Arc<Vec<f32>>)>,
}

impl<K: Hash + Eq + Clone> TowerCache<K> {
    /// An empty cache of at most `budget_bytes` (0: nothing is kept).
    pub fn new(budget_bytes: usize) -> TowerCache<K> {
        TowerCache {
            budget: budget_bytes,
            bytes: 0,
            clock: 0,
            held: HashMap::new(),
        }
    }

    /// `key`'s output, now the most recently used, if it is held.
    pub fn get(&mut self, key: &K) -> Option<Arc<Vec<f32>>> {
        self.clock += 1;
        let e = self.held.get_mut(key)?;
        e.0 = self.clock;
        Some(e.1.clone())
    }

    /// Keeps `embeds` as `key`'s output, the most recently used, and lets the least recently
    /// used go until the budget holds (the new one last: alone over the budget, it is not kept).
    /// Returns it for the caller's use either way.
    pub fn insert(&mut self, key: K, embeds: Vec<f32>) -> Arc<Vec<f32>> {
        self.clock += 1;
        let e = Arc::new(embeds);
        self.bytes += 4 * e.len();
        if let Some((_, old)) = self.held.insert(key, (self.clock, e.clone())) {
            self.bytes -= 4 * old.len();
        }
        while self.bytes > self.budget {
            let Some(k) = self.held.iter().min_by_key(|(_, v)| v.0).map(|(k, _)| k.clone()) else {
                break;
            };
            if let Some((_, gone)) = self.held.remove(&k) {
                self.bytes -= 4 * gone.len();
            }
        }
        e
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Outputs held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_first_and_the_budget_holds() {
        // Budget: three outputs of 10 floats.
        let mut c = TowerCache::new(120);
        for k in 0..3 {
            c.insert(k, vec![k as f32; 10]);
        }
        assert_eq!((c.len(), c.bytes()), (3, 120));
        assert!(c.get(&0).is_some(), "0 is now the most recently used");
        c.insert(3, vec![3.0; 10]);
        assert!(c.get(&1).is_none(), "1 was the least recently used");
        for k in [0, 2, 3] {
            assert_eq!(c.get(&k).unwrap()[0], k as f32);
        }
        assert_eq!(c.bytes(), 120);
        // A key inserted again replaces its output and its bytes.
        c.insert(3, vec![7.0; 5]);
        assert_eq!((c.len(), c.bytes()), (3, 100));
        // An output over the budget alone is returned and not kept; the others go first.
        let big = c.insert(9, vec![1.0; 40]);
        assert_eq!(big.len(), 40);
        assert!(c.is_empty() && c.bytes() == 0, "{} bytes held", c.bytes());
        // A budget of 0 keeps nothing.
        let mut none = TowerCache::new(0);
        assert_eq!(none.insert("a", vec![1.0]).len(), 1);
        assert!(none.get(&"a").is_none());
    }
}
