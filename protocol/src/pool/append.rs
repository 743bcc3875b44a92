//! Append reservations with copy-on-write of a shared partial tail (spec §4.3).
//!
//! Appending `k` tokens to a route is two-phase. [`PagePool::append_reserve`] decides
//! where every new row goes: when the page that receives the next row is shared
//! (refcount > 1, a lease counts), a replacement page is allocated and the backend must
//! copy the old page into it ([`PageCopy`]); further pages are allocated for growth. The
//! route keeps its committed view until [`PagePool::commit_append`] adds the `k` tokens;
//! [`PagePool::abort_append`] gives every allocated page back and leaves the route as it
//! was.
//!
//! Decision (the spec drops the old tail's reference at reservation time and restores it
//! on abort): the route keeps its reference on the replaced page until commit. The
//! committed view stays fully referenced while the append is pending, so a concurrent
//! release of the other sharer can never free a page the route still reads, and abort
//! has nothing to restore.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::PagePool;
use super::error::PoolError;
use super::page::{Page, SlotState};
use super::reservation::ReservationId;
use crate::ids::RouteId;

/// One append reservation, unique for the lifetime of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AppendId(pub u64);

impl fmt::Display for AppendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "append {}", self.0)
    }
}

/// Where one appended token's row goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenSlot {
    /// Index into the route's post-append page list.
    pub logical_page: u32,
    pub page: Page,
    /// Row within the page.
    pub offset: u32,
}

/// A whole-page copy the backend performs before writing the append: `src` is the shared
/// partial tail, `dst` its private replacement; `rows` of it hold committed tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageCopy {
    pub src: Page,
    pub dst: Page,
    pub rows: u32,
}

/// What an append reservation decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendReservation {
    pub id: AppendId,
    pub route: RouteId,
    /// Index of the first appended token (the route's committed count).
    pub start: u32,
    pub tokens: u32,
    pub copy: Option<PageCopy>,
    /// Pages added at the end of the route.
    pub growth: Vec<Page>,
    /// One slot per appended token, in order.
    pub slots: Vec<TokenSlot>,
    /// The route's page list once committed.
    pub pages_after: Vec<Page>,
}

/// The pending record kept on the route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PendingAppend {
    pub(super) id: AppendId,
    pub(super) tokens: u32,
    pub(super) pages_after: Vec<Page>,
    /// The shared tail page a copy-on-write replaced; the route drops it at commit.
    pub(super) replaced: Option<Page>,
    /// Pages this append took, with the reservation each came from.
    pub(super) allocated: Vec<(Page, Option<ReservationId>)>,
}

impl PagePool {
    /// Reserve room for `tokens` more tokens on `route` (one pending append per route).
    /// Pages come from the route's capacity reservation first, then the free set; when
    /// they are not there nothing changes.
    pub fn append_reserve(
        &mut self,
        route: &RouteId,
        tokens: u32,
    ) -> Result<AppendReservation, PoolError> {
        let ps = self.geometry.page_size;
        let r = self
            .routes
            .get(route)
            .ok_or_else(|| PoolError::UnknownRoute(route.clone()))?;
        if r.pending.is_some() {
            return Err(PoolError::AppendPending(route.clone()));
        }
        if tokens == 0 {
            return Err(PoolError::EmptyAppend(route.clone()));
        }
        let start = r.token_count;
        let end = start
            .checked_add(tokens)
            .ok_or(PoolError::TooManyTokens(route.clone()))?;
        let growth = self
            .geometry
            .pages_for(end)
            .saturating_sub(r.pages.len() as u32);
        let tail = if start % ps != 0 {
            r.pages.last().copied()
        } else {
            None
        };
        let cow = tail.is_some_and(|p| self.refcount(p) > 1);
        if let Some(page) = tail {
            // A loading tail has no contents to keep or copy yet; a tail being read out
            // must not be written in place (a private copy is fine).
            let state = self.slot(page).state;
            if state == SlotState::Loading || (state == SlotState::Evicting && !cow) {
                return Err(PoolError::PageNotIdle {
                    page,
                    state: self.slot(page).public_state().name(),
                });
            }
        }
        let mut pages_after = r.pages.clone();
        let taken = self.take_pages(route, growth + u32::from(cow))?;
        let mut fresh = taken.iter().map(|(p, _)| *p);
        let (copy, replaced) = match (cow, tail) {
            (true, Some(src)) => match (fresh.next(), pages_after.last_mut()) {
                (Some(dst), Some(last)) => {
                    *last = dst;
                    (
                        Some(PageCopy {
                            src,
                            dst,
                            rows: start % ps,
                        }),
                        Some(src),
                    )
                }
                _ => (None, None),
            },
            _ => (None, None),
        };
        let growth: Vec<Page> = fresh.collect();
        pages_after.extend(&growth);
        let slots = (start..end)
            .map(|pos| {
                let logical = pos / ps;
                // pages_after holds ceil(end / ps) pages, so every logical index < end / ps fits.
                TokenSlot {
                    logical_page: logical,
                    page: pages_after[logical as usize],
                    offset: pos % ps,
                }
            })
            .collect();
        let id = self.next_append_id();
        let pending = PendingAppend {
            id,
            tokens,
            pages_after: pages_after.clone(),
            replaced,
            allocated: taken,
        };
        if let Some(r) = self.routes.get_mut(route) {
            r.pending = Some(pending);
        }
        Ok(AppendReservation {
            id,
            route: route.clone(),
            start,
            tokens,
            copy,
            growth,
            slots,
            pages_after,
        })
    }

