//! Requests waiting for KV pages.
//!
//! Spec §2 fails a request with no feasible candidate at once, and den-agent answers 503
//! with `Retry-After`. Where the only thing missing is free pages — some worker's pool is
//! large enough, its running requests hold them now — that rule starves long prompts
//! under load: the pages a finishing request frees go to whichever retry comes first,
//! usually a shorter request that arrived later, and a request that needs many pages is
//! refused again and again (measured on the Mooncake trace at its edge of capacity: 39
//! requests refused 600 times, BENCHMARKS.md). So the router node keeps such a request
//! here instead (a decision beyond the spec, which only considers feasibility at
//! submission):
//!
//! - **FCFS, with a reservation** (EASY backfilling, as batch schedulers do it):
//!   waiting requests leave in arrival order, and only the oldest is examined. It
//!   reserves the worker it is fewest pages short on; nothing newer is offered there, so
//!   it waits only for that worker's running requests to finish. Newcomers that fit
//!   elsewhere go at once (they backfill the other workers). Measured alternatives, all
//!   worse past capacity (BENCHMARKS.md, "Requests that wait for pages"): letting the
//!   younger waiting requests backfill too, and reserving a worker for every waiting
//!   request or for a quarter of the fleet (each reserved worker's batch drains).
//! - An accepted heartbeat that shows a worker with more room than the queue was last
//!   examined against re-examines it; a request that now has a feasible candidate is
//!   submitted to the router machine with the candidates of that moment, and one that no
//!   worker could hold any more (its worker left) fails as the spec says.
//! - Bounded: at most `capacity` requests wait (beyond that the spec's immediate
//!   `no-feasible-worker`, so a client sees back-pressure); each waits until its deadline
//!   at most, and a cancel removes it at once. `capacity` 0 is the spec's behaviour.
//! - Visible: the router machine keeps a waiting request's record from its arrival
//!   ([`RouterInput::Hold`], phase waiting) and ends it at its deadline or cancel as any
//!   other's; the queue keeps only the order, and [`RouterInput::Release`] hands the
//!   request back to the machine when it leaves.
//! - A worker that does not report its pool's size (`pool.total_pages` 0) is never
//!   waited for: the node cannot tell whether the request would ever fit there.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::candidate::{Candidate, Infeasible, estimate};
use crate::discovery::Registry;
use crate::ids::{RequestId, WorkerId};
use crate::request::GenerationRequest;
use crate::time::Millis;

use super::{NodeEffect, Pin, RouterNode};
use crate::router::RouterInput;

/// A request waiting for pages.
#[derive(Debug, Clone, PartialEq)]
pub struct Parked {
    pub request: Arc<GenerationRequest>,
    pub pin: Pin,
    /// The fewest pages it needed on a worker that could hold it, when last examined: a
    /// heartbeat that leaves no worker that much room skips building its candidates.
    pub needed_pages: u64,
}

/// The queue (module documentation).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Waiting {
    pub(super) entries: VecDeque<Parked>,
    capacity: usize,
    /// The worker the oldest reserved: the one fewest pages short of it.
    reserved: Option<WorkerId>,
    /// Each worker's room (free and evictable pages, less those offered since its last
    /// heartbeat) when the waiting requests were last examined, or the least it showed
    /// since: a heartbeat showing no more cannot let one in. Not the previous heartbeat's
    /// room: a request offered and finished between two heartbeats leaves those equal
    /// although the queue was examined with its pages taken.
    examined_room: BTreeMap<WorkerId, u64>,
}

/// Where a request without a feasible candidate could wait: the worker it is fewest
/// pages short on, and how many pages it needs there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub worker: WorkerId,
    pub needed_pages: u64,
}

