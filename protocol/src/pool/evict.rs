//! Eviction (spec §4.5–4.6): eligibility, value density, refcount-simulating planning
//! and capacity admission.
//!
//! A route is an eviction candidate iff it is durable, not pinned, has no pending append,
//! is named by no lease, is not protected, and none of its pages has a transfer in flight
//! (our addition: evicting under a transfer would only make its completion stale).
//! Candidates are taken in ascending `(density, last_access, route id)` order, where
//! `density = value / max(1, pages)`. Planning simulates refcounts: evicting one of two
//! forks that share a page frees nothing until both are gone.
//!
//! The durable, unpinned routes are kept in an ordered index keyed by exactly that
//! order, so a plan walks candidates from the cheapest without sorting all routes.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::PagePool;
use super::error::PoolError;
use super::page::Page;
use super::reservation::ReservationId;
use super::route::{Route, RoutePolicy};
use crate::ids::RouteId;
use crate::time::Millis;

/// The outcome of planning room for `required` pages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "outcome")]
pub enum EvictionPlan {
    /// Evicting `evictions` (in order) leaves at least `required` free pages.
    /// `available` = free pages + pages the evictions free; `free_after = available − required`.
    Admissible {
        evictions: Vec<RouteId>,
        required: u32,
        available: u32,
        free_after: u32,
    },
    /// Even evicting every candidate leaves `shortfall` pages missing. Nothing is evicted.
    Shortfall {
        required: u32,
        available: u32,
        shortfall: u32,
    },
}

impl EvictionPlan {
    pub fn is_admissible(&self) -> bool {
        matches!(self, EvictionPlan::Admissible { .. })
    }

    /// The planned victims (empty when not admissible).
    pub fn evictions(&self) -> &[RouteId] {
        match self {
            EvictionPlan::Admissible { evictions, .. } => evictions,
            EvictionPlan::Shortfall { .. } => &[],
        }
    }
}

/// Why a route was evicted (kept for metrics and decision records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "reason")]
pub enum EvictionReason {
    /// Room was needed to admit `for_route`.
    Capacity { for_route: RouteId },
    /// An operator or policy asked for this route to go.
    Explicit,
}

/// One performed eviction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eviction {
    pub route: RouteId,
    /// Pages that returned to the free set (shared pages survive with their sharers).
    pub pages_freed: u32,
    pub reason: EvictionReason,
}

/// Totals of performed evictions by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EvictionCounters {
    pub capacity_routes: u64,
    pub capacity_pages: u64,
    pub explicit_routes: u64,
    pub explicit_pages: u64,
}

/// A successful capacity admission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub reservation: ReservationId,
    /// Pages the reservation removed from the free set.
    pub reserved_pages: u32,
    /// Free pages before any eviction (after dropping a replaced route).
    pub free_before: u32,
    pub evictions: Vec<Eviction>,
}

impl PagePool {
    /// Whether `route` may be evicted now with `protected` routes excluded.
    pub fn is_evictable(&self, route: &RouteId, protected: &BTreeSet<RouteId>) -> bool {
        self.routes
            .get(route)
            .is_some_and(|r| self.eligible(route, r, protected, None))
    }

    /// Plan room for `required` free pages, never evicting `protected` routes.
    pub fn plan_eviction(&self, required: u32, protected: &BTreeSet<RouteId>) -> EvictionPlan {
        self.simulate(required, protected, None, None)
            .plan(required, self.free_count())
    }

    /// Pages that evicting every eligible route would free (shared pages count once,
    /// when all their holders are eligible), with `protected` excluded.
    pub fn evictable_pages(&self, protected: &BTreeSet<RouteId>) -> u32 {
        // The total does not depend on the order, so walk the routes directly with a
        // dense per-page counter instead of the ordered, sparse simulation.
        let mut dropped = vec![0u32; self.slots.len()];
        let mut freed = 0;
        for (id, r) in &self.routes {
            if !self.eligible(id, r, protected, None) {
                continue;
            }
            for p in &r.pages {
                // Route pages are < page_count = dropped.len() (pool invariant).
                let d = &mut dropped[p.index()];
                *d += 1;
                if *d == self.slot(*p).refs {
                    freed += 1;
                }
            }
        }
        freed
    }

    /// Capacity admission (§4.4 + §4.6): plan room for `route` to reach `target` tokens
    /// with `route` and `protected` never evicted, evict the planned victims and reserve,
    /// in one step. On shortfall nothing changes.
    pub fn admit_capacity(
        &mut self,
        route: &RouteId,
        target: u32,
        protected: &BTreeSet<RouteId>,
    ) -> Result<Grant, PoolError> {
        self.admit_inner(route, target, protected, false)
    }

    /// Evict an eligible route now.
    pub fn evict(
        &mut self,
        route: &RouteId,
        reason: EvictionReason,
    ) -> Result<Eviction, PoolError> {
        if !self.is_evictable(route, &BTreeSet::new()) {
            return Err(PoolError::NotEvictable(route.clone()));
        }
        Ok(self.evict_now(route, reason))
    }

