//! Work the router assigned that the workers' heartbeats do not show yet.
//!
//! A worker's `queue_ms` is as old as its last heartbeat (every `--heartbeat-interval`,
//! or a few ms after a completion). Priced by it alone, a burst of requests arriving
//! within one interval all see the same idle worker and pile onto it: the validation
//! against real agents measured mean TTFT 2.8× the simulator's fresh-view figure for
//! exactly this reason. So the router adds to each worker's reported queue the work of
//! every assignment it offered there that no heartbeat includes yet
//! ([`crate::candidate::added_work_ms`]), the way Dynamo's and llm-d's routers
//! count their own in-flight requests between load reports.
//!
//! When is an assignment in a heartbeat? A worker accepts an offer before it queues the
//! work, and its frames arrive in order on one connection, so every heartbeat the router
//! receives *after* the worker's acceptance counts the work. Offers not answered yet
//! stay counted across heartbeats; a decline, a timeout or the worker's connection
//! closing drops them.
//!
//! The other direction matters as much: a request that completes after the heartbeat
//! that counted it leaves that heartbeat's `queue_ms` too high until the next one, and a
//! client that repeats a prompt right after its answer would see the worker holding its
//! prefix as busy and be sent to recompute elsewhere. So the work of a request that ends
//! after being reflected is subtracted until the worker's next heartbeat (at worst the
//! queue reads low for the few milliseconds until the worker's eager heartbeat).

use std::collections::BTreeMap;

use crate::ids::{AssignmentId, RequestId, WorkerId};

/// Per worker, the assignments offered there and what its last heartbeat shows of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Unreflected {
    workers: BTreeMap<WorkerId, BTreeMap<AssignmentId, Entry>>,
    /// Work of requests that ended after the worker's last heartbeat counted them.
    finished: BTreeMap<WorkerId, f64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    work_ms: f64,
    /// KV pages the worker reserves for it on acceptance.
    pages: u64,
    accepted: bool,
    /// A heartbeat received after the acceptance counts this work.
    reflected: bool,
}

impl Unreflected {
    /// An offer of `work_ms` needing `pages` KV pages was sent to `worker`.
    pub fn offered(
        &mut self,
        worker: &WorkerId,
        assignment: AssignmentId,
        work_ms: f64,
        pages: u64,
    ) {
        self.workers.entry(worker.clone()).or_default().insert(
            assignment,
            Entry {
                work_ms: work_ms.max(0.0),
                pages,
                accepted: false,
                reflected: false,
            },
        );
    }

    /// The worker answered the offer: accepted work is reflected by its next heartbeat;
    /// declined work never will be.
    pub fn answered(&mut self, worker: &WorkerId, assignment: &AssignmentId, accepted: bool) {
        let Some(entries) = self.workers.get_mut(worker) else {
            return;
        };
        if accepted {
            if let Some(e) = entries.get_mut(assignment) {
                e.accepted = true;
            }
        } else {
            entries.remove(assignment);
        }
    }

    /// An accepted heartbeat from `worker`: it counts every assignment accepted before it,
    /// and none of those that ended.
    pub fn heartbeat(&mut self, worker: &WorkerId) {
        if let Some(entries) = self.workers.get_mut(worker) {
            for e in entries.values_mut() {
                e.reflected |= e.accepted;
            }
        }
        self.finished.remove(worker);
    }

    /// The offer timed out (the machine cancels it and moves on).
    pub fn withdrawn(&mut self, assignment: &AssignmentId) {
        for entries in self.workers.values_mut() {
            entries.remove(assignment);
        }
    }

    /// The request ended: none of its attempts adds work any more, and the work a
    /// heartbeat still counts is done.
    pub fn ended(&mut self, request: &RequestId) {
        for (worker, entries) in &mut self.workers {
            entries.retain(|a, e| {
                if &a.request != request {
                    return true;
                }
                if e.reflected {
                    *self.finished.entry(worker.clone()).or_default() += e.work_ms;
                }
                false
            });
        }
    }

    /// The worker's connection closed: its queue starts again from its next heartbeat.
    pub fn forget(&mut self, worker: &WorkerId) {
        self.workers.remove(worker);
        self.finished.remove(worker);
    }

    /// Work to add to `worker`'s last reported `queue_ms` (negative: work that heartbeat
    /// counts has finished since).
    pub fn extra_ms(&self, worker: &WorkerId) -> f64 {
        self.extra(worker).0
    }

