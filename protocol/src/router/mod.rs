//! The router state machine (spec §2).
//!
//! One entry point, [`Router::handle`], takes the current logical time and one
//! [`RouterInput`] and returns [`RouterEffect`]s. It performs no I/O: runtimes (the agent,
//! the simulator) send the wire effects, run the timers and deliver to clients.
//!
//! Rules, in short:
//! - Candidates are ranked once at submission ([`crate::candidate::rank`]) and walked in
//!   offer order; declines, offer timeouts, failed results and unavailability before the
//!   first streamed token move on to the next candidate; exhaustion fails the request
//!   with [`RouterError::NoFeasibleWorker`].
//! - Fencing (§2.6): every worker message and timer must name the current assignment and
//!   arrive in the right phase; unavailability must name the current attempt's worker;
//!   a token must carry exactly the next index. Anything else is a silent no-op.
//! - Streaming cut-off: once a delta was delivered there is no transparent retry.
//! - Every request has a deadline; terminal records are garbage-collected after
//!   [`RouterConfig::retention_ms`]; a duplicate submit of a known id is ignored.
//!
//! Decisions where the spec was silent (§12):
//! - A decline (and unavailability while offered, a cancel while offered, a deadline
//!   while offered) emits [`LocalRouterEffect::CancelOfferTimer`] for the ended attempt:
//!   runtimes need not keep dead timers around. A timer that fires anyway is fenced.
//! - The deadline is a timer the router asks for ([`LocalRouterEffect::SetDeadlineTimer`]);
//!   [`RouterInput::DeadlineExpired`] before the deadline is ignored, and the timer is
//!   cancelled when the request ends first. A deadline already past at submission fails
//!   the request at once.
//! - Garbage collection runs at the start of every `handle` call (so a busy router needs
//!   no timer for it) and on [`RouterInput::Tick`] (for an idle one); each collected
//!   record emits a [`DecisionEventKind::Collected`] event. After collection the id is
//!   unknown again: late messages are no-ops and a new submit is a new request.
//! - Beyond the spec: a request the router node holds for KV pages
//!   ([`RouterInput::Hold`], [`crate::router_node::waiting`]) has its record from the
//!   moment it arrives, in [`Phase::Waiting`] — so operators see it, cancel it and find
//!   it afterwards like any other — and its deadline runs while it waits.
//!   [`RouterInput::Release`] ranks and offers it with the candidates of that moment;
//!   its predictions count from then, and the record says how long it waited.

mod error;
mod record;
mod transition;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::candidate::Candidate;
use crate::capacity::DeclineReason;
use crate::decision::{DecisionEvent, DecisionRecord};
use crate::ids::{AssignmentId, Epoch, RequestId, WorkerId};
use crate::request::{GenerationRequest, Token};
use crate::time::Millis;
use crate::wire::{OutboundToWorker, WorkerMessage, WorkerResult};

pub use error::{LastAttempt, NoFeasible, RouterError};

#[cfg(doc)]
use crate::decision::DecisionEventKind;

use record::Entry;

/// Router settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterConfig {
    /// How long an offer may stay unanswered before the next candidate is tried.
    pub offer_timeout_ms: u64,
    /// Deadline of a request submitted without one, counted from submission.
    pub default_deadline_ms: u64,
    /// How long a terminal record is kept (for late messages, duplicate submits and the
    /// console) before it is garbage-collected.
    pub retention_ms: u64,
    /// Candidates a finished request's record keeps, feasible and infeasible each (plus
    /// every one attempted): see [`crate::decision::CandidateSnapshot::compact`].
    pub retained_candidates: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            offer_timeout_ms: 100,
            default_deadline_ms: 60_000,
            retention_ms: 300_000,
            retained_candidates: 16,
        }
    }
}

/// Where a request stands. (`received` of the spec is transient and never observable.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Held by the router node until KV pages free; no attempt yet.
    Waiting,
    Offered,
    Assigned,
    Completed,
    Failed,
    Cancelled,
}

impl Phase {
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Completed | Phase::Failed | Phase::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Offered => "offered",
            Phase::Assigned => "assigned",
            Phase::Completed => "completed",
            Phase::Failed => "failed",
            Phase::Cancelled => "cancelled",
        }
    }
}

