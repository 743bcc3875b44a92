//! Capacity reservations (spec §4.4): atomic admission.
//!
//! Before a worker answers "accepted" it removes every page the assignment can need from
//! the free set. Reserved pages are not refcounted and invisible to kernels until a route
//! allocation or an append of the same continuation claims them. Releasing a reservation
//! returns only the unclaimed pages; claimed pages stay with the route and are freed with
//! it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::PagePool;
use super::error::PoolError;
use super::page::Page;
use crate::ids::RouteId;

/// A capacity reservation, unique for the lifetime of a pool (never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ReservationId(pub u64);

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reservation {}", self.0)
    }
}

/// One live reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    route: RouteId,
    target: u32,
    granted: u32,
    pages: BTreeSet<Page>,
}

impl Reservation {
    /// The continuation the pages are for.
    pub fn route(&self) -> &RouteId {
        &self.route
    }

    /// The token capacity the route was admitted for.
    pub fn target(&self) -> u32 {
        self.target
    }

    /// Pages removed from the free set when the reservation was made.
    pub fn granted(&self) -> u32 {
        self.granted
    }

    /// Pages not yet claimed.
    pub fn unclaimed(&self) -> u32 {
        self.pages.len() as u32
    }

    /// The unclaimed pages, lowest first.
    pub fn pages(&self) -> impl Iterator<Item = Page> + '_ {
        self.pages.iter().copied()
    }
}

impl PagePool {
    /// Pages that reserving capacity for `route` to reach `target` tokens takes:
    /// `max(0, ceil(target / page_size) − current pages)`, plus one when the route
    /// exists, holds fewer than `target` tokens, ends in a partial page and that page is
    /// shared (refcount > 1, leases included): the copy-on-write page of its next append.
    pub fn requirement(&self, route: &RouteId, target: u32) -> u32 {
        let g = self.geometry;
        let Some(r) = self.routes.get(route) else {
            return g.pages_for(target);
        };
        let base = g.pages_for(target).saturating_sub(r.pages().len() as u32);
        let partial = r.token_count() % g.page_size != 0;
        let shared_tail = r.pages().last().is_some_and(|p| self.refcount(*p) > 1);
        let cow = r.token_count() < target && partial && shared_tail;
        base + u32::from(cow)
    }

    /// Reserve capacity for `route` to grow to `target` tokens: remove
    /// [`requirement`](Self::requirement) pages from the free set now (lowest first). At
    /// most one live reservation per route; refused during a pending append.
    pub fn reserve(&mut self, route: &RouteId, target: u32) -> Result<ReservationId, PoolError> {
        if self.reservations.of_route(route).is_some() {
            return Err(PoolError::ReservationExists(route.clone()));
        }
        if self.routes.get(route).is_some_and(|r| r.pending.is_some()) {
            return Err(PoolError::AppendPending(route.clone()));
        }
        let needed = self.requirement(route, target);
        if needed > self.free_count() {
            return Err(PoolError::InsufficientPages {
                needed,
                available: self.free_count(),
            });
        }
        let id = self.reservations.next_id();
        let mut pages = BTreeSet::new();
        for _ in 0..needed {
            // Checked above: the free set holds at least `needed` pages.
            let Some(page) = self.free.pop_first() else {
                break;
            };
            self.mark_reserved(page, id);
            pages.insert(page);
        }
        self.reservations.insert(
            id,
            Reservation {
                route: route.clone(),
                target,
                granted: needed,
                pages,
            },
        );
        Ok(id)
    }

    /// Return the reservation's unclaimed pages to the free set. Idempotent: false when
    /// the reservation is not live (already released, or never existed).
    pub fn release_reservation(&mut self, id: ReservationId) -> bool {
        let Some(r) = self.reservations.remove(id) else {
            return false;
        };
        for page in r.pages {
            self.unreserve(page);
        }
        true
    }
}

/// Reservations by id and by route, and the count of reserved pages.
#[derive(Debug, Clone, Default)]
pub(super) struct ReservationBook {
    by_id: BTreeMap<ReservationId, Reservation>,
    by_route: BTreeMap<RouteId, ReservationId>,
    reserved: u32,
    next: u64,
}

impl ReservationBook {
    pub(super) fn next_id(&mut self) -> ReservationId {
        self.next += 1;
        ReservationId(self.next)
    }

    pub(super) fn get(&self, id: ReservationId) -> Option<&Reservation> {
        self.by_id.get(&id)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&ReservationId, &Reservation)> {
        self.by_id.iter()
    }

    pub(super) fn of_route(&self, route: &RouteId) -> Option<ReservationId> {
        self.by_route.get(route).copied()
    }

    pub(super) fn by_route(&self) -> &BTreeMap<RouteId, ReservationId> {
        &self.by_route
    }

    pub(super) fn reserved_pages(&self) -> u32 {
        self.reserved
    }

    pub(super) fn insert(&mut self, id: ReservationId, r: Reservation) {
        self.reserved += r.unclaimed();
        self.by_route.insert(r.route.clone(), id);
        self.by_id.insert(id, r);
    }

    pub(super) fn remove(&mut self, id: ReservationId) -> Option<Reservation> {
        let r = self.by_id.remove(&id)?;
        self.by_route.remove(&r.route);
        self.reserved -= r.unclaimed();
        Some(r)
    }

    /// Claim up to `n` unclaimed pages, lowest first.
    pub(super) fn claim(&mut self, id: ReservationId, n: u32) -> Vec<Page> {
        let Some(r) = self.by_id.get_mut(&id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while out.len() < n as usize {
            let Some(page) = r.pages.pop_first() else {
                break;
            };
            out.push(page);
        }
        self.reserved -= out.len() as u32;
        out
    }

    /// Put a page back into a live reservation (an aborted append's page).
    pub(super) fn give_back(&mut self, id: ReservationId, page: Page) {
        if let Some(r) = self.by_id.get_mut(&id)
            && r.pages.insert(page)
        {
            self.reserved += 1;
        }
    }

    pub(super) fn clear(&mut self) {
        self.by_id.clear();
        self.by_route.clear();
        self.reserved = 0;
    }
}
