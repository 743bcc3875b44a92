//! The deterministic simulator (spec §7.1) of the real router and worker machines. Not the
//! fleet study's policy-comparison replay (`den-fleet`, module `replay`), which models
//! workers of its own and shares only the estimate.
//!
//! A [`Simulation`] is a plain value (`Clone + PartialEq + Serialize`): logical time in
//! integer milliseconds, an event queue ordered by `(due, seq)`, the production
//! [`Router`] and one production [`Worker`] over abstract [`Counters`] per worker (ordered
//! by id), the client deliveries, a trace, paused workers and blocked directed links.
//! There is no special path: messages are the wire types the agent sends, and every
//! router and worker step goes through `handle`.
//!
//! Model:
//! - router → worker and worker → router messages arrive after `network_delay`; a blocked
//!   directed link drops them on delivery (traced); a paused worker's deliveries wait for
//!   the next tick; one-shot link faults drop, delay or duplicate the next message;
//! - offer and deadline timers fire at the time the router asked for; cancelled timers
//!   are removed (so a quiet simulation has nothing left to happen);
//! - operations take their declared cost, rounded up to whole ticks (§7.1):
//!   restore `max(queue, load) + gpu_restore`; prefill `(gpu or nothing cached ?
//!   max(queue, load) : 0) + missing × prefill/token`; decode (started, or continuing a
//!   prefill from when its `Prefilled` reaches the worker) streams token `i` at
//!   `first_token + i × decode_ms_per_token` and returns the result with the last token
//!   (tokens: the request's simulated output, else `1_000_000 + i`, at most `max_new`);
//!   all simulated operations succeed; a cancelled operation still runs to its end
//!   (the worker releases its pages when it returns);
//! - `crash` applies the worker crash and then, like an omniscient transport, reports
//!   every current attempt on that worker to the router as unavailable (sorted by id).

mod demo;
mod faults;
mod narrate;
mod queue;
mod step;
mod trace;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use crate::candidate::Candidate;
use crate::ids::{AssignmentId, Epoch, ModelFingerprint, RequestId, WorkerId};
use crate::request::{GenerationRequest, Token};
use crate::router::{Delivery, DeliveryKind, Router, RouterConfig, RouterInput};
use crate::time::Millis;
use crate::worker::{Counters, Operation, Worker};

pub use demo::{demo, sim7_routing_view, sim7_worker};
pub use narrate::narrate;
pub use queue::SimEvent;
pub use trace::{Endpoint, Fault, TraceEntry, TraceEvent};

use queue::EventQueue;
use trace::LinkFault;

/// Simulator settings (integers are ticks of 1 ms).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimConfig {
    pub network_delay: u64,
    pub offer_timeout: u64,
    /// Time between streamed tokens; 0 streams every token with the first one.
    pub decode_ms_per_token: f64,
    /// Deadline of a request submitted without one.
    pub deadline_ms: u64,
    /// How long the router keeps terminal records.
    pub retention_ms: u64,
    /// Record the trace (off for throughput benchmarks).
    pub trace: bool,
    /// Guard against zero-delay loops.
    pub max_deliveries_per_tick: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            network_delay: 1,
            offer_timeout: 10,
            decode_ms_per_token: 0.0,
            deadline_ms: 10_000,
            retention_ms: 300_000,
            trace: true,
            max_deliveries_per_tick: 10_000,
        }
    }
}

/// One delivery to a client, with the time it happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response {
    pub at: Millis,
    #[serde(flatten)]
    pub delivery: Delivery,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error(
        "livelock at {at}: more than {limit} deliveries in one tick; a zero-delay loop never lets time advance"
    )]
    Livelock { at: Millis, limit: usize },
}

/// A deterministic simulation of one router and its workers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Simulation {
    config: SimConfig,
    now: Millis,
    router: Router,
    workers: BTreeMap<WorkerId, Worker<Counters>>,
    queue: EventQueue,
    responses: Vec<Response>,
    /// Index of each request's terminal response (derived).
    #[serde(skip)]
    terminal: BTreeMap<RequestId, usize>,
    trace: Vec<TraceEntry>,
    paused: BTreeSet<WorkerId>,
    blocked: BTreeSet<(Endpoint, Endpoint)>,
    link_faults: Vec<LinkFault>,
    /// Prefills whose decode starts when their `Prefilled` is delivered: the device's
    /// events reach its worker in order, which a paused worker's re-queued events would
    /// not keep if the decode's were queued up front.
    chained: BTreeMap<AssignmentId, Operation>,
    /// Events delivered so far.
    delivered: u64,
    /// Deliveries at the current time (livelock guard).
    deliveries_this_tick: usize,
}

impl Simulation {
    pub fn new(config: SimConfig) -> Self {
        let router = Router::new(RouterConfig {
            offer_timeout_ms: config.offer_timeout.max(1),
            default_deadline_ms: config.deadline_ms,
            retention_ms: config.retention_ms,
            ..RouterConfig::default()
        });
        Simulation {
            config,
            now: Millis::ZERO,
            router,
            workers: BTreeMap::new(),
            queue: EventQueue::default(),
            responses: Vec::new(),
            terminal: BTreeMap::new(),
            trace: Vec::new(),
            paused: BTreeSet::new(),
            blocked: BTreeSet::new(),
            link_faults: Vec::new(),
            chained: BTreeMap::new(),
            delivered: 0,
            deliveries_this_tick: 0,
        }
    }

