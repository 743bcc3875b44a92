//! Writing rows into a route's pages: every write — a step's rows, a restored chunk — is
//! a two-phase append, reserved (and its pages marked loading) before the bytes go in
//! and committed after, or aborted leaving the route as it was.

use std::collections::BTreeSet;

use den_protocol::ids::RouteId;
use den_protocol::pool::{AppendReservation, Page, PoolError, TokenSlot, TransferTicket};

use super::{Mismatch, Stop};
use crate::memory::{PageMemory, RowRun};
use crate::worker::pool::SharedPool;

/// The two-phase append every write goes through: reserve `count` slots on `route`
/// (which must be exactly `start` long), copy a shared tail first, mark the pages loading,
/// let `write` fill the reserved slots, then commit — or abort on any failure or
/// mismatch, leaving the route as it was.
pub(super) fn append_with<T>(
    pool: &SharedPool,
    memory: &mut dyn PageMemory,
    route: &RouteId,
    start: u32,
    count: u32,
    write: impl FnOnce(&mut dyn PageMemory, &AppendReservation) -> Result<Result<T, Mismatch>, Stop>,
) -> Result<Result<T, Mismatch>, Stop> {
    let pending = PendingAppend::begin(pool, memory, route, start, count)?;
    match write(memory, &pending.reservation) {
        Ok(Ok(value)) => {
            pending.commit(pool)?;
            Ok(Ok(value))
        }
        Ok(Err(mismatch)) => {
            pending.abort(pool);
            Ok(Err(mismatch))
        }
        Err(stop) => {
            pending.abort(pool);
            Err(stop)
        }
    }
}

/// An append between its reservation and its commit (or abort): the slots are reserved,
/// their pages marked loading, a shared tail already copied.
pub(super) struct PendingAppend {
    route: RouteId,
    pub(super) reservation: AppendReservation,
    tickets: Vec<TransferTicket>,
}

impl PendingAppend {
    /// Reserves `count` slots on `route`, which must be exactly `start` long.
    pub(super) fn begin(
        pool: &SharedPool,
        memory: &mut dyn PageMemory,
        route: &RouteId,
        start: u32,
        count: u32,
    ) -> Result<PendingAppend, Stop> {
        let reservation = pool.lock().append_reserve(route, count)?;
        let mut pending = PendingAppend {
            route: route.clone(),
            reservation,
            tickets: Vec::new(),
        };
        if pending.reservation.start != start {
            let held = pending.reservation.start;
            pending.abort(pool);
            return Err(Stop::Failed(format!(
                "route {route} holds {held} tokens, expected {start}"
            )));
        }
        let pages: BTreeSet<Page> = pending.reservation.slots.iter().map(|s| s.page).collect();
        let tickets: Result<Vec<TransferTicket>, PoolError> = {
            let mut pool = pool.lock();
            pages.iter().map(|p| pool.start_load(*p)).collect()
        };
        match tickets {
            Ok(t) => pending.tickets = t,
            Err(e) => {
                pending.abort(pool);
                return Err(e.into());
            }
        }
        if let Some(copy) = pending.reservation.copy
            && let Err(e) = memory.copy_page(copy.src.0, copy.dst.0)
        {
            pending.abort(pool);
            return Err(e.into());
        }
        Ok(pending)
    }

    pub(super) fn commit(self, pool: &SharedPool) -> Result<(), Stop> {
        let mut pool = pool.lock();
        for t in &self.tickets {
            pool.complete_load(*t)?;
        }
        pool.commit_append(&self.route, self.reservation.id)?;
        Ok(())
    }

    pub(super) fn abort(self, pool: &SharedPool) {
        let mut pool = pool.lock();
        for t in &self.tickets {
            let _ = pool.fail_load(*t);
        }
        let _ = pool.abort_append(&self.route, self.reservation.id);
    }
}

/// Consecutive slots of one page with consecutive rows, as row runs.
pub fn slot_runs(slots: &[TokenSlot]) -> Vec<RowRun> {
    let mut runs: Vec<RowRun> = Vec::new();
    for s in slots {
        match runs.last_mut() {
            Some(r) if r.page == s.page.0 && r.offset + r.len == s.offset => r.len += 1,
            _ => runs.push(RowRun {
                page: s.page.0,
                offset: s.offset,
                len: 1,
            }),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(logical: u32, page: u32, offset: u32) -> TokenSlot {
        TokenSlot {
            logical_page: logical,
            page: Page(page),
            offset,
        }
    }

    #[test]
    fn slots_merge_into_runs_per_page() {
        let runs = slot_runs(&[slot(0, 7, 2), slot(0, 7, 3), slot(1, 2, 0), slot(1, 2, 1)]);
        assert_eq!(
            runs,
            vec![
                RowRun {
                    page: 7,
                    offset: 2,
                    len: 2
                },
                RowRun {
                    page: 2,
                    offset: 0,
                    len: 2
                }
            ]
        );
        assert!(slot_runs(&[]).is_empty());
    }
}
