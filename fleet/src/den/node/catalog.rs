//! What the simulated workers hold, as den's router node learns it: the chunks of each
//! trace block, published to and retracted from the node's catalog as the replay's
//! tiers change, and the GPU prefixes a heartbeat lists.

use super::*;

impl NodePolicy {
    /// Learns the chunk of each reusable block of the request (every block but the
    /// last, whose chunk is the request's own partial one).
    pub(super) fn learn(&mut self, blocks: &[u32], plan: &[ChunkDescriptor], fleet: &FleetView) {
        let cap = blocks.len().saturating_sub(1);
        let mut parent_block = None;
        for (&b, d) in blocks.iter().take(cap).zip(plan) {
            if d.token_count != fleet.block_tokens(b) {
                break;
            }
            if let Some(slot) = self.chunks.get_mut(b as usize)
                && slot.is_none()
            {
                *slot = Some(BlockChunk {
                    hash: d.hash,
                    parent: d.parent,
                    parent_block,
                    start: d.start,
                    tokens: d.token_count,
                });
            }
            parent_block = Some(b);
        }
    }

    pub(super) fn entry(
        model: &ModelFingerprint,
        c: &BlockChunk,
        fleet: &FleetView,
        object: bool,
    ) -> ChunkEntry {
        ChunkEntry {
            model: model.clone(),
            hash: c.hash,
            parent: c.parent,
            start: c.start,
            token_count: c.tokens,
            bytes: fleet.cost.kv_bytes(u64::from(c.tokens)),
            object,
        }
    }

    /// Brings the catalog's view of the request's blocks up to what the workers hold:
    /// each worker publishes the RAM/SSD replicas it gained and retracts those it lost,
    /// and a finished upload is published as an object-store copy.
    pub(super) fn sync_catalog(&mut self, blocks: &[u32], fleet: &FleetView, now: Millis) {
        let Some(node) = self.node.as_ref() else {
            return;
        };
        let mut frames: Vec<(usize, ToRouter)> = Vec::new();
        let mut object = Vec::new();
        for &b in blocks {
            let Some(Some(c)) = self.chunks.get(b as usize) else {
                break;
            };
            if fleet.uploaded(b) && !self.in_object.get(b as usize).copied().unwrap_or(true) {
                object.push(PublishedChunk {
                    entry: Self::entry(&self.model, c, fleet, true),
                    tiers: Vec::new(),
                });
                if let Some(flag) = self.in_object.get_mut(b as usize) {
                    *flag = true;
                }
            }
        }
        if !object.is_empty() {
            frames.push((0, ToRouter::Publish(Publish { chunks: object })));
        }
        for w in 0..fleet.worker_count() {
            let id = FleetView::worker_id(w);
            let node_id = NodeId(id.0);
            let mut gained = Vec::new();
            let mut lost = Vec::new();
            for &b in blocks {
                let Some(Some(c)) = self.chunks.get(b as usize) else {
                    break;
                };
                let known = node.catalog().local_tiers(&node_id, &self.model, c.hash);
                for (level, tier) in [(Level::Ram, Tier::Ram), (Level::Ssd, Tier::Ssd)] {
                    let holds = fleet.holds(w, level, b);
                    let listed = known.is_some_and(|t| t.contains(&tier));
                    if holds && !listed {
                        gained.push(PublishedChunk {
                            entry: Self::entry(&self.model, c, fleet, false),
                            tiers: vec![tier],
                        });
                    } else if listed && !holds {
                        lost.push(RetractedChunk {
                            model: self.model.clone(),
                            hash: c.hash,
                            tier,
                        });
                    }
                }
            }
            if !gained.is_empty() {
                frames.push((w, ToRouter::Publish(Publish { chunks: gained })));
            }
            if !lost.is_empty() {
                frames.push((w, ToRouter::Retract(Retract { chunks: lost })));
            }
        }
        let Some(node) = self.node.as_mut() else {
            return;
        };
        for (w, frame) in frames {
            let effects = send(node, now, conn(w), frame);
            drop(effects); // catalog updates ask for nothing
        }
    }

    /// The root-contiguous GPU-resident blocks of `blocks` on worker `w`, as prefixes.
    pub(super) fn request_prefixes(
        &self,
        w: usize,
        blocks: &[u32],
        fleet: &FleetView,
    ) -> Vec<GpuPrefix> {
        let route = route_of(w);
        blocks
            .iter()
            .map_while(|&b| {
                let c = self.chunks.get(b as usize).copied().flatten()?;
                fleet
                    .holds(w, Level::Gpu, b)
                    .then(|| self.prefix(&c, &route, fleet))
            })
            .collect()
    }

    /// Every block resident on worker `w`'s GPU whose chain is resident from the root.
    pub(super) fn all_prefixes(&self, w: usize, fleet: &FleetView) -> Vec<GpuPrefix> {
        let route = route_of(w);
        let resident = fleet.gpu_blocks(w);
        let mut rooted: HashMap<u32, bool> = HashMap::with_capacity(resident.len());
        let mut out = Vec::new();
        for &b in &resident {
            if self.rooted(b, w, fleet, &mut rooted)
                && let Some(Some(c)) = self.chunks.get(b as usize)
            {
                out.push(self.prefix(c, &route, fleet));
            }
        }
        out
    }

    /// Whether block `b` and every block before it in its chain are on worker `w`'s GPU.
    pub(super) fn rooted(
        &self,
        b: u32,
        w: usize,
        fleet: &FleetView,
        memo: &mut HashMap<u32, bool>,
    ) -> bool {
        let mut chain = Vec::new();
        let mut at = Some(b);
        let mut answer = true;
        while let Some(x) = at {
            if let Some(&known) = memo.get(&x) {
                answer = known;
                break;
            }
            let Some(Some(c)) = self.chunks.get(x as usize) else {
                answer = false;
                break;
            };
            if !fleet.holds(w, Level::Gpu, x) {
                answer = false;
                break;
            }
            chain.push(x);
            at = c.parent_block;
        }
        // A break on a missing or evicted block makes it and everything after it false.
        for x in chain {
            memo.insert(x, answer);
        }
        answer
    }

    pub(super) fn prefix(&self, c: &BlockChunk, route: &RouteId, fleet: &FleetView) -> GpuPrefix {
        let end = c.start + c.tokens;
        GpuPrefix {
            model: self.model.clone(),
            prefix_hash: c.hash,
            continuation_id: route.clone(),
            token_count: end,
            bytes: fleet.cost.kv_bytes(u64::from(end)),
        }
    }
}
