//! Heartbeat-lagged observations: what a router that learns worker load only from
//! heartbeats sees.
//!
//! By default the fleet simulator hands every policy each worker's load *as of now*,
//! including the requests the policy routed a microsecond ago — an ideal router that
//! sees the exact effect of its own decisions. den-agent's router does not: it prices a
//! worker with the `queue_ms`, pool and calibration of that worker's last heartbeat, sent every
//! `--heartbeat-interval` and a few milliseconds after a request completes (the worker's
//! eager heartbeat). With [`Heartbeats`] set, the simulator keeps one snapshot of each
//! worker's load, taken at exactly those times, and policies see the snapshot. Cache
//! residency stays current (the worker advertises a completed route within the same few
//! milliseconds). What the router routed since a worker's snapshot is accounted by
//! den-agent's router's own ledger, [`Unreflected`]: offered work counts until a
//! heartbeat after its acceptance (a simulated worker accepts at once), and the work of a
//! request that completes after a heartbeat counted it is subtracted until the next one.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use den_protocol::ids::{AssignmentId, RequestId, WorkerId};
use den_protocol::router_node::inflight::Unreflected;

use super::cost::Micros;
use super::load::WorkerLoad;
use super::policy::FleetView;
use super::worker::{Shared, Worker};

/// When workers report their load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeats {
    /// Every worker reports this often, µs (worker `w` of `n` at phase `w × interval / n`).
    pub interval_us: Micros,
    /// A worker also reports this soon after a request completes or its checkpoint is
    /// stored, µs (den's worker: 5 ms).
    pub eager_us: Micros,
}

impl Heartbeats {
    /// den-agent's router and worker: `interval_ms` (`--heartbeat-interval`) and the
    /// worker's 5 ms eager heartbeat.
    pub fn den(interval_ms: u64) -> Heartbeats {
        Heartbeats {
            interval_us: interval_ms.max(1) * 1000,
            eager_us: 5_000,
        }
    }
}

/// The snapshots and the pending heartbeats of a replay.
pub(crate) struct Beats {
    config: Heartbeats,
    snapshots: Vec<WorkerLoad>,
    /// (time, worker, periodic): eager beats do not reschedule.
    pending: BinaryHeap<Reverse<(Micros, usize, bool)>>,
    /// The earliest eager beat pending per worker (coalesces bursts).
    eager_at: Vec<Option<Micros>>,
    /// Each worker's change counter at its last check.
    seen: Vec<u64>,
    /// The router's ledger of work its snapshots do not show (den-agent's, the same type).
    unreflected: Unreflected,
    ids: Vec<WorkerId>,
}

impl Beats {
    /// Snapshots of every worker at `now` (idle), periodic beats staggered over the
    /// first interval.
    pub(crate) fn new(config: Heartbeats, now: Micros, workers: &[Worker], sh: &Shared) -> Beats {
        let n = workers.len().max(1) as u64;
        let interval = config.interval_us.max(1);
        let pending = (0..workers.len())
            .map(|w| Reverse((now + interval * w as u64 / n + interval, w, true)))
            .collect();
        Beats {
            config,
            snapshots: workers.iter().map(|w| w.load(now, sh)).collect(),
            pending,
            eager_at: vec![None; workers.len()],
            seen: workers.iter().map(|w| w.changes).collect(),
            unreflected: Unreflected::default(),
            ids: (0..workers.len()).map(FleetView::worker_id).collect(),
        }
    }

    pub(crate) fn snapshots(&self) -> &[WorkerLoad] {
        &self.snapshots
    }

    /// When the next heartbeat is due.
    pub(crate) fn next(&self) -> Option<Micros> {
        self.pending.peek().map(|Reverse((t, _, _))| *t)
    }

    /// The router sent worker `w` request `r`, which it expects to add `work_ms` of
    /// queue, and the worker accepted it at once: until the worker's next heartbeat
    /// (which includes it: no network delay here), its reported queue carries that work.
    pub(crate) fn dispatched(&mut self, w: usize, r: usize, work_ms: f64) {
        let Some(id) = self.ids.get(w) else { return };
        let assignment = AssignmentId::new(request_id(r), 1);
        self.unreflected.offered(id, assignment.clone(), work_ms, 0);
        self.unreflected.answered(id, &assignment, true);
        self.refresh(w);
    }

    /// Worker `w`'s snapshot as the router prices it: the reported queue (0: every
    /// simulated worker reports a plan instead) plus the ledger's extra work.
    fn refresh(&mut self, w: usize) {
        let (Some(id), Some(s)) = (self.ids.get(w), self.snapshots.get_mut(w)) else {
            return;
        };
        let extra = self.unreflected.extra_ms(id);
        s.unreflected_ms = extra;
        s.queue_ms = extra.max(0.0);
    }

    /// Sends the next heartbeat: snapshot that worker at its time. Returns when and
    /// whose.
    pub(crate) fn fire(&mut self, workers: &[Worker], sh: &Shared) -> Option<(Micros, usize)> {
        let Reverse((at, w, periodic)) = self.pending.pop()?;
        if let (Some(worker), Some(slot)) = (workers.get(w), self.snapshots.get_mut(w)) {
            *slot = worker.load(at, sh);
        }
        if let Some(id) = self.ids.get(w) {
            self.unreflected.heartbeat(id);
        }
        self.refresh(w);
        if periodic {
            self.pending
                .push(Reverse((at + self.config.interval_us.max(1), w, true)));
        } else if let Some(e) = self.eager_at.get_mut(w)
            && *e == Some(at)
        {
            *e = None;
        }
        Some((at, w))
    }

    /// Worker `w` just processed an event at `at`: the requests it completed end in the
    /// router's ledger, and if something a router depends on changed (a completion, a
    /// stored checkpoint), an eager heartbeat follows.
    pub(crate) fn after_event(&mut self, w: usize, worker: &mut Worker, at: Micros) {
        if !worker.finished.is_empty() {
            for r in worker.finished.drain(..) {
                self.unreflected.ended(&request_id(r as usize));
            }
            // `ended` moves work between a worker's entries only; every worker with
            // entries for those requests is this one (one attempt per request here).
            self.refresh(w);
        }
        let Some(seen) = self.seen.get_mut(w) else {
            return;
        };
        if worker.changes == *seen {
            return;
        }
        *seen = worker.changes;
        if let Some(e) = self.eager_at.get_mut(w)
            && e.is_none()
        {
            let t = at + self.config.eager_us;
            *e = Some(t);
            self.pending.push(Reverse((t, w, false)));
        }
    }
}

/// Request `r` of the workload as the router's ledger names it.
fn request_id(r: usize) -> RequestId {
    RequestId::new(format!("r{r}"))
}