/// Inputs to [`Router::handle`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "input", rename_all = "kebab-case")]
pub enum RouterInput {
    /// A new request with its (unranked) candidates. `deadline` is absolute; `None`
    /// means `now + default_deadline_ms`.
    Submit {
        request: Arc<GenerationRequest>,
        candidates: Vec<Candidate>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<Millis>,
    },
    /// A new request that no candidate can take until KV pages free (the router node's
    /// queue, [`crate::router_node::waiting`]): its record is kept in phase
    /// [`Phase::Waiting`] with these candidates, its deadline runs, and a cancel or the
    /// deadline ends it; nothing is offered until [`RouterInput::Release`].
    Hold {
        request: Arc<GenerationRequest>,
        candidates: Vec<Candidate>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<Millis>,
    },
    /// A waiting request leaves the queue with its candidates now: it is ranked and
    /// offered as a submit is (and fails with no-feasible-worker if none can take it).
    Release {
        request: RequestId,
        candidates: Vec<Candidate>,
    },
    /// The client cancelled the request.
    Cancel { request: RequestId },
    /// A worker answered an offer.
    OfferResult {
        assignment: AssignmentId,
        worker_epoch: Epoch,
        accepted: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<DeclineReason>,
    },
    /// A streamed token.
    Token {
        assignment: AssignmentId,
        token: Token,
        index: u32,
    },
    /// A terminal worker result.
    Result {
        assignment: AssignmentId,
        result: Box<WorkerResult>,
    },
    /// The transport lost `worker` while `assignment` was on it.
    WorkerUnavailable {
        worker: WorkerId,
        assignment: AssignmentId,
    },
    /// The offer timer of `assignment` fired.
    OfferTimeout { assignment: AssignmentId },
    /// The deadline timer of `request` fired.
    DeadlineExpired { request: RequestId },
    /// Periodic housekeeping (garbage collection of terminal records).
    Tick,
}

impl RouterInput {
    /// A submit with the router's default deadline.
    pub fn submit(request: impl Into<Arc<GenerationRequest>>, candidates: Vec<Candidate>) -> Self {
        RouterInput::Submit {
            request: request.into(),
            candidates,
            deadline: None,
        }
    }
}

impl From<WorkerMessage> for RouterInput {
    fn from(m: WorkerMessage) -> Self {
        match m {
            WorkerMessage::OfferResult(r) => RouterInput::OfferResult {
                assignment: r.assignment,
                worker_epoch: r.worker_epoch,
                accepted: r.accepted,
                reason: r.reason,
            },
            WorkerMessage::Token(t) => RouterInput::Token {
                assignment: t.assignment,
                token: t.token,
                index: t.index,
            },
            WorkerMessage::Result(r) => RouterInput::Result {
                assignment: r.assignment,
                result: r.result,
            },
        }
    }
}

/// What the router asks its runtime to do. Split at the type level: only `Send` carries a
/// wire frame ([`crate::wire::WireMessage`]); `Local` effects cannot be encoded.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[must_use = "an effect is a decision to carry out, not a value to drop"]
pub enum RouterEffect {
    Send(OutboundToWorker),
    Local(LocalRouterEffect),
}

/// Effects that stay inside the router process.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "local", rename_all = "kebab-case")]
#[must_use = "an effect is a decision to carry out, not a value to drop"]
pub enum LocalRouterEffect {
    /// Fire [`RouterInput::OfferTimeout`] for `assignment` at `at`.
    SetOfferTimer {
        assignment: AssignmentId,
        at: Millis,
    },
    CancelOfferTimer {
        assignment: AssignmentId,
    },
    /// Fire [`RouterInput::DeadlineExpired`] for `request` at `at`.
    SetDeadlineTimer {
        request: RequestId,
        at: Millis,
    },
    CancelDeadlineTimer {
        request: RequestId,
    },
    /// Hand something to the client that submitted the request.
    Deliver(Delivery),
    /// A decision record changed (for the console and recordings).
    Decision(DecisionEvent),
}

/// A delivery to the client of one request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delivery {
    pub request: RequestId,
    pub kind: DeliveryKind,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum DeliveryKind {
    Delta { token: Token, index: u32 },
    Completed { result: Box<WorkerResult> },
    Error { error: RouterError },
    Cancelled,
}

impl Delivery {
    /// Completed, error or cancelled: the last delivery a request gets.
    pub fn is_terminal(&self) -> bool {
        !matches!(self.kind, DeliveryKind::Delta { .. })
    }
}

/// Requests held, by phase, plus the number collected so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RouterCounts {
    #[serde(default)]
    pub waiting: u64,
    pub offered: u64,
    pub assigned: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub collected: u64,
}

impl RouterCounts {
    pub fn in_flight(&self) -> u64 {
        self.offered + self.assigned
    }

    /// Accepted requests that have not ended: in flight, or waiting for KV pages (a
    /// drain serves those as pages free, or cancels them at its deadline).
    pub fn unfinished(&self) -> u64 {
        self.waiting + self.in_flight()
    }