    /// Add a worker at epoch 0 serving `models` with `capacity`.
    pub fn add_worker<M: Into<ModelFingerprint>>(
        &mut self,
        id: impl Into<WorkerId>,
        models: impl IntoIterator<Item = M>,
        capacity: Counters,
    ) -> &mut Self {
        let models = models.into_iter().map(Into::into);
        let worker = Worker::new(id, Epoch(0), models, capacity);
        self.workers.insert(worker.id().clone(), worker);
        self
    }

    /// Add a prepared worker (another epoch, another configuration).
    pub fn add_prepared_worker(&mut self, worker: Worker<Counters>) -> &mut Self {
        self.workers.insert(worker.id().clone(), worker);
        self
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    pub fn now(&self) -> Millis {
        self.now
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    pub fn worker(&self, id: &WorkerId) -> Option<&Worker<Counters>> {
        self.workers.get(id)
    }

    pub fn workers(&self) -> impl Iterator<Item = &Worker<Counters>> {
        self.workers.values()
    }

    /// Submit a request now, with the default deadline.
    pub fn submit(&mut self, request: GenerationRequest, candidates: Vec<Candidate>) {
        self.router_step(RouterInput::Submit {
            request: Arc::new(request),
            candidates,
            deadline: None,
        });
    }

    /// Submit a request now with an absolute deadline.
    pub fn submit_with_deadline(
        &mut self,
        request: GenerationRequest,
        candidates: Vec<Candidate>,
        deadline: Millis,
    ) {
        self.router_step(RouterInput::Submit {
            request: Arc::new(request),
            candidates,
            deadline: Some(deadline),
        });
    }

    /// The client cancels a request now.
    pub fn cancel(&mut self, request: &RequestId) {
        self.router_step(RouterInput::Cancel {
            request: request.clone(),
        });
    }

    /// Advance `ticks` of logical time, delivering everything due on the way.
    pub fn run(&mut self, ticks: u64) -> Result<(), SimError> {
        let end = self.now + ticks;
        self.step_until(end, |_| false)?;
        self.now = end;
        Ok(())
    }

    /// Run until `request` has a terminal response or `max_ticks` pass.
    pub fn run_until_response(
        &mut self,
        request: &RequestId,
        max_ticks: u64,
    ) -> Result<Option<&Response>, SimError> {
        let end = self.now + max_ticks;
        if !self.terminal.contains_key(request) {
            let found = self.step_until(end, |s| s.terminal.contains_key(request))?;
            if !found {
                self.now = end;
            }
        }
        Ok(self.response(request))
    }

    /// Run until nothing is left to happen or `max_ticks` pass; true when quiet.
    pub fn run_until_quiet(&mut self, max_ticks: u64) -> Result<bool, SimError> {
        let end = self.now + max_ticks;
        self.step_until(end, |_| false)?;
        Ok(self.quiet())
    }

    /// Nothing is in flight and no timer is pending.
    pub fn quiet(&self) -> bool {
        self.queue.is_empty()
    }

    /// Events waiting, by due time.
    pub fn pending(&self) -> Vec<(Millis, &SimEvent)> {
        self.queue
            .pending()
            .into_iter()
            .map(|(due, _, e)| (due, e))
            .collect()
    }

    pub fn pending_len(&self) -> usize {
        self.queue.len()
    }

    /// The terminal response (completed, error or cancelled) of a request.
    pub fn response(&self, request: &RequestId) -> Option<&Response> {
        self.terminal
            .get(request)
            .and_then(|i| self.responses.get(*i))
    }

    /// Every delivery, in order.
    pub fn responses(&self) -> &[Response] {
        &self.responses
    }

    /// Every delivery to one request, in order.
    pub fn deliveries<'a>(&'a self, request: &'a RequestId) -> impl Iterator<Item = &'a Response> {
        self.responses
            .iter()
            .filter(move |r| &r.delivery.request == request)
    }

    /// The tokens streamed to one request, in delivery order.
    pub fn streamed(&self, request: &RequestId) -> Vec<(u32, Token)> {
        self.deliveries(request)
            .filter_map(|r| match r.delivery.kind {
                DeliveryKind::Delta { token, index } => Some((index, token)),
                _ => None,
            })
            .collect()
    }

    pub fn trace(&self) -> &[TraceEntry] {
        &self.trace
    }

    /// The trace as JSON (byte-identical for equal inputs).
    pub fn trace_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(&self.trace)
    }

    /// Events delivered since the start.
    pub fn events_delivered(&self) -> u64 {
        self.delivered
    }

    /// Deliver events due up to `end` until `stop` says so; true when stopped.
    fn step_until(&mut self, end: Millis, stop: impl Fn(&Self) -> bool) -> Result<bool, SimError> {
        while let Some(due) = self.queue.next_due() {
            if due > end {
                break;
            }
            if due > self.now {
                self.now = due;
                self.deliveries_this_tick = 0;
            }
            self.deliveries_this_tick += 1;
            if self.deliveries_this_tick > self.config.max_deliveries_per_tick {
                return Err(SimError::Livelock {
                    at: self.now,
                    limit: self.config.max_deliveries_per_tick,
                });
            }
            let Some((_, event)) = self.queue.pop() else {
                break;
            };
            self.delivered += 1;
            self.deliver(event);
            if stop(self) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
