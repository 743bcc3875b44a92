//! The worker's chunk tiers, its index of the chunks it stored, and the checkpoint path
//! (spec §8.4): captured rows → chunks → `put` into every configured tier → wait for
//! every receipt → only then publish.
//!
//! Decisions:
//! - A chunk is published with the local tiers (ram, ssd) whose receipts came back, and
//!   with `object = true` only when the object store's receipt came back. A chunk no tier
//!   acknowledged is not published, and nothing after it in the chain is either (a
//!   catalog run must be root-contiguous to be usable).
//! - Chunks a capacity-bounded tier evicted to make room (listed in its receipts) are
//!   retracted for that tier.
//! - Object-store usage is reported as the bytes this worker wrote there: listing a
//!   shared bucket on every heartbeat would cost more than it tells.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;

use den_protocol::candidate::Tier;
use den_protocol::chunk::PrefixHash;
use den_protocol::chunk_catalog::ChunkEntry;
use den_protocol::ids::ModelFingerprint;
use den_protocol::observation::TierUsage;
use den_protocol::wire::{PublishedChunk, RetractedChunk};

use crate::tiers::{
    Chunk, ChunkKey, ChunkMeta, ChunkStore, IoTotals, ObjectTier, RamTier, SsdTier, TierError,
};

/// The configured tiers, fastest first.
#[derive(Clone, Default)]
pub struct Tiers {
    pub ram: Option<Arc<RamTier>>,
    pub ssd: Option<Arc<SsdTier>>,
    pub object: Option<Arc<ObjectTier>>,
}

impl Tiers {
    /// Every configured tier in restore order: ram, ssd, object.
    pub fn ordered(&self) -> Vec<(Tier, Arc<dyn ChunkStore>)> {
        let mut out: Vec<(Tier, Arc<dyn ChunkStore>)> = Vec::new();
        if let Some(t) = &self.ram {
            out.push((Tier::Ram, Arc::clone(t) as Arc<dyn ChunkStore>));
        }
        if let Some(t) = &self.ssd {
            out.push((Tier::Ssd, Arc::clone(t) as Arc<dyn ChunkStore>));
        }
        if let Some(t) = &self.object {
            out.push((Tier::Object, Arc::clone(t) as Arc<dyn ChunkStore>));
        }
        out
    }

    pub fn get(&self, tier: Tier) -> Option<Arc<dyn ChunkStore>> {
        self.ordered()
            .into_iter()
            .find(|(t, _)| *t == tier)
            .map(|(_, s)| s)
    }

    pub fn is_empty(&self) -> bool {
        self.ram.is_none() && self.ssd.is_none() && self.object.is_none()
    }

    /// The set of configured tiers.
    pub fn kinds(&self) -> BTreeSet<Tier> {
        self.ordered().into_iter().map(|(t, _)| t).collect()
    }

    /// Bytes and chunks held per tier (object: bytes this worker wrote).
    pub async fn usage(&self) -> BTreeMap<Tier, TierUsage> {
        let mut out = BTreeMap::new();
        for (tier, store) in self.ordered() {
            let usage = if tier == Tier::Object {
                let w = store.io_totals().writes;
                TierUsage {
                    bytes: w.bytes,
                    chunks: w.count,
                    capacity_bytes: 0,
                }
            } else {
                match store.usage().await {
                    Ok(u) => TierUsage {
                        bytes: u.bytes,
                        chunks: u.count,
                        capacity_bytes: u.capacity.unwrap_or(0),
                    },
                    Err(_) => TierUsage::default(),
                }
            };
            out.insert(tier, usage);
        }
        out
    }

    /// I/O totals per tier (reads feed the heartbeat's tier throughputs).
    pub fn io_totals(&self) -> BTreeMap<Tier, IoTotals> {
        self.ordered()
            .into_iter()
            .map(|(t, s)| (t, s.io_totals()))
            .collect()
    }
}

/// What the worker knows about one chunk it stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub entry: ChunkEntry,
    /// Tiers whose receipt came back and that have not evicted it since.
    pub tiers: BTreeSet<Tier>,
}

/// Chunks this worker stored, by storage key.
#[derive(Debug, Default)]
pub struct ChunkIndex {
    chunks: BTreeMap<ChunkKey, IndexEntry>,
}

impl ChunkIndex {
    pub fn get(&self, key: &ChunkKey) -> Option<&IndexEntry> {
        self.chunks.get(key)
    }

    /// Whether every tier in `tiers` already holds the chunk.
    pub fn holds_all(&self, key: &ChunkKey, tiers: &BTreeSet<Tier>) -> bool {
        self.chunks
            .get(key)
            .is_some_and(|e| tiers.iter().all(|t| e.tiers.contains(t)))
    }

    /// Record stored chunks; returns the frames to publish.
    pub fn record(&mut self, stored: &[StoredChunk]) -> Vec<PublishedChunk> {
        stored
            .iter()
            .map(|s| {
                let e = self.chunks.entry(s.key).or_insert_with(|| IndexEntry {
                    entry: s.entry.clone(),
                    tiers: BTreeSet::new(),
                });
                e.tiers.extend(s.tiers.iter().copied());
                e.entry.object |= s.entry.object;
                published(e)
            })
            .collect()
    }

