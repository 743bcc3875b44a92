//! The router node: every routing decision a den router makes, in one pure machine.
//!
//! It composes the router state machine ([`crate::router`]), discovery
//! ([`crate::discovery`]), the chunk catalog, the candidate builder
//! ([`crate::candidate_generation`]), the work offered since each worker's last heartbeat
//! ([`inflight`]), speculative GPU prefixes ([`speculation`]), pinning to a placed
//! instance's worker, the fast fallback for offers to a worker without a live route, and
//! sender fencing (a worker speaks only for itself, and only about its current
//! assignments), and the queue of requests waiting for KV pages ([`waiting`]). One entry point, [`RouterNode::handle`]`(now, input) -> effects`; the
//! runtime (den-agent's router actor) only moves bytes, keeps timers and channels, and
//! turns the [`Count`] effects into metrics. Tests drive it directly.

mod effects;
pub mod inflight;
pub mod speculation;
pub mod waiting;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::candidate::Candidate;
use crate::candidate::{Tier, added_work_ms};
use crate::candidate_generation::candidates_for;
use crate::chunk_catalog::ChunkCatalog;
use crate::decision::DecisionEvent;
use crate::discovery::{
    ConnectionId, DetachReason, Discovery, DiscoveryEffect, DiscoveryInput, Observed,
};
use crate::ids::{AssignmentId, HeartbeatVersion, NodeId, RequestId, WorkerId};
use crate::request::GenerationRequest;
use crate::router::{
    Delivery, DeliveryKind, LocalRouterEffect, Router, RouterConfig, RouterEffect, RouterInput,
};
use crate::time::Millis;
use crate::wire::{OutboundToWorker, RouterMessage, ToRouter, WorkerMessage};

use inflight::Unreflected;
use speculation::Speculation;
use waiting::Waiting;

/// How many requests may wait for KV pages by default ([`waiting`]).
pub const DEFAULT_MAX_WAITING: usize = 1024;

/// The node's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    pub router: RouterConfig,
    pub heartbeat_timeout_ms: u64,
    /// Tokens per chunk of the prefix chain (the workers' and the catalog's).
    pub chunk_size: u32,
    /// Requests that may wait for KV pages at once ([`waiting`]); 0: none, every
    /// request without a feasible candidate fails at once (spec §2).
    pub max_waiting: usize,
}

/// Where a request may be offered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Pin {
    /// Any worker serving its model.
    #[default]
    Any,
    /// Only this worker (a placed instance's).
    Worker(WorkerId),
    /// The pinned instance has no worker now: nothing is feasible.
    Nowhere,
}

/// What a timer is for (one live timer per key).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerKey {
    Offer(AssignmentId),
    Deadline(RequestId),
    Expiry(WorkerId),
}

/// A timer the node asked for, handed back when it fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timer {
    Offer(AssignmentId),
    Deadline(RequestId),
    Expiry {
        worker: WorkerId,
        connection: ConnectionId,
        version: HeartbeatVersion,
    },
}

impl Timer {
    pub fn key(&self) -> TimerKey {
        match self {
            Timer::Offer(a) => TimerKey::Offer(a.clone()),
            Timer::Deadline(r) => TimerKey::Deadline(r.clone()),
            Timer::Expiry { worker, .. } => TimerKey::Expiry(worker.clone()),
        }
    }
}

/// Inputs to [`RouterNode::handle`].
#[derive(Debug, Clone, PartialEq)]
pub enum NodeInput {
    Submit {
        request: Arc<GenerationRequest>,
        /// Absolute deadline; `None`: the router's default.
        deadline: Option<Millis>,
        pin: Pin,
    },
    Cancel {
        request: RequestId,
    },
    /// A worker connection finished its handshake (the runtime checked hello).
    Connected {
        conn: ConnectionId,
        worker: WorkerId,
        node: NodeId,
    },
    /// A decoded frame from a connection.
    Frame {
        conn: ConnectionId,
        frame: ToRouter,
    },
    Disconnected {
        conn: ConnectionId,
    },
    /// A frame for `worker` could not be queued on `conn` (the worker does not read).
    SendFailed {
        conn: ConnectionId,
        worker: WorkerId,
    },
    TimerFired(Timer),
    /// Periodic housekeeping (record retention).
    Tick,
}