impl Waiting {
    pub fn new(capacity: usize) -> Waiting {
        Waiting {
            capacity,
            ..Waiting::default()
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn has_room(&self) -> bool {
        self.entries.len() < self.capacity
    }

    pub fn contains(&self, request: &RequestId) -> bool {
        self.entries.iter().any(|p| &p.request.id == request)
    }

    /// The waiting requests, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Parked> {
        self.entries.iter()
    }

    /// Takes `request` out of the queue (it ended while waiting: cancelled, or its
    /// deadline passed); the oldest takes its reservation with it.
    pub fn remove(&mut self, request: &RequestId) -> Option<Parked> {
        let i = self.entries.iter().position(|p| &p.request.id == request)?;
        if i == 0 {
            self.reserved = None;
        }
        self.entries.remove(i)
    }

    /// A heartbeat shows `room` on `worker`: whether that is more than the waiting
    /// requests were examined against, or than the worker has shown since (less room
    /// lowers the mark, so room that frees again after newer requests took it counts).
    pub fn more_room(&mut self, worker: &WorkerId, room: u64) -> bool {
        match self.examined_room.get_mut(worker) {
            Some(mark) if room <= *mark => {
                *mark = room;
                false
            }
            _ => true,
        }
    }

    /// The worker the oldest waiting request reserved: nothing newer is offered there.
    pub fn reserved(&self) -> Option<&WorkerId> {
        self.reserved.as_ref()
    }
}

/// Whether any candidate can serve `request` now.
pub fn any_feasible(request: &GenerationRequest, candidates: &[Candidate]) -> bool {
    candidates.iter().any(|c| estimate(request, c).feasible())
}

/// Where `request` could wait: among its candidates refused only for want of pages on a
/// worker whose whole pool could hold it, the worker fewest pages short (ties: the worker
/// id, for determinism), and the fewest pages any of them needs. `None`: it could not be
/// served however long it waited.
pub fn shortfall<'a>(
    request: &GenerationRequest,
    candidates: impl IntoIterator<Item = &'a Candidate>,
    registry: &Registry,
) -> Option<Shortfall> {
    let mut best: Option<(u64, &WorkerId)> = None;
    let mut needed_pages = u64::MAX;
    for c in candidates {
        let e = estimate(request, c);
        if e.infeasible != Some(Infeasible::InsufficientPages) {
            continue;
        }
        let total = registry
            .get(&c.worker_id)
            .map_or(0, |o| u64::from(o.pool.total_pages));
        let needed = u64::from(e.required_pages);
        if total == 0 || needed > total {
            continue;
        }
        needed_pages = needed_pages.min(needed);
        let short = needed.saturating_sub(u64::from(e.available_pages));
        if best.is_none_or(|(s, w)| (short, &c.worker_id) < (s, w)) {
            best = Some((short, &c.worker_id));
        }
    }
    best.map(|(_, worker)| Shortfall {
        worker: worker.clone(),
        needed_pages,
    })
}

/// The waiting requests in the node's handling (module documentation).
impl RouterNode {
    /// Parks `request` if it has no usable feasible candidate, some worker could hold it
    /// once pages free, the queue has room and its deadline is ahead; the first to wait
    /// reserves a worker. Returns whether it now waits.
    pub(super) fn park(
        &mut self,
        now: Millis,
        request: &Arc<GenerationRequest>,
        deadline: Option<Millis>,
        pin: &Pin,
        usable: &[Candidate],
        held: &[Candidate],
    ) -> bool {
        // A deadline already past is the router machine's to fail, as on submit.
        if any_feasible(request, usable)
            || !self.waiting.has_room()
            || deadline.is_some_and(|d| d <= now)
        {
            return false;
        }
        let Some(needed_pages) = self.wait_for(request, usable, held) else {
            return false;
        };
        if self.waiting.is_empty() {
            self.waiting.reserved =
                shortfall(request, usable, self.discovery.registry()).map(|s| s.worker);
        }
        self.waiting.entries.push_back(Parked {
            request: Arc::clone(request),
            pin: pin.clone(),
            needed_pages,
        });
        // The router machine keeps its record and runs its deadline; its `waiting`
        // decision event is what metrics count.
        self.pending.push_back(RouterInput::Hold {
            request: Arc::clone(request),
            candidates: usable.iter().chain(held).cloned().collect(),
            deadline,
        });
        // It was examined against every worker's room now; the older ones were not, so
        // a mark only comes down (room freed silently, by a decline, still counts).
        self.note_rooms(true);
        true
    }

