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
//!   younger waiting requests backfill too, and reserving more workers ([`most_reserved`]).
//! - An accepted heartbeat that shows a worker with more room than the queue was last
//!   examined against re-examines it; a request that now has a feasible candidate is
//!   submitted to the router machine with the candidates of that moment, and one that no
//!   worker could hold any more (its worker left) fails as the spec says.
//! - Bounded: at most `capacity` requests wait (beyond that the spec's immediate
//!   `no-feasible-worker`, so a client sees back-pressure); each waits until its deadline
//!   at most, and a cancel removes it at once. `capacity` 0 is the spec's behaviour.
//! - A worker that does not report its pool's size (`pool.total_pages` 0) is never
//!   waited for: the node cannot tell whether the request would ever fit there.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::candidate::{Candidate, Infeasible, estimate};
use crate::discovery::Registry;
use crate::ids::{RequestId, WorkerId};
use crate::request::GenerationRequest;
use crate::time::Millis;

use super::{Count, Delivery, DeliveryKind, NodeEffect, Pin, RouterNode, Timer, TimerKey};
use crate::router::RouterInput;

/// A request waiting for pages.
#[derive(Debug, Clone, PartialEq)]
pub struct Parked {
    pub request: Arc<GenerationRequest>,
    pub deadline: Millis,
    pub pin: Pin,
    pub since: Millis,
    /// The fewest pages it needed on a worker that could hold it, when last examined: a
    /// heartbeat that leaves no worker that much room skips building its candidates.
    pub needed_pages: u64,
    /// The worker it reserved, the one fewest pages short of it among those no older
    /// waiting request reserved (`None`: it is not among the [`most_reserved`] oldest).
    pub reserved: Option<WorkerId>,
}

/// The queue (module documentation).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Waiting {
    pub(super) entries: VecDeque<Parked>,
    capacity: usize,
    /// Each worker's room (free and evictable pages, less those offered since its last
    /// heartbeat) when the waiting requests were last examined: a heartbeat showing no
    /// more than that cannot let one in. Not the previous heartbeat's: a request offered
    /// and finished between two heartbeats leaves those equal although the queue was
    /// examined with its pages taken.
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

    /// Takes `request` out of the queue (cancelled, or its deadline passed).
    pub fn remove(&mut self, request: &RequestId) -> Option<Parked> {
        let i = self.entries.iter().position(|p| &p.request.id == request)?;
        self.entries.remove(i)
    }

    /// Whether `room` on `worker` is more than the waiting requests were examined against.
    pub fn more_room(&self, worker: &WorkerId, room: u64) -> bool {
        self.examined_room.get(worker).is_none_or(|r| room > *r)
    }

    /// The workers the waiting requests reserved: nothing newer may be offered there.
    pub fn reserved(&self) -> BTreeSet<WorkerId> {
        self.entries
            .iter()
            .filter_map(|p| p.reserved.clone())
            .collect()
    }
}

