//! A byte-bounded LRU of verified blocks and object metadata (sans-I/O). Only bytes that
//! passed their checksum are ever inserted, so a hit needs no re-check.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;

use crate::frame::FrameMeta;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CacheKey {
    Meta(Arc<str>),
    Block(Arc<str>, u32),
}

#[derive(Debug, Clone)]
pub enum CacheValue {
    Meta(Arc<FrameMeta>),
    Block(Bytes),
}

impl CacheValue {
    fn cost_bytes(&self) -> u64 {
        // The fixed part approximates the map entries' own overhead.
        const ENTRY_OVERHEAD_BYTES: u64 = 64;
        ENTRY_OVERHEAD_BYTES
            + match self {
                CacheValue::Meta(m) => m.block_checksums.len() as u64 * 8,
                CacheValue::Block(b) => b.len() as u64,
            }
    }
}

/// Least-recently-used, bounded by the sum of its values' sizes.
pub struct Lru {
    capacity_bytes: u64,
    used_bytes: u64,
    tick: u64,
    map: HashMap<CacheKey, (CacheValue, u64)>,
    order: BTreeMap<u64, CacheKey>,
}

impl Lru {
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            used_bytes: 0,
            tick: 0,
            map: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    pub fn get(&mut self, key: &CacheKey) -> Option<CacheValue> {
        self.tick += 1;
        let tick = self.tick;
        let (value, t) = self.map.get_mut(key)?;
        self.order.remove(t);
        *t = tick;
        self.order.insert(tick, key.clone());
        Some(value.clone())
    }

    pub fn insert(&mut self, key: CacheKey, value: CacheValue) {
        let cost = value.cost_bytes();
        if cost > self.capacity_bytes {
            return; // would evict everything and still not fit
        }
        self.remove(&key);
        while self.used_bytes + cost > self.capacity_bytes {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some((v, _)) = self.map.remove(&oldest) {
                self.used_bytes -= v.cost_bytes();
            }
        }
        self.tick += 1;
        self.order.insert(self.tick, key.clone());
        self.map.insert(key, (value, self.tick));
        self.used_bytes += cost;
    }

    pub fn remove(&mut self, key: &CacheKey) {
        if let Some((v, t)) = self.map.remove(key) {
            self.order.remove(&t);
            self.used_bytes -= v.cost_bytes();
        }
    }

    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(key: &str, i: u32) -> CacheKey {
        CacheKey::Block(Arc::from(key), i)
    }

    #[test]
    fn stays_within_its_bound_and_evicts_the_least_recent() {
        let mut lru = Lru::new(3 * (64 + 100));
        for i in 0..3 {
            lru.insert(
                block("k", i),
                CacheValue::Block(Bytes::from(vec![0u8; 100])),
            );
        }
        assert!(lru.get(&block("k", 0)).is_some()); // 1 is now the least recent
        lru.insert(
            block("k", 3),
            CacheValue::Block(Bytes::from(vec![0u8; 100])),
        );
        assert!(lru.used_bytes() <= 3 * (64 + 100));
        assert!(lru.get(&block("k", 1)).is_none());
        assert!(lru.get(&block("k", 0)).is_some());
        assert!(lru.get(&block("k", 3)).is_some());
        assert_eq!(lru.len(), 3);
    }

    #[test]
    fn a_value_larger_than_the_cache_is_not_kept() {
        let mut lru = Lru::new(100);
        lru.insert(
            block("k", 0),
            CacheValue::Block(Bytes::from(vec![0u8; 1000])),
        );
        assert!(lru.is_empty());
        assert_eq!(lru.used_bytes(), 0);
    }
}
