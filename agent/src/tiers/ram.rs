//! The `ram` tier: encoded chunks in host memory under a byte capacity, evicting least
//! recently used chunks. Chunks are stored in their encoded form and verified on every
//! read like every other tier (a SHA-256 pass over the payload), so a bit flip in memory
//! cannot become wrong KV either.

use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;

use den_protocol::candidate::Tier;

use crate::tiers::format::{self, ContentHash};
use crate::tiers::lru::LruIndex;
use crate::tiers::{
    BoxFuture, Chunk, ChunkKey, ChunkStore, IoMeter, IoSample, IoTotals, Receipt, TierError, Usage,
};

/// Chunks in host memory.
#[derive(Debug)]
pub struct RamTier {
    index: Mutex<LruIndex<Stored>>,
    meter: IoMeter,
}

#[derive(Debug, Clone)]
struct Stored {
    bytes: Bytes,
    hash: ContentHash,
}

impl RamTier {
    /// A tier holding at most `capacity_bytes` of encoded chunks.
    pub fn new(capacity_bytes: u64) -> Self {
        RamTier {
            index: Mutex::new(LruIndex::new(capacity_bytes)),
            meter: IoMeter::default(),
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, LruIndex<Stored>> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Test hook: applies `f` to the stored bytes of `key` (to simulate memory damage).
    #[cfg(test)]
    fn tamper(&self, key: ChunkKey, f: impl FnOnce(&mut Vec<u8>)) {
        let mut index = self.index();
        if let Some(s) = index.get(&key).cloned() {
            let mut v = s.bytes.to_vec();
            f(&mut v);
            let size = v.len() as u64;
            let _ = index.insert(
                key,
                size,
                Stored {
                    bytes: Bytes::from(v),
                    hash: s.hash,
                },
            );
        }
    }
}

impl ChunkStore for RamTier {
    fn tier(&self) -> Tier {
        Tier::Ram
    }

    fn describe(&self) -> String {
        format!("ram: capacity {} bytes", self.index().capacity())
    }

    fn put<'a>(&'a self, chunk: &'a Chunk) -> BoxFuture<'a, Result<Receipt, TierError>> {
        Box::pin(async move {
            let t0 = Instant::now();
            let key = chunk.key();
            if let Some(existing) = self.index().get(&key).cloned()
                && format::decode(Tier::Ram, key, &existing.bytes).is_ok()
            {
                return Ok(Receipt {
                    tier: Tier::Ram,
                    key,
                    content_hash: existing.hash,
                    stored_bytes: existing.bytes.len() as u64,
                    fresh: false,
                    evicted: Vec::new(),
                    io: IoSample {
                        bytes: 0,
                        elapsed: t0.elapsed(),
                    },
                });
            }
            let (encoded, hash) = chunk.encode();
            let size = encoded.len() as u64;
            let stored = Stored {
                bytes: Bytes::from(encoded),
                hash,
            };
            let evicted = {
                let mut index = self.index();
                let capacity = index.capacity();
                index
                    .insert(key, size, stored)
                    .map_err(|_| TierError::TooLarge {
                        tier: Tier::Ram,
                        key,
                        bytes: size,
                        capacity,
                    })?
            };
            let io = IoSample {
                bytes: size,
                elapsed: t0.elapsed(),
            };
            self.meter.write(io, evicted.len());
            Ok(Receipt {
                tier: Tier::Ram,
                key,
                content_hash: hash,
                stored_bytes: size,
                fresh: true,
                evicted: evicted.into_iter().map(|(k, _)| k).collect(),
                io,
            })
        })
    }

    fn get(&self, key: ChunkKey) -> BoxFuture<'_, Result<Chunk, TierError>> {
        Box::pin(async move {
            let t0 = Instant::now();
            let stored = self.index().get(&key).cloned();
            let result = match stored {
                None => Err(TierError::Missing {
                    tier: Tier::Ram,
                    key,
                }),
                Some(s) => {
                    let n = s.bytes.len() as u64;
                    match format::decode_bytes(Tier::Ram, key, s.bytes) {
                        Ok((chunk, _)) => {
                            self.meter.read(IoSample {
                                bytes: n,
                                elapsed: t0.elapsed(),
                            });
                            Ok(chunk)
                        }
                        Err(e) => {
                            // Drop the damaged copy so a later put stores a good one.
                            self.index().remove(&key);
                            Err(e)
                        }
                    }
                }
            };
            self.meter.failed(&result);
            result
        })
    }

    fn contains(&self, key: ChunkKey) -> BoxFuture<'_, Result<bool, TierError>> {
        Box::pin(async move { Ok(self.index().contains(&key)) })
    }

