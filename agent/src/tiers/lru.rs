//! A byte-capacity LRU index over chunk keys, shared by the `ram` and `ssd` tiers.
//! Deterministic: recency is a logical tick, ties are impossible, no hashing.

use std::collections::BTreeMap;

use crate::tiers::{ChunkKey, Usage};

#[derive(Debug)]
struct Entry<V> {
    size: u64,
    tick: u64,
    value: V,
}

#[derive(Debug)]
pub(crate) struct LruIndex<V> {
    entries: BTreeMap<ChunkKey, Entry<V>>,
    /// tick → key, oldest first.
    order: BTreeMap<u64, ChunkKey>,
    tick: u64,
    bytes: u64,
    capacity: u64,
}

/// The entry would not fit even in an empty index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooLarge;

impl<V> LruIndex<V> {
    pub(crate) fn new(capacity: u64) -> Self {
        LruIndex {
            entries: BTreeMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            capacity,
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn usage(&self) -> Usage {
        Usage {
            bytes: self.bytes,
            count: self.entries.len() as u64,
            capacity: Some(self.capacity),
        }
    }

    /// Keys from least to most recently used.
    pub(crate) fn keys_oldest_first(&self) -> Vec<ChunkKey> {
        self.order.values().copied().collect()
    }

    pub(crate) fn contains(&self, key: &ChunkKey) -> bool {
        self.entries.contains_key(key)
    }

    /// The value, marking it most recently used.
    pub(crate) fn get(&mut self, key: &ChunkKey) -> Option<&V> {
        self.touch(key);
        self.entries.get(key).map(|e| &e.value)
    }

    /// Marks `key` most recently used.
    pub(crate) fn touch(&mut self, key: &ChunkKey) {
        let tick = self.next_tick();
        if let Some(e) = self.entries.get_mut(key) {
            self.order.remove(&e.tick);
            e.tick = tick;
            self.order.insert(tick, *key);
        }
    }

    /// Inserts (or replaces) `key`, evicting least recently used entries until it fits.
    /// Returns the evicted entries, oldest first. Nothing changes on `TooLarge`.
    pub(crate) fn insert(
        &mut self,
        key: ChunkKey,
        size: u64,
        value: V,
    ) -> Result<Vec<(ChunkKey, V)>, TooLarge> {
        if size > self.capacity {
            return Err(TooLarge);
        }
        self.remove(&key);
        let mut evicted = Vec::new();
        while self.bytes + size > self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.bytes -= e.size;
                evicted.push((oldest, e.value));
            }
        }
        let tick = self.next_tick();
        self.order.insert(tick, key);
        self.entries.insert(key, Entry { size, tick, value });
        self.bytes += size;
        Ok(evicted)
    }

    pub(crate) fn remove(&mut self, key: &ChunkKey) -> Option<V> {
        let e = self.entries.remove(key)?;
        self.order.remove(&e.tick);
        self.bytes -= e.size;
        Some(e.value)
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use den_protocol::chunk::PrefixHash;

    fn k(n: u8) -> ChunkKey {
        ChunkKey(PrefixHash([n; 16]))
    }

    #[test]
    fn evicts_least_recently_used_first_and_tracks_bytes() {
        let mut lru = LruIndex::new(100);
        assert!(lru.insert(k(1), 40, ()).unwrap().is_empty());
        assert!(lru.insert(k(2), 40, ()).unwrap().is_empty());
        lru.touch(&k(1));
        let ev = lru.insert(k(3), 40, ()).unwrap();
        assert_eq!(ev.iter().map(|e| e.0).collect::<Vec<_>>(), vec![k(2)]);
        assert_eq!(lru.usage().bytes, 80);
        assert_eq!(lru.insert(k(4), 101, ()), Err(TooLarge));
        // Replacing a key frees its old size first.
        assert!(lru.insert(k(3), 60, ()).unwrap().is_empty());
        assert_eq!((lru.usage().bytes, lru.usage().count), (100, 2));
        assert!(lru.remove(&k(1)).is_some());
        assert_eq!(lru.usage().bytes, 60);
        assert!(!lru.contains(&k(1)));
    }
}
