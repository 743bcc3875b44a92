//! Page-pool accounting (spec §4): which physical KV page belongs to which route, who
//! shares it, what is reserved for whom, and what may be evicted.
//!
//! The pool holds no memory. A page is a number in `0..page_count`; the agent binds each
//! number to real host or device memory and performs the copies and transfers the pool
//! reports (copy-on-write copies, chunk scatter runs, page loads). Everything here is
//! deterministic accounting over plain values, serialised by the caller (the agent wraps
//! one pool in one mutex; the simulator owns it outright).
//!
//! Map of the module:
//! - [`page`]: page numbers, the per-page state machine with generation counters and
//!   transfer tickets (a late transfer can never land in a reused page);
//! - [`route`]: routes (continuations), allocation, forks, release, route policy;
//! - [`append`]: append reservations with copy-on-write of a shared partial tail;
//! - [`lease`]: snapshot leases, including prospective (post-append) leases;
//! - [`reservation`]: capacity reservations (atomic admission, §4.4);
//! - [`evict`]: eligibility, value density, refcount-simulating eviction planning and
//!   capacity admission (§4.5–4.6);
//! - [`scatter`]: chunk scatter runs and dense page tables (§4.7);
//! - [`capacity`]: `impl Capacity for PagePool`, the local interpreter's offer path (§3.6);
//! - [`observe`]: pool statistics and GPU-prefix advertisements (§3.8);
//! - [`invariants`]: a full consistency check used by tests and property tests.
//!
//! Refcount rule (the one every module keeps): a page's refcount is the number of times
//! it appears in a route's committed page list, in a route's pending append (pages that
//! append allocated), and in a lease. A page is in exactly one of: the free set, one
//! reservation's unclaimed set, or referenced (refcount ≥ 1).

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{AssignmentId, RouteId};

pub mod append;
pub mod capacity;
pub mod error;
pub mod evict;
pub mod invariants;
pub mod lease;
pub mod observe;
pub mod page;
pub mod reservation;
pub mod route;
pub mod scatter;

pub use append::{AppendId, AppendReservation, PageCopy, TokenSlot};
pub use error::PoolError;
pub use evict::{Eviction, EvictionCounters, EvictionPlan, EvictionReason, Grant};
pub use invariants::InvariantViolation;
pub use lease::{Lease, LeaseEntry, LeaseId};
pub use page::{Generation, Page, PageState, TransferKind, TransferTicket};
pub use reservation::{Reservation, ReservationId};
pub use route::{Route, RouteIdentity, RoutePolicy};
pub use scatter::{PageTable, Run, scatter_runs};

use evict::EvictKey;
use page::PageSlot;
use reservation::ReservationBook;

/// The shape of a pool: how many tokens a page holds, how many pages there are, and how
/// many bytes one page occupies across all layers and slabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Geometry {
    /// Token rows per page (typically 16–32).
    pub page_size: u32,
    /// Number of physical pages.
    pub page_count: u32,
    /// Bytes of one page across every layer and slab (statistics and prefix bytes).
    pub page_bytes: u64,
}

impl Geometry {
    pub fn new(page_size: u32, page_count: u32, page_bytes: u64) -> Self {
        Geometry {
            page_size,
            page_count,
            page_bytes,
        }
    }

    /// Pages needed for `tokens` token rows: `ceil(tokens / page_size)`, 0 for 0.
    pub fn pages_for(&self, tokens: u32) -> u32 {
        // page_size > 0 is checked by `PagePool::new`.
        tokens.div_ceil(self.page_size.max(1))
    }

    /// Bytes of `tokens` token rows (`tokens × page_bytes / page_size`, rounded down).
    pub fn bytes_for(&self, tokens: u32) -> u64 {
        let bytes = tokens as u128 * self.page_bytes as u128 / self.page_size.max(1) as u128;
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }
}

