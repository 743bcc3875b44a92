//! The chunk catalog: which published chunks exist, in which storage tiers, and which
//! node holds a ready RAM/SSD replica of each. The router keeps one and builds durable
//! candidates from it ([`crate::candidate_generation`]). Not the model-card catalog of the
//! management API (den-agent's `ModelCatalog`), which says what can be placed.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::candidate::Tier;
use crate::chunk::{ChunkDescriptor, PrefixHash};
use crate::ids::{ModelFingerprint, NodeId};

/// A published (durable) chunk: its bytes exist in at least one storage tier and were
/// acknowledged by that tier before publication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkEntry {
    pub model: ModelFingerprint,
    pub hash: PrefixHash,
    pub parent: PrefixHash,
    pub start: u32,
    pub token_count: u32,
    pub bytes: u64,
    /// The chunk is in the shared object store (fetchable by any worker that has one).
    pub object: bool,
}

/// The chunk catalog: published chunks and which node holds a ready RAM/SSD replica.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChunkCatalog {
    chunks: BTreeMap<(ModelFingerprint, PrefixHash), ChunkEntry>,
    replicas: BTreeMap<(NodeId, ModelFingerprint, PrefixHash), BTreeSet<Tier>>,
}

impl ChunkCatalog {
    /// Publish a chunk (idempotent; a later publication may add the object flag).
    pub fn publish(&mut self, entry: ChunkEntry) {
        let key = (entry.model.clone(), entry.hash);
        match self.chunks.get_mut(&key) {
            Some(existing) => existing.object |= entry.object,
            None => {
                self.chunks.insert(key, entry);
            }
        }
    }

    /// Record a ready local replica of a published chunk on `node` in `tier` (ram or ssd).
    pub fn add_replica(
        &mut self,
        node: NodeId,
        model: ModelFingerprint,
        hash: PrefixHash,
        tier: Tier,
    ) {
        self.replicas
            .entry((node, model, hash))
            .or_default()
            .insert(tier);
    }

    /// Forget a replica (evicted from that tier).
    pub fn remove_replica(
        &mut self,
        node: &NodeId,
        model: &ModelFingerprint,
        hash: PrefixHash,
        tier: Tier,
    ) {
        let key = (node.clone(), model.clone(), hash);
        if let Some(tiers) = self.replicas.get_mut(&key) {
            tiers.remove(&tier);
            if tiers.is_empty() {
                self.replicas.remove(&key);
            }
        }
    }

    /// The chunk's object-store copy is gone or corrupt: stop offering it from the object
    /// store (local replicas are unaffected). A worker that stores it again republishes it.
    pub fn withdraw_object(&mut self, model: &ModelFingerprint, hash: PrefixHash) {
        if let Some(e) = self.chunks.get_mut(&(model.clone(), hash)) {
            e.object = false;
        }
    }

    /// Forget every replica on a node (the node left the cluster).
    pub fn remove_node(&mut self, node: &NodeId) {
        self.replicas.retain(|(n, _, _), _| n != node);
    }

    pub fn chunk(&self, model: &ModelFingerprint, hash: PrefixHash) -> Option<&ChunkEntry> {
        self.chunks.get(&(model.clone(), hash))
    }

    pub fn local_tiers(
        &self,
        node: &NodeId,
        model: &ModelFingerprint,
        hash: PrefixHash,
    ) -> Option<&BTreeSet<Tier>> {
        self.replicas.get(&(node.clone(), model.clone(), hash))
    }

    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The longest root-contiguous run of catalogued chunks matching `plan` exactly
    /// (parent, start and count all agree), so a corrupt middle entry cannot make later
    /// chunks loadable.
    pub fn matched_run<'p>(
        &self,
        model: &ModelFingerprint,
        plan: &'p [ChunkDescriptor],
    ) -> Vec<(&'p ChunkDescriptor, &ChunkEntry)> {
        let mut run = Vec::new();
        for d in plan {
            match self.chunk(model, d.hash) {
                Some(e)
                    if e.parent == d.parent
                        && e.start == d.start
                        && e.token_count == d.token_count =>
                {
                    run.push((d, e))
                }
                _ => break,
            }
        }
        run
    }
}