    fn delete(&self, key: ChunkKey) -> BoxFuture<'_, Result<bool, TierError>> {
        Box::pin(async move { Ok(self.index().remove(&key).is_some()) })
    }

    fn usage(&self) -> BoxFuture<'_, Result<Usage, TierError>> {
        Box::pin(async move { Ok(self.index().usage()) })
    }

    fn io_totals(&self) -> IoTotals {
        self.meter.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiers::test_support::{chunk, run};

    #[test]
    fn ram_round_trip_and_idempotent_put() {
        run(async {
            let ram = RamTier::new(1 << 20);
            let c = chunk("m", 1, 4, 100);
            let r = ram.put(&c).await.unwrap();
            assert!(r.fresh && r.evicted.is_empty());
            assert_eq!(r.content_hash, c.content_hash());
            assert_eq!(ram.get(c.key()).await.unwrap(), c);
            let again = ram.put(&c).await.unwrap();
            assert!(!again.fresh);
            assert_eq!(ram.usage().await.unwrap().count, 1);
            assert!(ram.contains(c.key()).await.unwrap());
            assert!(ram.delete(c.key()).await.unwrap());
            assert!(!ram.delete(c.key()).await.unwrap());
            let e = ram.get(c.key()).await.unwrap_err();
            assert!(matches!(
                e,
                TierError::Missing {
                    tier: Tier::Ram,
                    ..
                }
            ));
            let t = ram.io_totals();
            assert_eq!((t.reads.count, t.writes.count, t.misses), (1, 1, 1));
        });
    }

    #[test]
    fn ram_evicts_lru_and_reports_evicted_keys() {
        run(async {
            let a = chunk("m", 1, 4, 100);
            let b = chunk("m", 2, 4, 100);
            let c = chunk("m", 3, 4, 100);
            let size = a.encode().0.len() as u64;
            let ram = RamTier::new(2 * size);
            ram.put(&a).await.unwrap();
            ram.put(&b).await.unwrap();
            ram.get(a.key()).await.unwrap(); // a is now more recent than b
            let r = ram.put(&c).await.unwrap();
            assert_eq!(r.evicted, vec![b.key()]);
            assert!(ram.get(b.key()).await.unwrap_err().means_recompute());
            assert_eq!(ram.usage().await.unwrap().bytes, 2 * size);
            let small = RamTier::new(size - 1);
            assert!(matches!(
                small.put(&a).await,
                Err(TierError::TooLarge { .. })
            ));
        });
    }

    #[test]
    fn ram_detects_damaged_bytes() {
        run(async {
            let ram = RamTier::new(1 << 20);
            let c = chunk("m", 1, 4, 100);
            ram.put(&c).await.unwrap();
            ram.tamper(c.key(), |v| {
                let last = v.len() - 1;
                v[last] ^= 0x80;
            });
            let e = ram.get(c.key()).await.unwrap_err();
            assert!(
                matches!(
                    e,
                    TierError::Corrupt {
                        field: "content sha256",
                        ..
                    }
                ),
                "{e}"
            );
            // The damaged copy is dropped; a fresh put stores a good one.
            assert!(ram.put(&c).await.unwrap().fresh);
            assert_eq!(ram.get(c.key()).await.unwrap(), c);
        });
    }
}
