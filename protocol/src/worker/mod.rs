//! The worker state machine (spec §3.1–3.5), generic over page accounting.
//!
//! [`Worker::handle`] takes the current logical time and one [`WorkerInput`] and returns
//! [`WorkerEffect`]s: wire messages for the router (offer results, token deltas, results)
//! and local effects for the runtime (start a restore / prefill / decode operation, cancel
//! one, report a released reservation). It makes the semantic checks of an offer itself
//! and asks its [`Capacity`] — abstract [`Counters`] in the simulator, the real page pool
//! on a live worker — for pages.
//!
//! Decisions where the spec was silent or that are stronger than the pure reference:
//! - **Quiescence.** A cancel fences the assignment at once (later tokens and operation
//!   results for it are dropped and send nothing) and emits
//!   [`LocalWorkerEffect::CancelOperation`]; its reservation is abandoned immediately only
//!   if no operation of it is in flight, otherwise when that operation's result arrives.
//!   A quiescing assignment still counts as non-terminal: its route stays protected and a
//!   new offer for the same request is declined `request-already-assigned`.
//! - **Tombstones.** Completed, failed and cancelled assignments are remembered for
//!   [`WorkerConfig::retention_ms`] and at most [`WorkerConfig::retention_count`] entries
//!   (oldest dropped first), so a duplicate offer is re-acknowledged (and a completed or
//!   failed result re-sent) instead of being run twice. A cancel for an assignment the
//!   worker never saw also leaves a tombstone, so an offer overtaken by its own cancel is
//!   acknowledged but never run.
//! - **Draining.** [`WorkerInput::SetDraining`] makes new offers decline `draining`
//!   (checked after the semantic checks, before capacity); running work finishes.
//! - An offer whose re-estimate is infeasible for a reason other than pages (context,
//!   exactness, a prefix longer than the request) is declined with that reason; pages are
//!   decided by the capacity, never by the router's possibly stale counts.

mod admission;
pub mod counters;
mod execution;
pub(crate) mod serde_seq;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use serde::Serialize;

use crate::candidate::{Candidate, Estimate};
use crate::capacity::{Admission, Capacity};
use crate::ids::{AssignmentId, Epoch, ModelFingerprint, RequestId, RouteId, WorkerId};
use crate::observation::Observation;
use crate::request::{GenerationRequest, Token};
use crate::time::Millis;
use crate::wire::{
    Cancel, Offer, RouterMessage, StopReason, WorkerMessage, WorkerResult, WorkerTimings,
};

pub use counters::Counters;

/// Worker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WorkerConfig {
    /// How long finished assignments are remembered for duplicate offers.
    pub retention_ms: u64,
    /// At most this many finished assignments are remembered.
    pub retention_count: usize,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            retention_ms: 600_000,
            retention_count: 4096,
        }
    }
}

/// Inputs to [`Worker::handle`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "input", rename_all = "kebab-case")]
pub enum WorkerInput {
    /// An offer from the router.
    Offer(Box<Offer>),
    /// A cancellation from the router.
    Cancel(Cancel),
    /// The decode operation produced a token (from the engine's token callback).
    Token {
        assignment: AssignmentId,
        token: Token,
        index: u32,
    },
    /// An operation of `assignment` finished.
    OperationDone {
        assignment: AssignmentId,
        outcome: OperationOutcome,
    },
    /// The process died (simulated): everything is lost, the epoch increases.
    Crash,
    /// The process is back.
    Restart,
    /// Draining workers decline new offers and finish what they have.
    SetDraining { draining: bool },
    /// The set of loaded models changed.
    SetModels { models: BTreeSet<ModelFingerprint> },
}

impl From<RouterMessage> for WorkerInput {
    fn from(m: RouterMessage) -> Self {
        match m {
            RouterMessage::Offer(o) => WorkerInput::Offer(o),
            RouterMessage::Cancel(c) => WorkerInput::Cancel(c),
        }
    }
}

/// The three execution stages (§3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OperationKind {
    Restore,
    /// Computes the missing prompt rows, then **continues into the decode of the same
    /// work on the device**, with no second `Start`: the runtime reports `Prefilled` when
    /// the rows are in and then exactly one decode outcome (a `Decoded`, or a decode
    /// `Failed` — also when the decode was cancelled before it began). Chaining keeps the
    /// first token in the step right after the prompt's last rows (a batching device that
    /// waited for a second `Start` would run a whole step without it) and spares every
    /// request a device → worker → device round trip.
    Prefill,
    Decode,
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum OperationOutcome {
    /// The prefix was restored; `cached_token_count` is what was actually restored (the
    /// candidate's count when the engine does not say).
    Restored {
        cached_token_count: Option<u32>,
    },
    Prefilled,
    Decoded {
        tokens: Vec<Token>,
        stop: StopReason,
    },
    Failed {
        operation: OperationKind,
        detail: String,
    },
}