    /// Commit the pending append `id` of `route`: the route takes its post-append pages
    /// and `k` more tokens. Refused while a page receiving its rows is still loading (a
    /// host append commits only after the whole upload completed).
    pub fn commit_append(&mut self, route: &RouteId, id: AppendId) -> Result<(), PoolError> {
        self.commit_appends(&[(route.clone(), id)])
    }

    /// Abort the pending append `id` of `route`: its pages go back where they came from
    /// and the route is exactly as before the reservation.
    pub fn abort_append(&mut self, route: &RouteId, id: AppendId) -> Result<(), PoolError> {
        self.abort_appends(&[(route.clone(), id)])
    }

    /// Commit several appends; every entry is validated before any route changes.
    pub fn commit_appends(&mut self, entries: &[(RouteId, AppendId)]) -> Result<(), PoolError> {
        self.validate_batch(entries, true)?;
        for (route, _) in entries {
            self.apply_commit(route);
        }
        Ok(())
    }

    /// Abort several appends; every entry is validated before any route changes.
    pub fn abort_appends(&mut self, entries: &[(RouteId, AppendId)]) -> Result<(), PoolError> {
        self.validate_batch(entries, false)?;
        for (route, _) in entries {
            self.apply_abort(route);
        }
        Ok(())
    }

    /// Abort whatever append is pending on `route` (abandoning an assignment).
    pub(super) fn abort_pending(&mut self, route: &RouteId) {
        self.apply_abort(route);
    }

    fn validate_batch(
        &self,
        entries: &[(RouteId, AppendId)],
        commit: bool,
    ) -> Result<(), PoolError> {
        let mut seen = BTreeSet::new();
        for (route, id) in entries {
            if !seen.insert(route) {
                return Err(PoolError::DuplicateEntry(route.clone()));
            }
            let r = self
                .routes
                .get(route)
                .ok_or_else(|| PoolError::UnknownRoute(route.clone()))?;
            let pending = r
                .pending
                .as_ref()
                .ok_or_else(|| PoolError::NoPendingAppend(route.clone()))?;
            if pending.id != *id {
                return Err(PoolError::StaleAppend {
                    route: route.clone(),
                    given: *id,
                    pending: Some(pending.id),
                });
            }
            if commit {
                let first = (r.token_count / self.geometry.page_size) as usize;
                let loading = pending
                    .pages_after
                    .iter()
                    .skip(first)
                    .find(|p| self.slot(**p).state == SlotState::Loading);
                if let Some(page) = loading {
                    return Err(PoolError::TransferInFlight {
                        route: route.clone(),
                        page: *page,
                    });
                }
            }
        }
        Ok(())
    }

    fn apply_commit(&mut self, route: &RouteId) {
        let Some(r) = self.routes.get_mut(route) else {
            return;
        };
        let Some(pending) = r.pending.take() else {
            return;
        };
        r.pages = pending.pages_after;
        r.token_count += pending.tokens;
        if let Some(old) = pending.replaced {
            self.drop_ref(old, None);
        }
        self.reindex(route);
    }

    fn apply_abort(&mut self, route: &RouteId) {
        let Some(r) = self.routes.get_mut(route) else {
            return;
        };
        let Some(pending) = r.pending.take() else {
            return;
        };
        for (page, source) in pending.allocated {
            self.drop_ref(page, source);
        }
    }

    /// The post-append snapshot of a pending append, for prospective leases.
    pub(super) fn pending_snapshot(
        &self,
        route: &RouteId,
        id: AppendId,
    ) -> Result<(Vec<Page>, u32), PoolError> {
        let r = self
            .routes
            .get(route)
            .ok_or_else(|| PoolError::UnknownRoute(route.clone()))?;
        match &r.pending {
            Some(p) if p.id == id => Ok((p.pages_after.clone(), r.token_count + p.tokens)),
            other => Err(PoolError::StaleAppend {
                route: route.clone(),
                given: id,
                pending: other.as_ref().map(|p| p.id),
            }),
        }
    }
}
