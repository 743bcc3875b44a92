//! Fault injection: partitions, pauses, crashes, stale capacity, lost, late and
//! duplicated messages, and raw inputs for adversarial tests.

use super::Simulation;
use super::trace::{Endpoint, Fault, LinkAction, LinkFault, TraceEvent};
use crate::capacity::Capacity;
use crate::ids::WorkerId;
use crate::router::RouterInput;
use crate::worker::{Counters, WorkerInput};

impl Simulation {
    /// Block the directed link `from → to`: messages on it are dropped on delivery.
    pub fn partition_link(&mut self, from: Endpoint, to: Endpoint) {
        self.fault(Fault::Partition {
            from: from.clone(),
            to: to.clone(),
        });
        self.blocked.insert((from, to));
    }

    /// Unblock every link.
    pub fn heal(&mut self) {
        self.fault(Fault::Heal);
        self.blocked.clear();
    }

    /// Hold every delivery to `worker` (messages and engine reports) until resumed.
    pub fn pause(&mut self, worker: &WorkerId) {
        self.fault(Fault::Pause {
            worker: worker.clone(),
        });
        self.paused.insert(worker.clone());
    }

    pub fn resume(&mut self, worker: &WorkerId) {
        self.fault(Fault::Resume {
            worker: worker.clone(),
        });
        self.paused.remove(worker);
    }

    /// Crash `worker`, then report each of its current attempts to the router as
    /// unavailable (sorted by assignment id), as an omniscient transport would.
    pub fn crash(&mut self, worker: &WorkerId) {
        self.fault(Fault::Crash {
            worker: worker.clone(),
        });
        self.worker_step(worker, WorkerInput::Crash);
        for input in self.router.unavailable_inputs(worker) {
            self.router_step(input);
        }
    }

    pub fn restart(&mut self, worker: &WorkerId) {
        self.fault(Fault::Restart {
            worker: worker.clone(),
        });
        self.worker_step(worker, WorkerInput::Restart);
    }

    /// Replace a worker's page counters, so that its real capacity differs from what its
    /// candidates claim. Reservations of live assignments are lost with the old counters:
    /// use it on idle workers.
    pub fn set_capacity(&mut self, worker: &WorkerId, capacity: Counters) {
        self.fault(Fault::SetCapacity {
            worker: worker.clone(),
            free: capacity.free_pages(),
            evictable: capacity.anonymous_evictable(),
        });
        if let Some(w) = self.workers.get_mut(worker) {
            *w.capacity_mut() = capacity;
        }
    }

    /// Drop the next message sent on `from → to`.
    pub fn drop_next(&mut self, from: Endpoint, to: Endpoint) {
        self.fault(Fault::DropNext {
            from: from.clone(),
            to: to.clone(),
        });
        self.link_fault(from, to, LinkAction::Drop);
    }

    /// Deliver the next message sent on `from → to` `ms` later than usual (so later
    /// messages can overtake it).
    pub fn delay_next(&mut self, from: Endpoint, to: Endpoint, ms: u64) {
        self.fault(Fault::DelayNext {
            from: from.clone(),
            to: to.clone(),
            ms,
        });
        self.link_fault(from, to, LinkAction::Delay(ms));
    }

    /// Deliver the next message sent on `from → to` twice.
    pub fn duplicate_next(&mut self, from: Endpoint, to: Endpoint) {
        self.fault(Fault::DuplicateNext {
            from: from.clone(),
            to: to.clone(),
        });
        self.link_fault(from, to, LinkAction::Duplicate);
    }

    /// Feed a raw input to the router now (e.g. a stale result or a forged token).
    pub fn inject_router(&mut self, input: RouterInput) {
        self.router_step(input);
    }

    /// Feed a raw input to a worker now.
    pub fn inject_worker(&mut self, worker: &WorkerId, input: WorkerInput) {
        self.worker_step(worker, input);
    }

    fn link_fault(&mut self, from: Endpoint, to: Endpoint, action: LinkAction) {
        self.link_faults.push(LinkFault { from, to, action });
    }

    fn fault(&mut self, fault: Fault) {
        self.push_trace(TraceEvent::Fault(fault));
    }
}