impl OperationOutcome {
    pub fn kind(&self) -> OperationKind {
        match self {
            OperationOutcome::Restored { .. } => OperationKind::Restore,
            OperationOutcome::Prefilled => OperationKind::Prefill,
            OperationOutcome::Decoded { .. } => OperationKind::Decode,
            OperationOutcome::Failed { operation, .. } => *operation,
        }
    }
}

/// What the worker asks of its runtime. Only `Send` carries a wire frame.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[must_use = "an effect is a decision to carry out, not a value to drop"]
pub enum WorkerEffect {
    Send(WorkerMessage),
    Local(LocalWorkerEffect),
}

/// Effects that stay inside the worker process.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "local", rename_all = "kebab-case")]
#[must_use = "an effect is a decision to carry out, not a value to drop"]
pub enum LocalWorkerEffect {
    /// Run an operation; report it with [`WorkerInput::OperationDone`] (and, for decode,
    /// each token with [`WorkerInput::Token`]). A prefill continues into its decode
    /// ([`OperationKind::Prefill`]).
    Start(Operation),
    /// Stop the in-flight operation of a cancelled assignment if possible. Its result must
    /// still be reported: that is when the reservation is released.
    CancelOperation {
        assignment: AssignmentId,
        in_flight: Option<OperationKind>,
    },
    /// The assignment's reservation went back to the capacity.
    Released {
        assignment: AssignmentId,
        cause: ReleaseCause,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseCause {
    Completed,
    Failed,
    Cancelled,
}

/// One operation to run on the device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Operation {
    pub kind: OperationKind,
    pub worker: WorkerId,
    pub work: Arc<Work>,
}

impl Operation {
    pub fn assignment(&self) -> &AssignmentId {
        &self.work.assignment
    }
}

/// An accepted assignment's immutable description, shared by its operations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Work {
    pub assignment: AssignmentId,
    pub request: Arc<GenerationRequest>,
    pub candidate: Candidate,
    /// The worker's own re-estimate of the candidate.
    pub estimate: Estimate,
    /// The route the request's KV lives in.
    pub route: RouteId,
    pub admission: Admission,
}

/// Where a live assignment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AssignmentPhase {
    Restoring,
    Prefilling,
    Decoding,
    /// Cancelled (fenced), waiting for its in-flight operation to return.
    Cancelling,
}

/// A live (non-terminal) assignment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assignment {
    pub work: Arc<Work>,
    pub phase: AssignmentPhase,
    pub in_flight: Option<OperationKind>,
    /// Tokens streamed so far.
    pub emitted: u32,
    /// Prefix tokens reused (the restore's actual count once restored).
    pub cached_token_count: u32,
    pub accepted_at: Millis,
    op_started_at: Millis,
    pub timings: WorkerTimings,
}

/// A remembered terminal assignment.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Finished {
    Completed { result: WorkerResult },
    Failed { result: WorkerResult },
    Cancelled,
}

/// The worker state machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Worker<C> {
    id: WorkerId,
    epoch: Epoch,
    models: BTreeSet<ModelFingerprint>,
    online: bool,
    draining: bool,
    config: WorkerConfig,
    capacity: C,
    #[serde(serialize_with = "serde_seq::serialize")]
    active: BTreeMap<AssignmentId, Assignment>,
    /// Routes of live assignments with their assignment counts, and the same routes as
    /// the set handed to the capacity as "protected" (derived from `active`).
    #[serde(skip)]
    route_counts: BTreeMap<RouteId, u32>,
    #[serde(skip)]
    protected: BTreeSet<RouteId>,
    #[serde(serialize_with = "serde_seq::serialize")]
    finished: BTreeMap<AssignmentId, Finished>,
    /// Finished assignments in the order they finished (for retention).
    finished_order: VecDeque<(Millis, AssignmentId)>,
}

impl<C: Capacity> Worker<C> {
    pub fn new(
        id: impl Into<WorkerId>,
        epoch: Epoch,
        models: impl IntoIterator<Item = ModelFingerprint>,
        capacity: C,
    ) -> Self {
        Worker {
            id: id.into(),
            epoch,
            models: models.into_iter().collect(),
            online: true,
            draining: false,
            config: WorkerConfig::default(),
            capacity,
            active: BTreeMap::new(),
            route_counts: BTreeMap::new(),
            protected: BTreeSet::new(),
            finished: BTreeMap::new(),
            finished_order: VecDeque::new(),
        }
    }