    fn slot(&mut self, phase: Phase) -> &mut u64 {
        match phase {
            Phase::Waiting => &mut self.waiting,
            Phase::Offered => &mut self.offered,
            Phase::Assigned => &mut self.assigned,
            Phase::Completed => &mut self.completed,
            Phase::Failed => &mut self.failed,
            Phase::Cancelled => &mut self.cancelled,
        }
    }
}

/// The router state machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Router {
    config: RouterConfig,
    requests: BTreeMap<RequestId, Entry>,
    index: Index,
}

/// Secondary indexes kept in step with `requests`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
struct Index {
    /// Current attempts in phase offered or assigned, by worker.
    in_flight: BTreeMap<WorkerId, BTreeSet<AssignmentId>>,
    /// Terminal records by collection time.
    expiry: BTreeSet<(Millis, RequestId)>,
    counts: RouterCounts,
}

impl Router {
    pub fn new(config: RouterConfig) -> Self {
        Router {
            config,
            requests: BTreeMap::new(),
            index: Index::default(),
        }
    }

    /// The single entry point: apply `input` at logical time `now`.
    #[must_use = "the effects are what the state machine decided: carry them out"]
    pub fn handle(&mut self, now: Millis, input: RouterInput) -> Vec<RouterEffect> {
        let mut out = Vec::new();
        self.collect_garbage(now, &mut out);
        match input {
            RouterInput::Submit {
                request,
                candidates,
                deadline,
            } => self.on_new(now, request, candidates, deadline, false, &mut out),
            RouterInput::Hold {
                request,
                candidates,
                deadline,
            } => self.on_new(now, request, candidates, deadline, true, &mut out),
            RouterInput::Release {
                request,
                candidates,
            } => self.on_release(now, &request, candidates, &mut out),
            RouterInput::Cancel { request } => self.on_cancel(now, &request, &mut out),
            RouterInput::OfferResult {
                assignment,
                worker_epoch,
                accepted,
                reason,
            } => self.on_offer_result(now, &assignment, worker_epoch, accepted, reason, &mut out),
            RouterInput::Token {
                assignment,
                token,
                index,
            } => self.on_token(now, &assignment, token, index, &mut out),
            RouterInput::Result { assignment, result } => {
                self.on_result(now, &assignment, result, &mut out)
            }
            RouterInput::WorkerUnavailable { worker, assignment } => {
                self.on_unavailable(now, &worker, &assignment, &mut out)
            }
            RouterInput::OfferTimeout { assignment } => {
                self.on_offer_timeout(now, &assignment, &mut out)
            }
            RouterInput::DeadlineExpired { request } => self.on_deadline(now, &request, &mut out),
            RouterInput::Tick => {}
        }
        out
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// The phase of a known request.
    pub fn phase(&self, request: &RequestId) -> Option<Phase> {
        self.requests.get(request).map(|e| e.phase)
    }

    /// The current (latest) assignment of a request, if an offer was ever made.
    pub fn assignment(&self, request: &RequestId) -> Option<&AssignmentId> {
        self.requests.get(request)?.assignment.as_ref()
    }

    /// The worker of the current attempt.
    pub fn current_worker(&self, request: &RequestId) -> Option<&WorkerId> {
        self.requests.get(request)?.current_worker()
    }

    /// Tokens delivered to the client so far.
    pub fn delivered(&self, request: &RequestId) -> Option<u32> {
        self.requests.get(request).map(|e| e.delivered)
    }

    /// Current attempts (offered or assigned) on `worker`, in id order.
    pub fn in_flight_on(&self, worker: &WorkerId) -> impl Iterator<Item = &AssignmentId> {
        self.index.in_flight.get(worker).into_iter().flatten()
    }

    /// The inputs a transport feeds back when it loses `worker` (spec §5.4 detach).
    pub fn unavailable_inputs(&self, worker: &WorkerId) -> Vec<RouterInput> {
        self.in_flight_on(worker)
            .map(|a| RouterInput::WorkerUnavailable {
                worker: worker.clone(),
                assignment: a.clone(),
            })
            .collect()
    }

    /// The decision record of a known request.
    pub fn record(&self, request: &RequestId) -> Option<&DecisionRecord> {
        self.requests.get(request).map(|e| &e.record)
    }

    /// Every record held, in request id order.
    pub fn records(&self) -> impl Iterator<Item = &DecisionRecord> {
        self.requests.values().map(|e| &e.record)
    }

    /// Requests held, by phase.
    pub fn counts(&self) -> RouterCounts {
        self.index.counts
    }

    /// Number of requests held (live and retained terminal ones).
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}

impl Default for Router {
    fn default() -> Self {
        Router::new(RouterConfig::default())
    }
}
