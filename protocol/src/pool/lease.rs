//! Leases (spec §4.3): pin route snapshots for one scheduled batch.
//!
//! A lease takes one reference per page per occurrence of a route, so while it lives the
//! snapshot's pages cannot return to the free set: a leased route's partial tail becomes
//! copy-on-write for later appends, and a route released under a lease keeps its pages
//! pinned until the lease is released. A *prospective* lease pins the post-append
//! snapshot of exact pending appends, so attention can be queued behind the append on an
//! in-order device queue; naming an append that is no longer pending is rejected.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::PagePool;
use super::append::AppendId;
use super::error::PoolError;
use super::page::Page;
use super::scatter::PageTable;
use crate::ids::RouteId;

/// A lease, unique for the lifetime of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease {}", self.0)
    }
}

/// One pinned route snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseEntry {
    pub route: RouteId,
    pub pages: Vec<Page>,
    pub token_count: u32,
    pub start_position: u32,
}

/// Pinned snapshots, in the order they were named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub entries: Vec<LeaseEntry>,
    pub prospective: bool,
}

impl Lease {
    /// The dense page table of the leased snapshots (what a batch's kernels read).
    pub fn page_table(&self) -> PageTable {
        PageTable::from_rows(
            self.entries
                .iter()
                .map(|e| (e.pages.as_slice(), e.token_count, e.start_position)),
        )
    }
}

impl PagePool {
    /// Pin the committed snapshots of `routes` (a route may appear more than once; each
    /// occurrence pins). Every route must exist; nothing changes otherwise.
    pub fn lease(&mut self, routes: &[RouteId]) -> Result<LeaseId, PoolError> {
        let mut entries = Vec::with_capacity(routes.len());
        for id in routes {
            let r = self
                .routes
                .get(id)
                .ok_or_else(|| PoolError::UnknownRoute(id.clone()))?;
            entries.push(LeaseEntry {
                route: id.clone(),
                pages: r.pages.clone(),
                token_count: r.token_count,
                start_position: r.start_position,
            });
        }
        Ok(self.pin(Lease {
            entries,
            prospective: false,
        }))
    }

    /// Pin the post-append snapshots of the named pending appends. Every entry must name
    /// the exact pending append of its route; a stale entry rejects the whole lease.
    pub fn lease_prospective(
        &mut self,
        appends: &[(RouteId, AppendId)],
    ) -> Result<LeaseId, PoolError> {
        let mut entries = Vec::with_capacity(appends.len());
        for (id, append) in appends {
            let (pages, token_count) = self.pending_snapshot(id, *append)?;
            let start_position = self.routes.get(id).map_or(0, |r| r.start_position);
            entries.push(LeaseEntry {
                route: id.clone(),
                pages,
                token_count,
                start_position,
            });
        }
        Ok(self.pin(Lease {
            entries,
            prospective: true,
        }))
    }

    /// Unpin a lease. Idempotent: false when it is not live.
    pub fn release_lease(&mut self, id: LeaseId) -> bool {
        let Some(lease) = self.leases.remove(&id) else {
            return false;
        };
        for entry in lease.entries {
            for page in entry.pages {
                self.drop_ref(page, None);
            }
            if let Some(n) = self.leased_routes.get_mut(&entry.route) {
                *n -= 1;
                if *n == 0 {
                    self.leased_routes.remove(&entry.route);
                }
            }
        }
        true
    }

    /// Whether any live lease names `route`.
    pub fn is_leased(&self, route: &RouteId) -> bool {
        self.leased_routes.contains_key(route)
    }

    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    fn pin(&mut self, lease: Lease) -> LeaseId {
        for entry in &lease.entries {
            for page in &entry.pages {
                self.retain(*page);
            }
            *self.leased_routes.entry(entry.route.clone()).or_insert(0) += 1;
        }
        let id = self.next_lease_id();
        self.leases.insert(id, lease);
        id
    }
}
