//! The seam between the worker state machine and page accounting.
//!
//! The worker machine makes the semantic checks of an offer (epoch, identity, model,
//! duplicate request) itself and asks a [`Capacity`] for the rest: "can this assignment
//! get the pages it needs, atomically, right now?". Two implementations exist: abstract
//! page counters (the pure worker of spec §3.1, used by the simulator) and the real page
//! pool (spec §4, used by the agent), which is the authority on a live worker.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::candidate::{Candidate, Estimate, Infeasible};
use crate::ids::{AssignmentId, RouteId};
use crate::request::GenerationRequest;

/// Why a worker declined an offer. Every decline carries exactly one of these, and the
/// router keeps it in the decision record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeclineReason {
    WorkerOffline,
    WorkerEpochChanged,
    WrongWorker,
    ModelNotLoaded,
    RequestAlreadyAssigned,
    InsufficientPages,
    ContextCapacityExceeded,
    PrefixLongerThanRequest,
    NotExact,
    ResidentPrefixMismatch,
    ResidentPrefixUnavailable,
    /// The worker is draining (operator command or shutdown) and takes no new work.
    Draining,
}

impl DeclineReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeclineReason::WorkerOffline => "worker-offline",
            DeclineReason::WorkerEpochChanged => "worker-epoch-changed",
            DeclineReason::WrongWorker => "wrong-worker",
            DeclineReason::ModelNotLoaded => "model-not-loaded",
            DeclineReason::RequestAlreadyAssigned => "request-already-assigned",
            DeclineReason::InsufficientPages => "insufficient-pages",
            DeclineReason::ContextCapacityExceeded => "context-capacity-exceeded",
            DeclineReason::PrefixLongerThanRequest => "prefix-longer-than-request",
            DeclineReason::NotExact => "not-exact",
            DeclineReason::ResidentPrefixMismatch => "resident-prefix-mismatch",
            DeclineReason::ResidentPrefixUnavailable => "resident-prefix-unavailable",
            DeclineReason::Draining => "draining",
        }
    }
}

impl fmt::Display for DeclineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Infeasible> for DeclineReason {
    fn from(i: Infeasible) -> Self {
        match i {
            Infeasible::NotExact => DeclineReason::NotExact,
            Infeasible::WorkerOffline => DeclineReason::WorkerOffline,
            Infeasible::ModelNotLoaded => DeclineReason::ModelNotLoaded,
            Infeasible::ContextCapacityExceeded => DeclineReason::ContextCapacityExceeded,
            Infeasible::PrefixLongerThanRequest => DeclineReason::PrefixLongerThanRequest,
            Infeasible::InsufficientPages => DeclineReason::InsufficientPages,
        }
    }
}

/// What the worker machine asks of capacity when it admits an offer.
#[derive(Debug, Clone, Copy)]
pub struct AdmitRequest<'a> {
    pub assignment: &'a AssignmentId,
    /// The route the request's KV lives in (its continuation id, else its request id).
    pub route: &'a RouteId,
    pub request: &'a GenerationRequest,
    pub candidate: &'a Candidate,
    /// The worker's own re-estimate of the candidate against the request.
    pub estimate: &'a Estimate,
    /// Routes of every other non-terminal assignment: never evicted to make room.
    pub protected: &'a BTreeSet<RouteId>,
}

/// A successful admission: pages are reserved for the assignment (atomically, before the
/// worker answers "accepted").
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Admission {
    /// Pages removed from the free set for this assignment.
    pub reserved_pages: u32,
    /// Of those, pages that had to be freed by evicting durable routes.
    pub evicted_pages: u32,
    /// Routes evicted to make room (for the decision record and eviction metrics).
    pub evicted_routes: Vec<RouteId>,
    /// GPU tier: the resident route whose prefix pages were shared into this route.
    pub forked_from: Option<RouteId>,
}

/// Page accounting as seen by the worker machine.
pub trait Capacity {
    /// Reserve what `req` needs, evicting durable unprotected routes if necessary, or
    /// decline without changing anything.
    fn admit(&mut self, req: AdmitRequest<'_>) -> Result<Admission, DeclineReason>;

    /// Return the assignment's unclaimed reserved pages to the free set. Idempotent:
    /// returns false when there was nothing to release.
    fn release(&mut self, assignment: &AssignmentId) -> bool;

    /// The assignment finished successfully: its route stays resident (it is now cache),
    /// its unclaimed reservation is released.
    fn complete(&mut self, assignment: &AssignmentId, route: &RouteId);

    /// The assignment was cancelled or failed: release its reservation and drop the
    /// partial route it built (shared pages survive through their refcounts).
    fn abandon(&mut self, assignment: &AssignmentId, route: &RouteId);

    /// The process died: every page returns to free, every route and reservation is gone.
    fn crash(&mut self);

    fn free_pages(&self) -> u32;

    /// Pages that evicting every eligible route would free, with `protected` excluded.
    fn evictable_pages(&self, protected: &BTreeSet<RouteId>) -> u32;
}