/// What the runtime counts (as metrics) or logs; no decision depends on them.
#[derive(Debug, Clone, PartialEq)]
pub enum Count {
    /// A frame of this type arrived from a worker.
    FrameReceived(&'static str),
    /// A newer observation was stored.
    HeartbeatAccepted,
    HeartbeatIgnored {
        worker: WorkerId,
        version: HeartbeatVersion,
        why: Observed,
    },
    /// A worker message ignored as late, duplicate or not for the current attempt.
    Fenced(&'static str),
    /// An offer to a worker with no live route, failed at once.
    OfferWithoutRoute,
    OfferTimeout,
}

/// Effects of [`RouterNode::handle`], in order.
#[derive(Debug, Clone, PartialEq)]
#[must_use = "an effect is a decision to carry out, not a value to drop"]
pub enum NodeEffect {
    /// Queue this frame on the connection; if that fails, hand back
    /// [`NodeInput::SendFailed`].
    Send {
        conn: ConnectionId,
        frame: OutboundToWorker,
    },
    /// Send `refused` with this one-line detail, then close the connection.
    Refuse {
        conn: ConnectionId,
        detail: String,
    },
    SetTimer {
        timer: Timer,
        at: Millis,
    },
    CancelTimer(TimerKey),
    /// To the request's client.
    Deliver(Delivery),
    Decision(DecisionEvent),
    /// The registry holds a newer observation of this worker.
    WorkerUpdated(WorkerId),
    WorkerDetached {
        worker: WorkerId,
        connection: ConnectionId,
        reason: DetachReason,
    },
    Count(Count),
}

/// One live worker connection.
#[derive(Debug, Clone, PartialEq)]
struct Peer {
    worker: WorkerId,
    node: NodeId,
}

/// The composed router (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct RouterNode {
    chunk_size: u32,
    router: Router,
    discovery: Discovery,
    catalog: ChunkCatalog,
    speculation: Speculation,
    unreflected: Unreflected,
    peers: BTreeMap<ConnectionId, Peer>,
    /// Requests not yet terminal (for the speculative prefix of a completed one).
    live: BTreeMap<RequestId, Arc<GenerationRequest>>,
    /// Router inputs produced while interpreting effects, handled before returning.
    pending: VecDeque<RouterInput>,
    /// Requests waiting for KV pages.
    waiting: Waiting,
    /// A heartbeat or a detach may have made room: examine the waiting requests.
    rescan: bool,
    /// A worker left: a waiting request may no longer be servable anywhere, so examine
    /// every one, even those no worker has the room for.
    recheck: bool,
}

impl RouterNode {
    pub fn new(config: NodeConfig) -> Self {
        RouterNode {
            chunk_size: config.chunk_size,
            router: Router::new(config.router),
            discovery: Discovery::new(config.heartbeat_timeout_ms),
            catalog: ChunkCatalog::default(),
            speculation: Speculation::default(),
            unreflected: Unreflected::default(),
            peers: BTreeMap::new(),
            live: BTreeMap::new(),
            pending: VecDeque::new(),
            waiting: Waiting::new(config.max_waiting),
            rescan: false,
            recheck: false,
        }
    }