/// Page accounting for one worker's KV page pool.
#[derive(Debug, Clone)]
pub struct PagePool {
    geometry: Geometry,
    /// One slot per physical page, indexed by page number.
    slots: Vec<PageSlot>,
    /// Free pages; allocation takes the lowest numbers first.
    free: BTreeSet<Page>,
    routes: BTreeMap<RouteId, Route>,
    reservations: ReservationBook,
    leases: BTreeMap<LeaseId, Lease>,
    /// How many lease occurrences name each route (eviction eligibility).
    leased_routes: BTreeMap<RouteId, u32>,
    /// Routes that are durable and not pinned, ordered as eviction victims (§4.6). The
    /// dynamic conditions (pending append, lease, protection, transfers) are checked
    /// while planning.
    evict_index: BTreeSet<EvictKey>,
    /// Capacity-trait bookkeeping: what each admitted assignment holds.
    assignments: BTreeMap<AssignmentId, capacity::AssignmentEntry>,
    next_lease: u64,
    next_append: u64,
    counters: EvictionCounters,
}

impl PagePool {
    /// An empty pool: every page free, generation 0.
    pub fn new(geometry: Geometry) -> Result<Self, PoolError> {
        if geometry.page_size == 0 {
            return Err(PoolError::InvalidGeometry(
                "page_size is 0: a page must hold at least one token",
            ));
        }
        if geometry.page_count > i32::MAX as u32 {
            return Err(PoolError::InvalidGeometry(
                "page_count exceeds i32::MAX: page indices must fit a signed 32-bit page table",
            ));
        }
        Ok(PagePool {
            geometry,
            slots: vec![PageSlot::default(); geometry.page_count as usize],
            free: (0..geometry.page_count).map(Page).collect(),
            routes: BTreeMap::new(),
            reservations: ReservationBook::default(),
            leases: BTreeMap::new(),
            leased_routes: BTreeMap::new(),
            evict_index: BTreeSet::new(),
            assignments: BTreeMap::new(),
            next_lease: 1,
            next_append: 1,
            counters: EvictionCounters::default(),
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn page_size(&self) -> u32 {
        self.geometry.page_size
    }

    pub fn page_count(&self) -> u32 {
        self.geometry.page_count
    }

    /// Pages in the free set.
    pub fn free_count(&self) -> u32 {
        self.free.len() as u32
    }

    /// Unclaimed pages held by capacity reservations.
    pub fn reserved_count(&self) -> u32 {
        self.reservations.reserved_pages()
    }

    /// Pages with refcount ≥ 1 (held by routes, pending appends or leases).
    pub fn referenced_count(&self) -> u32 {
        self.page_count() - self.free_count() - self.reserved_count()
    }

    /// The free pages in allocation order (lowest first).
    pub fn free_pages_list(&self) -> Vec<Page> {
        self.free.iter().copied().collect()
    }

    pub fn route(&self, id: &RouteId) -> Option<&Route> {
        self.routes.get(id)
    }

    pub fn routes(&self) -> impl Iterator<Item = (&RouteId, &Route)> {
        self.routes.iter()
    }

    pub fn route_count(&self) -> usize {
        self.routes.len()
    }

    pub fn get_lease(&self, id: LeaseId) -> Option<&Lease> {
        self.leases.get(&id)
    }

    pub fn reservation(&self, id: ReservationId) -> Option<&Reservation> {
        self.reservations.get(id)
    }

    /// The live capacity reservation of a route, if any.
    pub fn reservation_of(&self, route: &RouteId) -> Option<ReservationId> {
        self.reservations.of_route(route)
    }

    /// Evictions performed so far, by reason.
    pub fn eviction_counters(&self) -> &EvictionCounters {
        &self.counters
    }

    /// The process died: every page returns to free, every route, pending append, lease,
    /// reservation and assignment is gone. Generations of pages that were in use grow,
    /// so tickets issued before the crash are stale. Id counters keep growing.
    pub fn reset(&mut self) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if !slot.is_free() {
                slot.free_after_use();
                self.free.insert(Page(i as u32));
            }
        }
        self.routes.clear();
        self.reservations.clear();
        self.leases.clear();
        self.leased_routes.clear();
        self.evict_index.clear();
        self.assignments.clear();
    }

    fn next_lease_id(&mut self) -> LeaseId {
        let id = LeaseId(self.next_lease);
        self.next_lease += 1;
        id
    }

    fn next_append_id(&mut self) -> AppendId {
        let id = AppendId(self.next_append);
        self.next_append += 1;
        id
    }
}