    /// Pages to take from `worker`'s last reported free (then evictable) pages: those
    /// of offers its last heartbeat does not show reserved. Without this, every request
    /// admitted between two heartbeats sees the same free pages, and all but the first
    /// are declined for want of them.
    pub fn extra_pages(&self, worker: &WorkerId) -> u64 {
        self.extra(worker).1
    }

    /// [`Unreflected::extra_ms`] and [`Unreflected::extra_pages`] in one pass.
    pub fn extra(&self, worker: &WorkerId) -> (f64, u64) {
        let (ms, pages) = self.workers.get(worker).map_or((0.0, 0), |entries| {
            (entries.values().filter(|e| !e.reflected))
                .fold((0.0, 0), |(ms, pages), e| (ms + e.work_ms, pages + e.pages))
        });
        (
            ms - self.finished.get(worker).copied().unwrap_or(0.0),
            pages,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(request: &str, attempt: u64) -> AssignmentId {
        AssignmentId {
            request: RequestId::new(request),
            attempt,
        }
    }

    #[test]
    fn offered_work_counts_until_a_heartbeat_after_acceptance() {
        let (w, mut u) = (WorkerId::new("w"), Unreflected::default());
        u.offered(&w, a("r1", 1), 10.0, 0);
        u.offered(&w, a("r2", 1), 5.0, 0);
        assert_eq!(u.extra_ms(&w), 15.0);
        // A heartbeat before the acceptance was sent before the worker queued the work.
        u.heartbeat(&w);
        assert_eq!(u.extra_ms(&w), 15.0);
        u.answered(&w, &a("r1", 1), true);
        u.heartbeat(&w);
        assert_eq!(u.extra_ms(&w), 5.0);
        assert_eq!(u.extra_ms(&WorkerId::new("other")), 0.0);
    }

    #[test]
    fn work_that_finishes_after_its_heartbeat_is_subtracted_until_the_next() {
        let (w, mut u) = (WorkerId::new("w"), Unreflected::default());
        u.offered(&w, a("r1", 1), 30.0, 0);
        u.answered(&w, &a("r1", 1), true);
        u.heartbeat(&w);
        assert_eq!(u.extra_ms(&w), 0.0);
        // r1 completes before the next heartbeat: its 30 ms are no longer ahead.
        u.ended(&RequestId::new("r1"));
        assert_eq!(u.extra_ms(&w), -30.0);
        u.heartbeat(&w);
        assert_eq!(u.extra_ms(&w), 0.0);
        // A request that ends before any heartbeat counted it subtracts nothing.
        u.offered(&w, a("r2", 1), 5.0, 0);
        u.answered(&w, &a("r2", 1), true);
        u.ended(&RequestId::new("r2"));
        assert_eq!(u.extra_ms(&w), 0.0);
    }

    #[test]
    fn offered_pages_count_until_a_heartbeat_after_acceptance_or_the_end() {
        let (w, mut u) = (WorkerId::new("w"), Unreflected::default());
        u.offered(&w, a("r1", 1), 1.0, 8);
        u.offered(&w, a("r2", 1), 1.0, 3);
        assert_eq!(u.extra_pages(&w), 11);
        u.heartbeat(&w);
        assert_eq!(u.extra_pages(&w), 11, "not accepted yet: not reserved yet");
        u.answered(&w, &a("r1", 1), true);
        u.heartbeat(&w);
        assert_eq!(u.extra_pages(&w), 3);
        u.answered(&w, &a("r2", 1), false);
        assert_eq!(u.extra_pages(&w), 0);
        u.offered(&w, a("r3", 1), 1.0, 5);
        u.ended(&RequestId::new("r3"));
        assert_eq!(u.extra_pages(&w), 0);
        assert_eq!(u.extra_pages(&WorkerId::new("other")), 0);
    }

    #[test]
    fn declines_timeouts_ends_and_disconnects_drop_work() {
        let (w, mut u) = (WorkerId::new("w"), Unreflected::default());
        u.offered(&w, a("r1", 1), 1.0, 0);
        u.offered(&w, a("r2", 1), 2.0, 0);
        u.offered(&w, a("r3", 1), 4.0, 0);
        u.offered(&w, a("r4", 1), 8.0, 0);
        u.answered(&w, &a("r1", 1), false);
        assert_eq!(u.extra_ms(&w), 14.0);
        u.withdrawn(&a("r2", 1));
        assert_eq!(u.extra_ms(&w), 12.0);
        u.ended(&RequestId::new("r3"));
        assert_eq!(u.extra_ms(&w), 8.0);
        u.forget(&w);
        assert_eq!(u.extra_ms(&w), 0.0);
    }
}