    pub fn with_config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// The single entry point: apply `input` at logical time `now`.
    #[must_use = "the effects are what the state machine decided: carry them out"]
    pub fn handle(&mut self, now: Millis, input: WorkerInput) -> Vec<WorkerEffect> {
        self.prune(now);
        let mut out = Vec::new();
        match input {
            WorkerInput::Offer(offer) => self.on_offer(now, offer, &mut out),
            WorkerInput::Cancel(cancel) => self.on_cancel(now, cancel.assignment, &mut out),
            WorkerInput::Token {
                assignment,
                token,
                index,
            } => self.on_token(now, &assignment, token, index, &mut out),
            WorkerInput::OperationDone {
                assignment,
                outcome,
            } => self.on_operation_done(now, &assignment, outcome, &mut out),
            WorkerInput::Crash => {
                self.capacity.crash();
                self.epoch = self.epoch.next();
                self.online = false;
                self.draining = false;
                self.active.clear();
                self.route_counts.clear();
                self.protected.clear();
                self.finished.clear();
                self.finished_order.clear();
            }
            WorkerInput::Restart => self.online = true,
            WorkerInput::SetDraining { draining } => self.draining = draining,
            WorkerInput::SetModels { models } => self.models = models,
        }
        out
    }

    pub fn id(&self) -> &WorkerId {
        &self.id
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    pub fn online(&self) -> bool {
        self.online
    }

    pub fn draining(&self) -> bool {
        self.draining
    }

    pub fn models(&self) -> &BTreeSet<ModelFingerprint> {
        &self.models
    }

    pub fn capacity(&self) -> &C {
        &self.capacity
    }

    /// Direct access to the capacity, for runtimes that adjust it outside an assignment
    /// (and for the simulator's stale-capacity fault).
    pub fn capacity_mut(&mut self) -> &mut C {
        &mut self.capacity
    }

    pub fn assignment(&self, id: &AssignmentId) -> Option<&Assignment> {
        self.active.get(id)
    }

    /// Live assignments (including quiescing ones), in id order.
    pub fn assignments(&self) -> impl Iterator<Item = (&AssignmentId, &Assignment)> {
        self.active.iter()
    }

    pub fn finished(&self, id: &AssignmentId) -> Option<&Finished> {
        self.finished.get(id)
    }

    /// Routes of every live assignment: never evicted.
    pub fn protected_routes(&self) -> &BTreeSet<RouteId> {
        &self.protected
    }

    /// Copy the authoritative fields into a heartbeat observation (§3.8): identity,
    /// epoch, models, online/draining, free and evictable pages (live routes protected)
    /// and the queue depth.
    pub fn fill_observation(&self, obs: &mut Observation) {
        obs.worker_id = self.id.clone();
        obs.epoch = self.epoch;
        obs.models = self.models.clone();
        obs.online = self.online;
        obs.draining = self.draining;
        obs.free_pages = self.capacity.free_pages();
        obs.evictable_pages = self.capacity.evictable_pages(&self.protected);
        obs.queue_depth = u32::try_from(self.active.len()).unwrap_or(u32::MAX);
    }

    /// Drop tombstones past their retention time or beyond the retention count.
    fn prune(&mut self, now: Millis) {
        while let Some((at, _)) = self.finished_order.front() {
            let expired = at.saturating_add(self.config.retention_ms) <= now;
            if !expired && self.finished_order.len() <= self.config.retention_count {
                break;
            }
            if let Some((_, id)) = self.finished_order.pop_front() {
                self.finished.remove(&id);
            }
        }
    }

    fn insert_active(&mut self, id: AssignmentId, assignment: Assignment) {
        let route = &assignment.work.route;
        match self.route_counts.get_mut(route) {
            Some(n) => *n += 1,
            None => {
                self.route_counts.insert(route.clone(), 1);
                self.protected.insert(route.clone());
            }
        }
        self.active.insert(id, assignment);
    }

    fn remove_active(&mut self, id: &AssignmentId) -> Option<Assignment> {
        let assignment = self.active.remove(id)?;
        let route = &assignment.work.route;
        if let Some(n) = self.route_counts.get_mut(route) {
            *n -= 1;
            if *n == 0 {
                self.route_counts.remove(route);
                self.protected.remove(route);
            }
        }
        Some(assignment)
    }

    /// Is another live assignment (quiescing ones included) serving `request`?
    fn serves(&self, request: &RequestId) -> bool {
        let first = AssignmentId {
            request: request.clone(),
            attempt: 0,
        };
        self.active
            .range(first..)
            .next()
            .is_some_and(|(id, _)| &id.request == request)
    }

    fn remember(&mut self, now: Millis, id: AssignmentId, finished: Finished) {
        if self.finished.insert(id.clone(), finished).is_none() {
            self.finished_order.push_back((now, id));
        }
        self.prune(now);
    }
}