    /// The requests waiting for KV pages, oldest first.
    pub fn waiting(&self) -> &Waiting {
        &self.waiting
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    pub fn discovery(&self) -> &Discovery {
        &self.discovery
    }

    pub fn catalog(&self) -> &ChunkCatalog {
        &self.catalog
    }

    /// The connection a worker is reachable on: its discovery route, else (before its
    /// first heartbeat) the newest connection it said hello on.
    pub fn conn_of(&self, worker: &WorkerId) -> Option<ConnectionId> {
        self.discovery.route(worker).or_else(|| {
            self.peers
                .iter()
                .rev()
                .find(|(_, p)| &p.worker == worker)
                .map(|(id, _)| *id)
        })
    }

    /// The worker that said hello on `conn`.
    pub fn peer(&self, conn: ConnectionId) -> Option<(&WorkerId, &NodeId)> {
        self.peers.get(&conn).map(|p| (&p.worker, &p.node))
    }

    /// Work offered to `worker` that its last heartbeat does not show, ms (negative:
    /// work that finished since).
    pub fn unreflected_ms(&self, worker: &WorkerId) -> f64 {
        self.unreflected.extra_ms(worker)
    }

    /// The single entry point: apply `input` at logical time `now`.
    pub fn handle(&mut self, now: Millis, input: NodeInput) -> Vec<NodeEffect> {
        let mut out = Vec::new();
        self.handle_into(now, input, &mut out);
        out
    }

    /// [`handle`](Self::handle), appending the effects to `out` (a runtime reuses one
    /// buffer: the router takes a heartbeat per worker per interval).
    pub fn handle_into(&mut self, now: Millis, input: NodeInput, out: &mut Vec<NodeEffect>) {
        match input {
            NodeInput::Submit {
                request,
                deadline,
                pin,
            } => self.submit(now, request, deadline, pin),
            NodeInput::Cancel { request } => {
                self.pending.push_back(RouterInput::Cancel { request })
            }
            NodeInput::Connected { conn, worker, node } => {
                self.peers.insert(conn, Peer { worker, node });
            }
            NodeInput::Frame { conn, frame } => self.frame(now, conn, frame, out),
            NodeInput::Disconnected { conn } => {
                // Detach first: it needs the connection's node to drop its replicas.
                let effects = self
                    .discovery
                    .handle(now, DiscoveryInput::Disconnected { connection: conn });
                self.apply_discovery(effects, out);
                if let Some(peer) = self.peers.remove(&conn) {
                    self.unreflected.forget(&peer.worker);
                }
            }
            NodeInput::SendFailed { conn, worker } => {
                let effects = self.discovery.handle(
                    now,
                    DiscoveryInput::SendFailed {
                        connection: conn,
                        worker,
                    },
                );
                self.apply_discovery(effects, out);
            }
            NodeInput::TimerFired(timer) => self.timer(now, timer, out),
            NodeInput::Tick => self.pending.push_back(RouterInput::Tick),
        }
        self.drain(now, out);
        if std::mem::take(&mut self.rescan) {
            let every = std::mem::take(&mut self.recheck);
            self.admit_waiting(now, every, out);
        }
    }

    fn submit(
        &mut self,
        now: Millis,
        request: Arc<GenerationRequest>,
        deadline: Option<Millis>,
        pin: Pin,
    ) {
        if self.router.record(&request.id).is_some() {
            return; // a duplicate submit is ignored (spec §2.4)
        }
        self.live.insert(request.id.clone(), Arc::clone(&request));
        let candidates = self.candidates(&request, &pin);
        // Nothing newer than the oldest waiting request is offered where it waits.
        let (usable, held): (Vec<Candidate>, Vec<Candidate>) = match self.waiting.reserved() {
            Some(w) => candidates.into_iter().partition(|c| &c.worker_id != w),
            None => (candidates, Vec::new()),
        };
        if self.park(now, &request, deadline, &pin, &usable, &held) {
            return;
        }
        self.pending.push_back(RouterInput::Submit {
            request,
            candidates: usable,
            deadline,
        });
    }

    /// `request`'s candidates now: pinned, each worker's queue and free pages less what
    /// its last heartbeat does not show of the work offered there.
    fn candidates(&self, request: &GenerationRequest, pin: &Pin) -> Vec<Candidate> {
        let amended = self.speculation.amended(self.discovery.registry());
        let mut candidates = candidates_for(
            request,
            self.chunk_size,
            amended.iter().map(|o| o.as_ref()),
            &self.catalog,
        );
        match pin {
            Pin::Any => {}
            Pin::Worker(w) => candidates.retain(|c| &c.worker_id == w),
            Pin::Nowhere => candidates.clear(),
        }
        // Per candidate, so a busy router clones no observation for it; a worker's
        // candidates come together, so its ledger is read once.
        let mut ledger: Option<(WorkerId, (f64, u64))> = None;
        for c in &mut candidates {
            let (extra_ms, extra_pages) = match &ledger {
                Some((w, extra)) if *w == c.worker_id => *extra,
                _ => {
                    let extra = self.unreflected.extra(&c.worker_id);
                    ledger = Some((c.worker_id.clone(), extra));
                    extra
                }
            };
            if extra_ms != 0.0 {
                c.queue_ms = (c.queue_ms + extra_ms).max(0.0);
            }
            if extra_pages > 0 {
                let from_free = extra_pages.min(u64::from(c.free_pages));
                c.free_pages -= from_free as u32;
                let rest = (extra_pages - from_free).min(u64::from(c.evictable_pages));
                c.evictable_pages -= rest as u32;
            }
        }
        candidates
    }

    fn frame(
        &mut self,
        now: Millis,
        conn: ConnectionId,
        frame: ToRouter,
        out: &mut Vec<NodeEffect>,
    ) {
        let Some(peer) = self.peers.get(&conn) else {
            return; // the connection ended meanwhile
        };
        let (sender, node) = (peer.worker.clone(), peer.node.clone());
        out.push(NodeEffect::Count(Count::FrameReceived(frame.kind())));
        match frame {
            ToRouter::Hello(_) => {
                // The runtime answers hello itself and refuses a second one.
            }
            ToRouter::Heartbeat(hb) => {
                if hb.observation.worker_id != sender {
                    out.push(NodeEffect::Refuse {
                        conn,
                        detail: format!(
                            "heartbeat for worker {} on the connection of worker {sender}",
                            hb.observation.worker_id
                        ),
                    });
                    return;
                }
                let version = hb.observation.version();
                let effects = self.discovery.handle(
                    now,
                    DiscoveryInput::Heartbeat {
                        connection: conn,
                        observation: Box::new(hb.observation),
                    },
                );
                self.apply_discovery(effects, out);
                let accepted = self
                    .discovery
                    .registry()
                    .get(&sender)
                    .is_some_and(|o| o.version() == version);
                if accepted {
                    self.unreflected.heartbeat(&sender);
                    // Only more room than the waiting requests were last examined
                    // against can let one in (every worker heartbeats every interval).
                    if !self.waiting.is_empty() {
                        let room = self.room(&sender);
                        self.rescan |= self.waiting.more_room(&sender, room);
                    }
                }
            }
            ToRouter::OfferResult(m) => {
                self.unreflected
                    .answered(&sender, &m.assignment, m.accepted);
                self.worker_message(now, &sender, WorkerMessage::OfferResult(m), out);
            }
            ToRouter::Token(m) => self.worker_message(now, &sender, WorkerMessage::Token(m), out),
            ToRouter::Result(m) => self.worker_message(now, &sender, WorkerMessage::Result(m), out),
            ToRouter::Publish(p) => {
                for c in p.chunks {
                    for tier in &c.tiers {
                        self.catalog.add_replica(
                            node.clone(),
                            c.entry.model.clone(),
                            c.entry.hash,
                            *tier,
                        );
                    }
                    self.catalog.publish(c.entry);
                }
            }
            ToRouter::Retract(r) => {
                for c in r.chunks {
                    if c.tier == Tier::Object {
                        self.catalog.withdraw_object(&c.model, c.hash);
                    } else {
                        self.catalog.remove_replica(&node, &c.model, c.hash, c.tier);
                    }
                }
            }
        }
    }

    /// A worker message reaches the router machine only from the worker the
    /// assignment's current attempt is on; what the machine ignores is counted as fenced.
    fn worker_message(
        &mut self,
        now: Millis,
        sender: &WorkerId,
        message: WorkerMessage,
        out: &mut Vec<NodeEffect>,
    ) {
        let kind = message.kind();
        if self.router.current_worker(&message.assignment().request) != Some(sender) {
            out.push(NodeEffect::Count(Count::Fenced(kind)));
            return;
        }
        let effects = self.router.handle(now, message.into());
        if effects.is_empty() {
            out.push(NodeEffect::Count(Count::Fenced(kind)));
        }
        self.apply_router(effects, out);
    }

    fn timer(&mut self, now: Millis, timer: Timer, out: &mut Vec<NodeEffect>) {
        match timer {
            Timer::Offer(assignment) => {
                out.push(NodeEffect::Count(Count::OfferTimeout));
                self.unreflected.withdrawn(&assignment);
                self.pending
                    .push_back(RouterInput::OfferTimeout { assignment });
            }
            // A waiting request's deadline too: the router machine holds its record,
            // and its terminal delivery takes it out of the queue (`delivered`).
            Timer::Deadline(request) => self
                .pending
                .push_back(RouterInput::DeadlineExpired { request }),
            Timer::Expiry {
                worker,
                connection,
                version,
            } => {
                let effects = self.discovery.handle(
                    now,
                    DiscoveryInput::ExpiryFired {
                        worker,
                        connection,
                        version,
                    },
                );
                self.apply_discovery(effects, out);
            }
        }
    }
}

#[cfg(test)]
mod tests;