    /// A tier no longer holds `key`: forget it there and return the retraction to send
    /// (none when the chunk was never recorded in that tier).
    pub fn forget(&mut self, key: &ChunkKey, tier: Tier) -> Option<RetractedChunk> {
        let e = self.chunks.get_mut(key)?;
        let mut had = e.tiers.remove(&tier);
        if tier == Tier::Object {
            had |= std::mem::replace(&mut e.entry.object, false);
        }
        let out = had.then(|| RetractedChunk {
            model: e.entry.model.clone(),
            hash: e.entry.hash,
            tier,
        });
        if e.tiers.is_empty() && !e.entry.object {
            self.chunks.remove(key);
        }
        out
    }

    /// Every chunk as a publish frame entry (sent again after each reconnect: the router
    /// drops a node's replicas when it detaches the worker).
    pub fn all(&self) -> Vec<PublishedChunk> {
        self.chunks.values().map(published).collect()
    }

    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

fn published(e: &IndexEntry) -> PublishedChunk {
    PublishedChunk {
        entry: e.entry.clone(),
        tiers: e
            .tiers
            .iter()
            .copied()
            .filter(|t| matches!(t, Tier::Ram | Tier::Ssd))
            .collect(),
    }
}

/// One chunk that at least one tier acknowledged.
#[derive(Debug, Clone)]
pub struct StoredChunk {
    pub key: ChunkKey,
    pub entry: ChunkEntry,
    pub tiers: BTreeSet<Tier>,
}

/// The outcome of one checkpoint.
#[derive(Debug, Default)]
pub struct CheckpointOutcome {
    /// Chunks acknowledged by at least one tier, in chain order (a root-contiguous run of
    /// what was asked).
    pub stored: Vec<StoredChunk>,
    /// Whether every chunk asked for was stored.
    pub complete: bool,
    /// Keys tiers evicted to make room.
    pub evicted: Vec<(ChunkKey, Tier)>,
    /// Tier failures (one line each) for the log.
    pub errors: Vec<String>,
    pub usage: BTreeMap<Tier, TierUsage>,
}

/// Store captured chunks in every tier and wait for the receipts.
pub async fn checkpoint(tiers: Tiers, captured: Vec<(ChunkMeta, Bytes)>) -> CheckpointOutcome {
    let mut out = CheckpointOutcome {
        complete: true,
        ..CheckpointOutcome::default()
    };
    for (meta, payload) in captured {
        let chunk = match Chunk::new(meta, payload) {
            Ok(c) => c,
            Err(e) => {
                out.errors.push(e.to_string());
                out.complete = false;
                break;
            }
        };
        let mut acked = BTreeSet::new();
        for (tier, store) in tiers.ordered() {
            match store.put(&chunk).await {
                Ok(receipt) => {
                    acked.insert(tier);
                    out.evicted
                        .extend(receipt.evicted.into_iter().map(|k| (k, tier)));
                }
                Err(e) => out.errors.push(e.to_string()),
            }
        }
        if acked.is_empty() {
            out.complete = false;
            break;
        }
        let m = &chunk.meta;
        out.stored.push(StoredChunk {
            key: chunk.key(),
            entry: ChunkEntry {
                model: m.model.clone(),
                hash: m.prefix,
                parent: m.parent,
                start: m.start,
                token_count: m.token_count,
                bytes: m.payload_bytes(),
                object: acked.contains(&Tier::Object),
            },
            tiers: acked,
        });
    }
    out.usage = tiers.usage().await;
    out
}

/// A replica found missing or corrupt during a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadReplica {
    pub key: ChunkKey,
    pub model: ModelFingerprint,
    pub hash: PrefixHash,
    pub tier: Tier,
    pub corrupt: bool,
}

impl BadReplica {
    /// A replica of `model`'s chunk `hash` in `tier` that is there but wrong.
    pub fn corrupt(model: &ModelFingerprint, hash: PrefixHash, tier: Tier) -> Self {
        BadReplica {
            key: ChunkKey::of(model, hash),
            model: model.clone(),
            hash,
            tier,
            corrupt: true,
        }
    }

    pub fn from_error(
        e: &TierError,
        key: ChunkKey,
        model: &ModelFingerprint,
        hash: PrefixHash,
        tier: Tier,
    ) -> Option<Self> {
        e.means_recompute().then(|| BadReplica {
            key,
            model: model.clone(),
            hash,
            tier,
            corrupt: matches!(e, TierError::Corrupt { .. }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(n: u8, tiers: &[Tier], object: bool) -> StoredChunk {
        StoredChunk {
            key: ChunkKey(PrefixHash([n; 16])),
            entry: ChunkEntry {
                model: "m".into(),
                hash: PrefixHash([n; 16]),
                parent: PrefixHash::ROOT,
                start: 0,
                token_count: 4,
                bytes: 64,
                object,
            },
            tiers: tiers.iter().copied().collect(),
        }
    }

    #[test]
    fn index_records_publishes_and_retracts_per_tier() {
        let mut ix = ChunkIndex::default();
        let frames = ix.record(&[stored(1, &[Tier::Ram, Tier::Object], true)]);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].tiers, vec![Tier::Ram]);
        assert!(frames[0].entry.object);
        let key = ChunkKey(PrefixHash([1; 16]));
        assert!(ix.holds_all(&key, &[Tier::Ram].into_iter().collect()));
        assert!(!ix.holds_all(&key, &[Tier::Ssd].into_iter().collect()));
        let r = ix.forget(&key, Tier::Ram).unwrap();
        assert_eq!(r.tier, Tier::Ram);
        assert!(ix.forget(&key, Tier::Ram).is_none(), "retracted only once");
        assert_eq!(ix.len(), 1, "still in the object store");
        assert!(ix.forget(&key, Tier::Object).is_some());
        assert!(ix.is_empty());
    }
}