    /// Whether a request without a usable feasible candidate can wait, and the fewest
    /// pages it needs: it is short of pages on a worker that could hold it, or only
    /// workers older waiting requests reserved could take it now.
    fn wait_for(
        &self,
        request: &GenerationRequest,
        usable: &[Candidate],
        held: &[Candidate],
    ) -> Option<u64> {
        let registry = self.discovery.registry();
        let short = shortfall(request, usable.iter().chain(held), registry).map(|s| s.needed_pages);
        let on_reserved = held
            .iter()
            .map(|c| estimate(request, c))
            .filter(|e| e.feasible())
            .map(|e| u64::from(e.required_pages))
            .min();
        match (short, on_reserved) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Examines the waiting requests in arrival order (module [`waiting`]): the oldest
    /// goes to the router machine if it has a feasible candidate now, and the next is
    /// examined; the first that still waits reserves its worker, and the ones behind it
    /// wait their turn. One that could no longer be served however long it waited fails
    /// as the spec says. `every`: a worker left, so examine the oldest even where no
    /// worker has the room it needed.
    pub(super) fn admit_waiting(&mut self, now: Millis, every: bool, out: &mut Vec<NodeEffect>) {
        while let Some(oldest) = self.waiting.entries.front() {
            let reserved = self.waiting.reserved.is_some();
            if reserved && !every && oldest.needed_pages > self.most_room() {
                break; // no worker has the room it needed when last looked at
            }
            let Some(mut p) = self.waiting.entries.pop_front() else {
                break;
            };
            let candidates = self.candidates(&p.request, &p.pin);
            let feasible = any_feasible(&p.request, &candidates);
            if !feasible
                && let Some(s) = shortfall(&p.request, &candidates, self.discovery.registry())
            {
                p.needed_pages = s.needed_pages;
                self.waiting.reserved = Some(s.worker);
                self.waiting.entries.push_front(p);
                break;
            }
            self.waiting.reserved = None;
            // Its `released` decision event says how long it waited; one that can no
            // longer be served fails there with no-feasible-worker.
            self.pending.push_back(RouterInput::Release {
                request: p.request.id.clone(),
                candidates,
            });
            self.drain(now, out);
        }
        self.note_rooms(false);
    }

    /// The most pages any worker has for a new request.
    fn most_room(&self) -> u64 {
        (self.discovery.registry().observations())
            .map(|o| self.room(&o.worker_id))
            .max()
            .unwrap_or(0)
    }

    /// What a worker has for a new request: free and evictable pages, less those offered
    /// since its last heartbeat.
    pub(super) fn room(&self, worker: &WorkerId) -> u64 {
        self.discovery.registry().get(worker).map_or(0, |o| {
            (u64::from(o.free_pages) + u64::from(o.evictable_pages))
                .saturating_sub(self.unreflected.extra_pages(worker))
        })
    }

    /// The waiting requests were examined against every worker's room now (`lower`:
    /// only the newest was, so no mark goes up).
    fn note_rooms(&mut self, lower: bool) {
        let rooms: Vec<(WorkerId, u64)> = (self.discovery.registry().observations())
            .map(|o| (o.worker_id.clone(), self.room(&o.worker_id)))
            .collect();
        let marks = &mut self.waiting.examined_room;
        if !lower {
            marks.clear();
        }
        for (worker, room) in rooms {
            let mark = marks.entry(worker).or_insert(room);
            *mark = (*mark).min(room);
        }
    }
}
