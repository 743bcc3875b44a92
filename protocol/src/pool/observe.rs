//! What a worker's heartbeat says about its pool (spec §3.8, test L-4).

use std::collections::BTreeSet;

use super::PagePool;
use crate::ids::RouteId;
use crate::observation::{GpuPrefix, PoolStats};

impl PagePool {
    /// Occupancy for operators. `evictable` is computed with `protected` excluded (pass
    /// the routes of every non-terminal assignment); `durable` counts pages referenced by
    /// at least one durable route.
    pub fn stats(&self, protected: &BTreeSet<RouteId>) -> PoolStats {
        let mut durable_page = vec![false; self.page_count() as usize];
        for r in self.routes.values().filter(|r| r.policy.durable) {
            for p in &r.pages {
                // Route pages are < page_count (pool invariant).
                durable_page[p.index()] = true;
            }
        }
        let durable = durable_page.iter().filter(|d| **d).count() as u32;
        PoolStats {
            total_pages: self.page_count(),
            free: self.free_count(),
            reserved: self.reserved_count(),
            resident: self.referenced_count(),
            evictable: self.evictable_pages(protected),
            durable,
            page_bytes: self.geometry.page_bytes,
        }
    }

    /// Prefixes to advertise: for every route whose policy records a model and prefix
    /// hashes, one entry per recorded boundary `b` with `0 < b ≤ token_count` — the
    /// route's exact end when it is recorded, and each chunk boundary strictly inside.
    /// Bytes scale with the boundary: `route_bytes × b / token_count` (integer division),
    /// where `route_bytes = token_count × page_bytes / page_size`.
    ///
    /// Order: by route id, then longest boundary first. Boundaries recorded beyond the
    /// route's current length are never advertised.
    pub fn gpu_prefixes(&self) -> Vec<GpuPrefix> {
        let mut out = Vec::new();
        for (id, r) in &self.routes {
            let Some(identity) = &r.policy.identity else {
                continue;
            };
            if r.token_count == 0 {
                continue;
            }
            let bytes = self.geometry.bytes_for(r.token_count);
            for (&boundary, &hash) in identity.prefixes.range(1..=r.token_count).rev() {
                let scaled = bytes as u128 * boundary as u128 / r.token_count as u128;
                out.push(GpuPrefix {
                    model: identity.model.clone(),
                    prefix_hash: hash,
                    continuation_id: id.clone(),
                    token_count: boundary,
                    bytes: u64::try_from(scaled).unwrap_or(u64::MAX),
                });
            }
        }
        out
    }
}
