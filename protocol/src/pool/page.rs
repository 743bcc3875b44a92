//! Physical pages and their state machine (spec §4.3 "design-only", §11 item 16).
//!
//! ```text
//!            reserve                 claim
//!   Free ───────────▶ Reserved(r) ───────────▶ Resident ◀──────────┐
//!    ▲ │                  │                      │  │  start_load   │ complete/fail_load
//!    │ └──── allocate ────┼─────────────────────▶│  └──────▶ Loading ┘
//!    │                    │ release              │  start_evict     ┌ complete/fail_evict
//!    │◀───────────────────┘                      │  ────────▶ Evicting
//!    │◀──────── last reference dropped (generation + 1) ──────────────┘
//! ```
//!
//! Every page carries a generation. It grows by one each time the page stops being in use
//! (its last reference is dropped, a reservation returns it, or the process crashes), so
//! `(page, generation)` names one *occupancy* of a page. Transfers into or out of a page
//! are started with such a ticket; completing a transfer whose ticket names an older
//! occupancy is rejected with [`PoolError::StaleTicket`] and changes nothing. A late load
//! therefore can never mark a page that was freed and handed to another route as filled,
//! and a late read-out of a reused page is recognisably stale and must be discarded.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::PagePool;
use super::error::PoolError;
use super::reservation::ReservationId;
use crate::ids::RouteId;

/// A physical page number in `0..page_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Page(pub u32);

impl Page {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Page {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "page {}", self.0)
    }
}

/// One occupancy of a page; grows every time the page stops being in use.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Generation(pub u64);

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}", self.0)
    }
}

/// The observable state of a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum PageState {
    Free {
        generation: Generation,
    },
    /// Held, unclaimed, by a capacity reservation; not refcounted, invisible to kernels.
    Reserved {
        reservation: ReservationId,
        generation: Generation,
    },
    /// Referenced, and a transfer into the page is in flight.
    Loading {
        generation: Generation,
    },
    /// Referenced, no transfer in flight.
    Resident {
        generation: Generation,
    },
    /// Referenced, and a read-out of the page (to a lower tier) is in flight.
    Evicting {
        generation: Generation,
    },
}

impl PageState {
    pub fn generation(self) -> Generation {
        match self {
            PageState::Free { generation }
            | PageState::Reserved { generation, .. }
            | PageState::Loading { generation }
            | PageState::Resident { generation }
            | PageState::Evicting { generation } => generation,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PageState::Free { .. } => "free",
            PageState::Reserved { .. } => "reserved",
            PageState::Loading { .. } => "loading",
            PageState::Resident { .. } => "resident",
            PageState::Evicting { .. } => "evicting",
        }
    }
}

/// Which way a transfer moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransferKind {
    /// Into the page (restore, host upload).
    Load,
    /// Out of the page (demotion or export to a lower tier).
    Evict,
}

/// Names one transfer into or out of one occupancy of a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TransferTicket {
    pub page: Page,
    pub generation: Generation,
    pub kind: TransferKind,
}

impl PagePool {
    /// The state of `page`, or `None` when it is not a page of this pool.
    pub fn page_state(&self, page: Page) -> Option<PageState> {
        self.slots.get(page.index()).map(|s| s.public_state())
    }

    /// References held on `page` (0 for free or reserved pages and unknown pages).
    pub fn refcount(&self, page: Page) -> u32 {
        self.slots.get(page.index()).map_or(0, |s| s.refs)
    }

    /// Every page's generation, in page order (property tests check they only grow).
    pub fn generations(&self) -> Vec<Generation> {
        self.slots.iter().map(|s| s.generation).collect()
    }

    /// Start a transfer into a referenced, idle page (a restore upload or the host upload
    /// of an append). The caller writes only rows it owns: a freshly allocated route's
    /// pages or the slots of its pending append.
    pub fn start_load(&mut self, page: Page) -> Result<TransferTicket, PoolError> {
        self.start_transfer(page, TransferKind::Load)
    }

    /// The load finished: the page is resident again. A stale ticket changes nothing.
    pub fn complete_load(&mut self, ticket: TransferTicket) -> Result<(), PoolError> {
        self.finish_transfer(ticket, TransferKind::Load)
    }

    /// The load failed: the page is idle again and its rows beyond the committed token
    /// count are undefined. The caller aborts the append or abandons the route it was
    /// restoring. A stale ticket changes nothing.
    pub fn fail_load(&mut self, ticket: TransferTicket) -> Result<(), PoolError> {
        self.finish_transfer(ticket, TransferKind::Load)
    }

    /// Start reading a referenced, idle page out to a lower tier.
    pub fn start_evict(&mut self, page: Page) -> Result<TransferTicket, PoolError> {
        self.start_transfer(page, TransferKind::Evict)
    }

    /// The read-out finished. A stale ticket (the page was freed meanwhile, perhaps
    /// reused) is rejected: the bytes read must be discarded.
    pub fn complete_evict(&mut self, ticket: TransferTicket) -> Result<(), PoolError> {
        self.finish_transfer(ticket, TransferKind::Evict)
    }

    /// The read-out failed; the page is idle again. A stale ticket changes nothing.
    pub fn fail_evict(&mut self, ticket: TransferTicket) -> Result<(), PoolError> {
        self.finish_transfer(ticket, TransferKind::Evict)
    }