/// How many workers waiting requests may reserve at once among `workers`: one, the
/// oldest's (EASY backfilling). A reserved worker takes no new request until the one that
/// reserved it fits, so its batch drains while it waits. Measured on the Mooncake trace
/// past capacity (8 workers, BENCHMARKS.md "Requests that wait for pages"): reserving a
/// worker for every waiting request (conservative backfilling) idled so much of the
/// fleet that it served 1.60 requests a second against 2.38 with one reservation (mean
/// TTFT 812 s against 217 s), and a quarter of the workers 1.67 (300 s).
pub fn most_reserved(_workers: usize) -> usize {
    1
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
    /// once pages free, the queue has room and its deadline is ahead: the oldest few
    /// reserve a worker ([`most_reserved`]). Returns whether it now waits.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn park(
        &mut self,
        now: Millis,
        request: &Arc<GenerationRequest>,
        deadline: Option<Millis>,
        pin: &Pin,
        usable: &[Candidate],
        held: &[Candidate],
        out: &mut Vec<NodeEffect>,
    ) -> bool {
        if any_feasible(request, usable) || !self.waiting.has_room() {
            return false;
        }
        let deadline = deadline.unwrap_or(now + self.router.config().default_deadline_ms);
        if deadline <= now {
            return false;
        }
        let Some(needed_pages) = self.wait_for(request, usable, held) else {
            return false;
        };
        let registry = self.discovery.registry();
        let reserved = if self.waiting.reserved().len() < most_reserved(registry.len()) {
            shortfall(request, usable, registry).map(|s| s.worker)
        } else {
            None
        };
        self.waiting.entries.push_back(Parked {
            request: Arc::clone(request),
            deadline,
            pin: pin.clone(),
            since: now,
            needed_pages,
            reserved,
        });
        out.push(NodeEffect::SetTimer {
            timer: Timer::Deadline(request.id.clone()),
            at: deadline,
        });
        out.push(NodeEffect::Count(Count::Parked));
        self.note_rooms();
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
            .map(|c| crate::candidate::estimate(request, c))
            .filter(|e| e.feasible())
            .map(|e| u64::from(e.required_pages))
            .min();
        match (short, on_reserved) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Examines the waiting requests oldest first (module [`waiting`]): one with a
    /// feasible candidate goes to the router machine; the oldest still waiting reserves
    /// its worker for itself; one that could no longer be served however long it waited
    /// fails as the spec says.
    pub(super) fn admit_waiting(&mut self, now: Millis, every: bool, out: &mut Vec<NodeEffect>) {
        if self.waiting.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut self.waiting.entries);
        // The workers reserved by the requests kept so far, oldest first.
        let mut reserved: BTreeSet<WorkerId> = BTreeSet::new();
        let mut room = self.most_room();
        let workers = self.discovery.registry().len();
        let most = most_reserved(workers);
        for mut p in entries {
            let may_reserve = reserved.len() < most;
            if reserved.len() >= workers.min(most) {
                // An older request holds the reservation: this one waits its turn (in
                // arrival order; see the module documentation).
                p.reserved = None;
                self.waiting.entries.push_back(p);
                continue;
            }
            // One that may reserve a worker and holds none is examined to pick one.
            let to_reserve = p.reserved.is_none() && may_reserve;
            if !every && !to_reserve && p.needed_pages > room {
                // No worker has the pages it needed when last looked at: it waits, and
                // keeps its worker if it still may and no older request took it.
                let keeps = may_reserve
                    && p.reserved
                        .as_ref()
                        .is_some_and(|w| reserved.insert(w.clone()));
                if !keeps {
                    p.reserved = None;
                }
                self.waiting.entries.push_back(p);
                continue;
            }
            let candidates = self.candidates(&p.request, &p.pin);
            let (usable, held): (Vec<Candidate>, Vec<Candidate>) = candidates
                .into_iter()
                .partition(|c| !reserved.contains(&c.worker_id));
            let feasible = any_feasible(&p.request, &usable);
            if !feasible && let Some(needed_pages) = self.wait_for(&p.request, &usable, &held) {
                p.needed_pages = needed_pages;
                p.reserved = if may_reserve {
                    shortfall(&p.request, &usable, self.discovery.registry()).map(|s| s.worker)
                } else {
                    None
                };
                if let Some(w) = &p.reserved {
                    reserved.insert(w.clone());
                }
                self.waiting.entries.push_back(p);
                continue;
            }
            let waited_ms = now.0.saturating_sub(p.since.0);
            if feasible {
                out.push(NodeEffect::Count(Count::Admitted { waited_ms }));
            }
            self.pending.push_back(RouterInput::Submit {
                request: p.request,
                candidates: usable,
                deadline: Some(p.deadline),
                waited_ms,
            });
            self.drain(now, out);
            room = self.most_room();
        }
        self.note_rooms();
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

    /// The waiting requests were examined against every worker's room now.
    fn note_rooms(&mut self) {
        let rooms: BTreeMap<WorkerId, u64> = (self.discovery.registry().observations())
            .map(|o| (o.worker_id.clone(), self.room(&o.worker_id)))
            .collect();
        self.waiting.examined_room = rooms;
    }

    /// A waiting request ends without reaching the router machine.
    pub(super) fn end_waiting(
        &mut self,
        request: RequestId,
        kind: DeliveryKind,
        out: &mut Vec<NodeEffect>,
    ) {
        out.push(NodeEffect::CancelTimer(TimerKey::Deadline(request.clone())));
        let d = Delivery { request, kind };
        self.delivered(&d);
        out.push(NodeEffect::Deliver(d));
    }
}
