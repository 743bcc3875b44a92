//! Abstract page counters: the [`Capacity`] of the pure worker (spec §3.1), used by the
//! simulator and by tests. The real page pool (crate::pool) replaces it on live workers.
//!
//! Every page is in exactly one place: free, anonymous evictable cache (the counter a
//! worker starts with), a resident route (kept after a completed assignment; evictable
//! unless protected) or an assignment's reservation. So
//! `total = free + anonymous + Σ resident + Σ reserved` always holds ([`Counters::accounted`]).
//!
//! Admission reserves `from_free = min(free, required)` and takes the rest from eviction:
//! anonymous cache first, then resident routes oldest-completed first, never a protected
//! route (the request's own and every other non-terminal assignment's). Evicting a whole
//! route can free more than needed; the surplus goes to free.
//!
//! Divergences from the upstream pure model, on purpose: completed routes become
//! evictable cache instead of being held forever, and a crash returns *every* page to
//! free (the evictable counter included), because a dead process holds no GPU memory.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::capacity::{Admission, AdmitRequest, Capacity, DeclineReason};
use crate::ids::{AssignmentId, RouteId};

/// Abstract page accounting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Counters {
    total: u32,
    free: u32,
    /// Evictable cache pages not attributed to any route (the initial counter).
    anonymous: u32,
    /// Completed routes: pages and completion order (for oldest-first eviction).
    #[serde(serialize_with = "super::serde_seq::serialize")]
    resident: BTreeMap<RouteId, ResidentRoute>,
    next_seq: u64,
    #[serde(serialize_with = "super::serde_seq::serialize")]
    reservations: BTreeMap<AssignmentId, Reservation>,
}

/// Pages of a completed route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ResidentRoute {
    pub pages: u32,
    /// Completion order; the smallest is evicted first.
    pub seq: u64,
}

/// Pages reserved for one assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reservation {
    pub route: RouteId,
    pub from_free: u32,
    pub from_eviction: u32,
}

impl Reservation {
    pub fn pages(&self) -> u32 {
        self.from_free + self.from_eviction
    }
}

impl Counters {
    /// A worker with `free` free pages and `evictable` pages of anonymous evictable cache.
    pub fn new(free: u32, evictable: u32) -> Self {
        Counters {
            total: free.saturating_add(evictable),
            free,
            anonymous: evictable,
            resident: BTreeMap::new(),
            next_seq: 0,
            reservations: BTreeMap::new(),
        }
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn reserved_pages(&self) -> u32 {
        self.reservations.values().map(Reservation::pages).sum()
    }

    pub fn resident_pages(&self) -> u32 {
        self.resident.values().map(|r| r.pages).sum()
    }

    pub fn anonymous_evictable(&self) -> u32 {
        self.anonymous
    }

    pub fn reservation(&self, assignment: &AssignmentId) -> Option<&Reservation> {
        self.reservations.get(assignment)
    }

    pub fn reservations(&self) -> impl Iterator<Item = (&AssignmentId, &Reservation)> {
        self.reservations.iter()
    }

    pub fn resident(&self) -> impl Iterator<Item = (&RouteId, &ResidentRoute)> {
        self.resident.iter()
    }

    /// Every page is in exactly one place.
    pub fn accounted(&self) -> bool {
        let parts = self.free as u64
            + self.anonymous as u64
            + self.resident_pages() as u64
            + self.reserved_pages() as u64;
        parts == self.total as u64
    }

    fn evictable_excluding(&self, protected: &BTreeSet<RouteId>, own: &RouteId) -> u64 {
        let routes: u64 = self
            .resident
            .iter()
            .filter(|(r, _)| *r != own && !protected.contains(*r))
            .map(|(_, v)| v.pages as u64)
            .sum();
        self.anonymous as u64 + routes
    }

    /// Free `need` pages by eviction; returns the evicted routes. The caller checked that
    /// enough is evictable.
    fn evict(
        &mut self,
        mut need: u32,
        protected: &BTreeSet<RouteId>,
        own: &RouteId,
    ) -> Vec<RouteId> {
        let from_anonymous = need.min(self.anonymous);
        self.anonymous -= from_anonymous;
        need -= from_anonymous;
        let mut order: Vec<(u64, RouteId)> = self
            .resident
            .iter()
            .filter(|(r, _)| *r != own && !protected.contains(*r))
            .map(|(r, v)| (v.seq, r.clone()))
            .collect();
        order.sort();
        let mut evicted = Vec::new();
        for (_, route) in order {
            if need == 0 {
                break;
            }
            if let Some(r) = self.resident.remove(&route) {
                let used = r.pages.min(need);
                need -= used;
                // Pages of the route beyond what is needed become free.
                self.free += r.pages - used;
                evicted.push(route);
            }
        }
        evicted
    }
}

impl Capacity for Counters {
    fn admit(&mut self, req: AdmitRequest<'_>) -> Result<Admission, DeclineReason> {
        if self.reservations.contains_key(req.assignment) {
            return Err(DeclineReason::RequestAlreadyAssigned);
        }
        let required = req.estimate.required_pages;
        let available = self.free as u64 + self.evictable_excluding(req.protected, req.route);
        if required as u64 > available {
            return Err(DeclineReason::InsufficientPages);
        }
        let from_free = self.free.min(required);
        let from_eviction = required - from_free;
        self.free -= from_free;
        let evicted_routes = self.evict(from_eviction, req.protected, req.route);
        self.reservations.insert(
            req.assignment.clone(),
            Reservation {
                route: req.route.clone(),
                from_free,
                from_eviction,
            },
        );
        Ok(Admission {
            reserved_pages: required,
            evicted_pages: from_eviction,
            evicted_routes,
            forked_from: None,
        })
    }

    fn release(&mut self, assignment: &AssignmentId) -> bool {
        match self.reservations.remove(assignment) {
            Some(r) => {
                self.free += r.pages();
                true
            }
            None => false,
        }
    }

    fn complete(&mut self, assignment: &AssignmentId, route: &RouteId) {
        let Some(r) = self.reservations.remove(assignment) else {
            return;
        };
        let pages = r.pages();
        if pages == 0 {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let entry = self
            .resident
            .entry(route.clone())
            .or_insert(ResidentRoute { pages: 0, seq });
        entry.pages += pages;
        entry.seq = seq;
    }

    fn abandon(&mut self, assignment: &AssignmentId, _route: &RouteId) {
        // The abstract model builds no partial route: abandoning is releasing.
        self.release(assignment);
    }

    fn crash(&mut self) {
        self.free = self.total;
        self.anonymous = 0;
        self.resident.clear();
        self.reservations.clear();
    }

    fn free_pages(&self) -> u32 {
        self.free
    }

    fn evictable_pages(&self, protected: &BTreeSet<RouteId>) -> u32 {
        let routes: u64 = self
            .resident
            .iter()
            .filter(|(r, _)| !protected.contains(*r))
            .map(|(_, v)| v.pages as u64)
            .sum();
        u32::try_from(self.anonymous as u64 + routes).unwrap_or(u32::MAX)
    }
}