    fn start_transfer(
        &mut self,
        page: Page,
        kind: TransferKind,
    ) -> Result<TransferTicket, PoolError> {
        let slot = self
            .slots
            .get_mut(page.index())
            .ok_or(PoolError::UnknownPage(page))?;
        if slot.refs == 0 || slot.state != SlotState::Resident {
            return Err(PoolError::PageNotIdle {
                page,
                state: slot.public_state().name(),
            });
        }
        slot.state = match kind {
            TransferKind::Load => SlotState::Loading,
            TransferKind::Evict => SlotState::Evicting,
        };
        Ok(TransferTicket {
            page,
            generation: slot.generation,
            kind,
        })
    }

    fn finish_transfer(
        &mut self,
        ticket: TransferTicket,
        kind: TransferKind,
    ) -> Result<(), PoolError> {
        let page = ticket.page;
        let slot = self
            .slots
            .get_mut(page.index())
            .ok_or(PoolError::UnknownPage(page))?;
        if ticket.generation != slot.generation {
            return Err(PoolError::StaleTicket {
                page,
                ticket: ticket.generation,
                current: slot.generation,
            });
        }
        let expected = match kind {
            TransferKind::Load => SlotState::Loading,
            TransferKind::Evict => SlotState::Evicting,
        };
        if ticket.kind != kind || slot.state != expected {
            return Err(PoolError::NoTransferInFlight {
                page,
                kind: ticket.kind,
            });
        }
        slot.state = SlotState::Resident;
        Ok(())
    }

    /// Take `n` pages for `route`: first from the route's capacity reservation (lowest
    /// first), then from the free set. Each page is resident with refcount 1, held by the
    /// caller. Returns each page with the reservation it came from. Checks availability
    /// before taking anything.
    pub(super) fn take_pages(
        &mut self,
        route: &RouteId,
        n: u32,
    ) -> Result<Vec<(Page, Option<ReservationId>)>, PoolError> {
        let reservation = self.reservations.of_route(route);
        let unclaimed = reservation
            .and_then(|r| self.reservations.get(r))
            .map_or(0, |r| r.unclaimed());
        let available = unclaimed.saturating_add(self.free_count());
        if n > available {
            return Err(PoolError::InsufficientPages {
                needed: n,
                available,
            });
        }
        let mut taken = Vec::with_capacity(n as usize);
        if let Some(r) = reservation {
            for page in self.reservations.claim(r, n) {
                taken.push((page, Some(r)));
            }
        }
        while taken.len() < n as usize {
            // Availability was checked above: reservation pages + free pages ≥ n.
            let Some(page) = self.free.pop_first() else {
                break;
            };
            taken.push((page, None));
        }
        for (page, _) in &taken {
            let slot = self.slot_mut(*page);
            slot.state = SlotState::Resident;
            slot.refs = 1;
        }
        Ok(taken)
    }

    /// Add one reference to a referenced page.
    pub(super) fn retain(&mut self, page: Page) {
        self.slot_mut(page).refs += 1;
    }

    /// Drop one reference. At zero the page's occupancy ends (generation + 1) and it goes
    /// back to `back_to` when that reservation is still live (an aborted append returns
    /// its pages to the admission that paid for them), else to the free set.
    pub(super) fn drop_ref(&mut self, page: Page, back_to: Option<ReservationId>) {
        let slot = self.slot_mut(page);
        slot.refs = slot.refs.saturating_sub(1);
        if slot.refs > 0 {
            return;
        }
        match back_to.filter(|r| self.reservations.get(*r).is_some()) {
            Some(r) => {
                let slot = self.slot_mut(page);
                slot.generation.0 += 1;
                slot.state = SlotState::Reserved(r);
                self.reservations.give_back(r, page);
            }
            None => {
                self.slot_mut(page).free_after_use();
                self.free.insert(page);
            }
        }
    }

    /// Mark free pages as held by reservation `r` (already removed from the free set).
    pub(super) fn mark_reserved(&mut self, page: Page, r: ReservationId) {
        self.slot_mut(page).state = SlotState::Reserved(r);
    }

    /// Return an unclaimed reserved page to the free set.
    pub(super) fn unreserve(&mut self, page: Page) {
        self.slot_mut(page).free_after_use();
        self.free.insert(page);
    }

    pub(super) fn slot(&self, page: Page) -> &PageSlot {
        // Invariant: every page the pool hands out or stores comes from `0..page_count`
        // (the free set is built from that range), so the index is in bounds.
        &self.slots[page.index()]
    }

    fn slot_mut(&mut self, page: Page) -> &mut PageSlot {
        // Invariant: as in `slot`.
        &mut self.slots[page.index()]
    }
}

/// Internal page state without the generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum SlotState {
    #[default]
    Free,
    Reserved(ReservationId),
    Loading,
    Resident,
    Evicting,
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PageSlot {
    pub(super) state: SlotState,
    pub(super) generation: Generation,
    pub(super) refs: u32,
}

impl PageSlot {
    pub(super) fn is_free(&self) -> bool {
        self.state == SlotState::Free
    }

    /// Neither loading nor being read out.
    pub(super) fn idle(&self) -> bool {
        !matches!(self.state, SlotState::Loading | SlotState::Evicting)
    }

    pub(super) fn free_after_use(&mut self) {
        self.state = SlotState::Free;
        self.refs = 0;
        self.generation.0 += 1;
    }

    pub(super) fn public_state(&self) -> PageState {
        let generation = self.generation;
        match self.state {
            SlotState::Free => PageState::Free { generation },
            SlotState::Reserved(reservation) => PageState::Reserved {
                reservation,
                generation,
            },
            SlotState::Loading => PageState::Loading { generation },
            SlotState::Resident => PageState::Resident { generation },
            SlotState::Evicting => PageState::Evicting { generation },
        }
    }
}
