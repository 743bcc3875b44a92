//! A full consistency check of the pool, for tests and property tests. It recomputes
//! every derived quantity from the routes, pending appends, leases and reservations and
//! compares it with what the pool keeps.

use std::collections::{BTreeMap, BTreeSet};

use super::PagePool;
use super::evict::EvictKey;
use super::page::{Page, SlotState};
use super::reservation::ReservationId;

/// The first broken invariant found, described in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("page-pool invariant violated: {0}")]
pub struct InvariantViolation(pub String);

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(InvariantViolation(format!($($fmt)+)));
        }
    };
}

impl PagePool {
    /// Check that:
    /// - every page is in exactly one of: the free set, one reservation's unclaimed set,
    ///   or referenced — and `free + reserved + referenced = page_count`;
    /// - each page's refcount equals its occurrences in routes' committed pages, pending
    ///   appends' allocated pages and leases;
    /// - routes hold exactly `ceil(tokens / page_size)` distinct pages, pending appends
    ///   are consistent with their routes;
    /// - reservation, lease and eviction indexes agree with what they index.
    ///
    /// Generations only grow by construction (they are only ever incremented); property
    /// tests compare [`generations`](Self::generations) across operations.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let g = self.geometry;
        let mut expected: BTreeMap<Page, u32> = BTreeMap::new();
        let mut leased: BTreeMap<&str, u32> = BTreeMap::new();
        for (id, r) in &self.routes {
            ensure!(
                r.pages.len() as u32 == g.pages_for(r.token_count),
                "route {id} holds {} pages for {} tokens",
                r.pages.len(),
                r.token_count
            );
            let distinct: BTreeSet<_> = r.pages.iter().collect();
            ensure!(
                distinct.len() == r.pages.len(),
                "route {id} lists a page twice"
            );
            for p in &r.pages {
                *expected.entry(*p).or_insert(0) += 1;
            }
            if let Some(pending) = &r.pending {
                let after = r.token_count + pending.tokens;
                ensure!(
                    pending.pages_after.len() as u32 == g.pages_for(after),
                    "route {id}'s pending append holds {} pages for {after} tokens",
                    pending.pages_after.len()
                );
                for (p, _) in &pending.allocated {
                    ensure!(
                        pending.pages_after.contains(p),
                        "route {id}'s pending append allocated {p} outside its pages"
                    );
                    ensure!(
                        !r.pages.contains(p),
                        "route {id}'s pending append allocated its committed {p}"
                    );
                    *expected.entry(*p).or_insert(0) += 1;
                }
                if let Some(old) = pending.replaced {
                    ensure!(
                        r.pages.last() == Some(&old),
                        "route {id}'s append replaced {old}, not its tail"
                    );
                }
            }
            let key = (r.policy.durable && !r.policy.pinned)
                .then(|| EvictKey::new(id.clone(), &r.policy, r.pages.len()));
            ensure!(key == r.evict_key, "route {id}'s eviction key is stale");
            if let Some(key) = &key {
                ensure!(
                    self.evict_index.contains(key),
                    "route {id} is missing from the eviction index"
                );
            }
        }
        let indexed = self
            .routes
            .values()
            .filter(|r| r.evict_key.is_some())
            .count();
        ensure!(
            self.evict_index.len() == indexed,
            "eviction index holds {} keys for {indexed} routes",
            self.evict_index.len()
        );
        for lease in self.leases.values() {
            for e in &lease.entries {
                for p in &e.pages {
                    *expected.entry(*p).or_insert(0) += 1;
                }
                *leased.entry(e.route.as_str()).or_insert(0) += 1;
            }
        }
        let recorded: BTreeMap<&str, u32> = self
            .leased_routes
            .iter()
            .map(|(r, n)| (r.as_str(), *n))
            .collect();
        ensure!(
            recorded == leased,
            "leased-route counts {recorded:?} differ from the leases {leased:?}"
        );

        let mut holder: BTreeMap<Page, ReservationId> = BTreeMap::new();
        let mut reserved = 0u32;
        for (id, r) in self.reservations.iter() {
            ensure!(
                self.reservations.of_route(r.route()) == Some(*id),
                "{id} is not indexed under its route"
            );
            for p in r.pages() {
                ensure!(
                    holder.insert(p, *id).is_none(),
                    "{p} is held by two reservations"
                );
                reserved += 1;
            }
        }
        for (route, id) in self.reservations.by_route() {
            ensure!(
                self.reservations
                    .get(*id)
                    .is_some_and(|r| r.route() == route),
                "route {route} indexes dead {id}"
            );
        }
        ensure!(
            reserved == self.reserved_count(),
            "reserved counter {} ≠ {reserved}",
            self.reserved_count()
        );

        let mut referenced = 0u32;
        for (i, slot) in self.slots.iter().enumerate() {
            let p = Page(i as u32);
            let want = expected.get(&p).copied().unwrap_or(0);
            let in_free = self.free.contains(&p);
            match slot.state {
                SlotState::Free => {
                    ensure!(
                        in_free && want == 0 && slot.refs == 0,
                        "free {p}: in free set {in_free}, refs {}, expected {want}",
                        slot.refs
                    );
                    ensure!(
                        !holder.contains_key(&p),
                        "free {p} is held by a reservation"
                    );
                }
                SlotState::Reserved(r) => {
                    ensure!(
                        !in_free && want == 0 && slot.refs == 0,
                        "reserved {p}: in free set {in_free}, refs {}",
                        slot.refs
                    );
                    ensure!(
                        holder.get(&p) == Some(&r),
                        "reserved {p} is not in {r}'s unclaimed set"
                    );
                }
                SlotState::Loading | SlotState::Resident | SlotState::Evicting => {
                    ensure!(
                        !in_free && !holder.contains_key(&p),
                        "referenced {p} is also free or reserved"
                    );
                    ensure!(
                        slot.refs > 0 && slot.refs == want,
                        "{p} has refcount {} but {want} references",
                        slot.refs
                    );
                    referenced += 1;
                }
            }
        }
        ensure!(
            self.free.iter().all(|p| p.index() < self.slots.len()),
            "the free set holds a page outside the pool"
        );
        let total = self.free_count() + reserved + referenced;
        ensure!(
            total == self.page_count(),
            "free + reserved + referenced = {total} ≠ {} pages",
            self.page_count()
        );
        Ok(())
    }
}