    /// Admission as above. With `replace`, the existing `route` is dropped first (the
    /// assignment rebuilds it) and its pages count as freed.
    pub(super) fn admit_inner(
        &mut self,
        route: &RouteId,
        target: u32,
        protected: &BTreeSet<RouteId>,
        replace: bool,
    ) -> Result<Grant, PoolError> {
        if self.reservations.of_route(route).is_some() {
            return Err(PoolError::ReservationExists(route.clone()));
        }
        if self.routes.get(route).is_some_and(|r| r.pending.is_some()) {
            return Err(PoolError::AppendPending(route.clone()));
        }
        let replace = replace && self.routes.contains_key(route);
        let required = if replace {
            self.geometry.pages_for(target)
        } else {
            self.requirement(route, target)
        };
        let drop_first = replace.then_some(route);
        let sim = self.simulate(required, protected, Some(route), drop_first);
        let victims = match sim.plan(required, self.free_count()) {
            EvictionPlan::Admissible { evictions, .. } => evictions,
            EvictionPlan::Shortfall {
                required,
                available,
                shortfall,
            } => {
                return Err(PoolError::Shortfall {
                    required,
                    available,
                    shortfall,
                });
            }
        };
        if replace {
            self.release_route(route)?;
        }
        let free_before = self.free_count();
        let reason = EvictionReason::Capacity {
            for_route: route.clone(),
        };
        let evictions = victims
            .iter()
            .map(|v| self.evict_now(v, reason.clone()))
            .collect();
        // Cannot fail: no reservation or pending append exists (checked above), and the
        // free set now holds at least the requirement (evictions only lower it).
        let reservation = self.reserve(route, target)?;
        let reserved_pages = self.reservation(reservation).map_or(0, |r| r.granted());
        Ok(Grant {
            reservation,
            reserved_pages,
            free_before,
            evictions,
        })
    }

    /// Release a route chosen as a victim and count it.
    fn evict_now(&mut self, route: &RouteId, reason: EvictionReason) -> Eviction {
        let before = self.free_count();
        // Victims are eligible, hence have no pending append: release cannot refuse.
        let _ = self.release_route(route);
        let pages_freed = self.free_count() - before;
        match &reason {
            EvictionReason::Capacity { .. } => {
                self.counters.capacity_routes += 1;
                self.counters.capacity_pages += pages_freed as u64;
            }
            EvictionReason::Explicit => {
                self.counters.explicit_routes += 1;
                self.counters.explicit_pages += pages_freed as u64;
            }
        }
        Eviction {
            route: route.clone(),
            pages_freed,
            reason,
        }
    }

    fn eligible(
        &self,
        id: &RouteId,
        r: &Route,
        protected: &BTreeSet<RouteId>,
        also: Option<&RouteId>,
    ) -> bool {
        r.policy.durable
            && !r.policy.pinned
            && r.pending.is_none()
            && !self.leased_routes.contains_key(id)
            && !protected.contains(id)
            && also != Some(id)
            && r.pages.iter().all(|p| self.slot(*p).idle())
    }

    /// Walk candidates in eviction order, simulating refcounts, until the free pages
    /// plus the simulated freed pages reach `required`. `drop_first` is released before
    /// any candidate (and never a candidate itself).
    fn simulate(
        &self,
        required: u32,
        protected: &BTreeSet<RouteId>,
        also: Option<&RouteId>,
        drop_first: Option<&RouteId>,
    ) -> Simulation {
        let mut sim = Simulation {
            free: self.free_count(),
            ..Simulation::default()
        };
        if let Some(r) = drop_first.and_then(|id| self.routes.get(id)) {
            for p in &r.pages {
                sim.drop(*p, self.refcount(*p));
            }
        }
        for key in &self.evict_index {
            if sim.free.saturating_add(sim.freed) >= required {
                break;
            }
            let id = &key.route;
            let Some(r) = self.routes.get(id) else {
                continue;
            };
            if drop_first == Some(id) || !self.eligible(id, r, protected, also) {
                continue;
            }
            for p in &r.pages {
                sim.drop(*p, self.refcount(*p));
            }
            sim.victims.push(id.clone());
        }
        sim
    }
}

#[derive(Debug, Default)]
struct Simulation {
    free: u32,
    freed: u32,
    victims: Vec<RouteId>,
    /// Simulated dropped references per page.
    dropped: BTreeMap<Page, u32>,
}

impl Simulation {
    fn drop(&mut self, page: Page, refs: u32) {
        let d = self.dropped.entry(page).or_insert(0);
        *d += 1;
        if *d == refs {
            self.freed += 1;
        }
    }

    fn plan(self, required: u32, free: u32) -> EvictionPlan {
        let available = free.saturating_add(self.freed);
        if available >= required {
            EvictionPlan::Admissible {
                evictions: self.victims,
                required,
                available,
                free_after: available - required,
            }
        } else {
            EvictionPlan::Shortfall {
                required,
                available,
                shortfall: required - available,
            }
        }
    }
}

/// A route's place in eviction order: ascending `(density, last_access, route id)`.
#[derive(Debug, Clone)]
pub(super) struct EvictKey {
    density: f64,
    last_access: Millis,
    pub(super) route: RouteId,
}

impl EvictKey {
    pub(super) fn new(route: RouteId, policy: &RoutePolicy, pages: usize) -> Self {
        let density = policy.value() / (pages.max(1) as f64);
        EvictKey {
            density,
            last_access: policy.last_access,
            route,
        }
    }
}

impl Ord for EvictKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.density
            .total_cmp(&other.density)
            .then_with(|| self.last_access.cmp(&other.last_access))
            .then_with(|| self.route.cmp(&other.route))
    }
}

impl PartialOrd for EvictKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for EvictKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for EvictKey {}
