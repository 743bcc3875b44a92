//! The router actor: the one task that owns the router state machine, discovery, the
//! chunk catalog and the timer wheel, and interprets their effects (spec §2.8b, §5.4).
//!
//! - **Time.** `now` is milliseconds since the actor started; timers are kept in a
//!   [`TimerWheel`] and the select loop sleeps until the earliest one.
//! - **Sending.** A frame for a worker goes to the outbound queue of the connection its
//!   newest accepted heartbeat arrived on. A full or closed queue is a send failure: the
//!   worker is detached. An *offer* to a worker with no live route fails at once (the
//!   machine gets `WorkerUnavailable` before anything else happens), instead of waiting
//!   for the offer timer; a cancel to such a worker is dropped.
//! - **Detach** (expiry, disconnect, send failure — only by the connection that holds the
//!   route): every request whose current attempt is on the worker gets
//!   `WorkerUnavailable`; the worker's node loses its catalog replicas.
//! - **Delivery.** Each request has a bounded channel (`serving::DELIVERY_QUEUE`); a full
//!   or closed one means a slow or vanished client: the request is cancelled.
//! - **Fencing is the machine's.** Worker messages for an assignment not on the sending
//!   worker are dropped before the machine; messages the machine ignores (late, duplicate,
//!   fenced) are counted in `den_router_fenced_total`.
//! - **Feed.** Decision events mark records dirty; dirty records are sent as `route`
//!   frames after each batch of commands (so bursts coalesce); a full snapshot repeats
//!   every `snapshot_interval`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, oneshot};

use den_protocol::candidate::Tier;
use den_protocol::candidates::{Catalog, candidates_for};
use den_protocol::decision::{
    AttemptOutcome, DecisionEvent, DecisionEventKind, DecisionRecord, TerminalOutcome,
};
use den_protocol::discovery::{ConnectionId, Discovery, DiscoveryEffect, DiscoveryInput};
use den_protocol::feed::{FEED_VERSION, FeedMessage, encode as encode_feed};
use den_protocol::ids::{NodeId, RequestId, WorkerId};
use den_protocol::observation::Observation;
use den_protocol::request::GenerationRequest;
use den_protocol::router::{
    Delivery, DeliveryKind, LocalRouterEffect, Router, RouterConfig, RouterEffect, RouterInput,
};
use den_protocol::time::Millis;
use den_protocol::wire::{
    Control, ControlToWorker, RouterMessage, ToRouter, WorkerMessage, encode,
};

use crate::metrics::{LATENCY_MS_BUCKETS, Metrics};
use crate::router::Shared;
use crate::router::timers::{Fired, TimerKey, TimerWheel};
use crate::serving::ServedModel;

/// What a connection task writes to its socket.
#[derive(Debug)]
pub enum Outbound {
    Frame(String),
    /// Send this `refused` frame, then close.
    Close(String),
}

/// Everything that reaches the actor.
pub enum Command {
    Submit {
        request: Arc<GenerationRequest>,
        deliveries: mpsc::Sender<Delivery>,
        deadline: Option<Duration>,
    },
    Cancel {
        request: RequestId,
    },
    /// A worker connection finished its handshake.
    Connected {
        conn: ConnectionId,
        worker: WorkerId,
        node: NodeId,
        outbound: mpsc::Sender<Outbound>,
    },
    Frame {
        conn: ConnectionId,
        frame: ToRouter,
    },
    Disconnected {
        conn: ConnectionId,
    },
    Drain {
        worker: WorkerId,
        draining: bool,
        reply: oneshot::Sender<bool>,
    },
    /// A console subscribes: the reply carries `hello` and a snapshot, then the stream.
    Subscribe {
        reply: oneshot::Sender<(Vec<Arc<str>>, broadcast::Receiver<Arc<str>>)>,
    },
    /// A fresh snapshot frame (for a console that fell behind).
    Snapshot {
        reply: oneshot::Sender<Arc<str>>,
    },
    Workers {
        reply: oneshot::Sender<Vec<Observation>>,
    },
    Record {
        request: RequestId,
        reply: oneshot::Sender<Option<DecisionRecord>>,
    },
    Shutdown {
        drain: Duration,
        reply: oneshot::Sender<()>,
    },
}

struct ConnInfo {
    worker: WorkerId,
    node: NodeId,
    outbound: mpsc::Sender<Outbound>,
}

struct DeliveryState {
    tx: mpsc::Sender<Delivery>,
    last_delta: Option<Instant>,
}

pub struct RouterActor {
    shared: Arc<Shared>,
    router: Router,
    discovery: Discovery,
    catalog: Catalog,
    timers: TimerWheel,
    conns: BTreeMap<ConnectionId, ConnInfo>,
    deliveries: BTreeMap<RequestId, DeliveryState>,
    /// Inputs produced while interpreting effects, handled before the next command.
    pending: VecDeque<RouterInput>,
    /// Records changed since the last feed flush.
    dirty: BTreeSet<RequestId>,
    started: Instant,
    shutdown: Option<(Instant, oneshot::Sender<()>)>,
    cancelled_for_shutdown: bool,
}

impl RouterActor {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        let o = &shared.opts;
        let config = RouterConfig {
            offer_timeout_ms: ms(o.offer_timeout),
            default_deadline_ms: ms(o.request_deadline),
            retention_ms: ms(o.retention),
        };
        let discovery = Discovery::new(ms(o.heartbeat_timeout));
        RouterActor {
            router: Router::new(config),
            discovery,
            catalog: Catalog::default(),
            timers: TimerWheel::default(),
            conns: BTreeMap::new(),
            deliveries: BTreeMap::new(),
            pending: VecDeque::new(),
            dirty: BTreeSet::new(),
            started: Instant::now(),
            shutdown: None,
            cancelled_for_shutdown: false,
            shared,
        }
    }

    fn now(&self) -> Millis {
        Millis(u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    pub(crate) async fn run(mut self, mut inbox: mpsc::Receiver<Command>) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut snapshot = tokio::time::interval(
            self.shared
                .opts
                .snapshot_interval
                .max(Duration::from_millis(100)),
        );
        loop {
            let wake = self.timers.next_due().map(|at| {
                tokio::time::Instant::from_std(self.started + Duration::from_millis(at.0))
            });
            tokio::select! {
                cmd = inbox.recv() => {
                    let Some(cmd) = cmd else { break };
                    self.on_command(cmd);
                    // Take what else is waiting before flushing the feed: bursts coalesce.
                    for _ in 0..256 {
                        match inbox.try_recv() {
                            Ok(cmd) => self.on_command(cmd),
                            Err(_) => break,
                        }
                    }
                }
                _ = sleep_until(wake), if wake.is_some() => self.fire_timers(),
                _ = tick.tick() => {
                    self.drive(RouterInput::Tick);
                    self.export_gauges();
                }
                _ = snapshot.tick() => {
                    if self.shared.feed.receiver_count() > 0 {
                        let frame = self.snapshot_frame();
                        let _ = self.shared.feed.send(frame);
                    }
                }
            }
            self.flush_feed();
            if self.shutdown_done() {
                break;
            }
        }
        for conn in self.conns.values() {
            let _ = conn
                .outbound
                .try_send(Outbound::Close("the router is shutting down".into()));
        }
        self.shared.closing.send_replace(true);
        if let Some((_, reply)) = self.shutdown.take() {
            let _ = reply.send(());
        }
    }

    /// During shutdown: true once nothing is in flight (cancelling what is left at the
    /// drain deadline).
    fn shutdown_done(&mut self) -> bool {
        let Some((deadline, _)) = &self.shutdown else {
            return false;
        };
        if self.router.counts().in_flight() == 0 {
            return true;
        }
        if Instant::now() >= *deadline && !self.cancelled_for_shutdown {
            self.cancelled_for_shutdown = true;
            let ids: Vec<RequestId> = self.deliveries.keys().cloned().collect();
            tracing::warn!(
                requests = ids.len(),
                "drain timeout: cancelling in-flight requests"
            );
            for request in ids {
                self.drive(RouterInput::Cancel { request });
            }
            self.flush_feed();
            return self.router.counts().in_flight() == 0;
        }
        false
    }

    // ---------------------------------------------------------------------------------
    // Commands
    // ---------------------------------------------------------------------------------

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                request,
                deliveries,
                deadline,
            } => {
                let candidates = candidates_for(
                    &request,
                    self.shared.opts.chunk_size,
                    self.discovery.registry().observations(),
                    &self.catalog,
                );
                let now = self.now();
                self.deliveries.insert(
                    request.id.clone(),
                    DeliveryState {
                        tx: deliveries,
                        last_delta: None,
                    },
                );
                self.drive(RouterInput::Submit {
                    request,
                    candidates,
                    deadline: deadline.map(|d| now + ms(d)),
                });
            }
            Command::Cancel { request } => self.drive(RouterInput::Cancel { request }),
            Command::Connected {
                conn,
                worker,
                node,
                outbound,
            } => {
                tracing::info!(%worker, %node, conn = conn.0, "worker connected");
                self.conns.insert(
                    conn,
                    ConnInfo {
                        worker,
                        node,
                        outbound,
                    },
                );
            }
            Command::Frame { conn, frame } => self.on_frame(conn, frame),
            Command::Disconnected { conn } => {
                if let Some(info) = self.conns.remove(&conn) {
                    tracing::info!(worker = %info.worker, conn = conn.0, "worker connection closed");
                }
                let effects = self.discovery.handle(
                    self.now(),
                    DiscoveryInput::Disconnected { connection: conn },
                );
                self.apply_discovery(effects);
            }
            Command::Drain {
                worker,
                draining,
                reply,
            } => {
                let frame = ControlToWorker {
                    to: worker.clone(),
                    control: Control::Drain { draining },
                };
                let sent = match (self.conn_of(&worker), encode(&frame)) {
                    (Some(conn), Ok(bytes)) => self.conns.get(&conn).is_some_and(|c| {
                        c.outbound
                            .try_send(Outbound::Frame(
                                String::from_utf8_lossy(&bytes).into_owned(),
                            ))
                            .is_ok()
                    }),
                    _ => false,
                };
                let _ = reply.send(sent);
            }
            Command::Subscribe { reply } => {
                let hello = FeedMessage::Hello {
                    feed_version: FEED_VERSION,
                    router: self.shared.opts.name.clone(),
                    started_at_unix_ms: self.shared.started_unix_ms,
                };
                let first = vec![Arc::from(encode_feed(&hello)), self.snapshot_frame()];
                let _ = reply.send((first, self.shared.feed.subscribe()));
            }
            Command::Snapshot { reply } => {
                let _ = reply.send(self.snapshot_frame());
            }
            Command::Workers { reply } => {
                let _ = reply.send(self.discovery.registry().observations().cloned().collect());
            }
            Command::Record { request, reply } => {
                let _ = reply.send(self.router.record(&request).cloned());
            }
            Command::Shutdown { drain, reply } => {
                self.shutdown = Some((Instant::now() + drain, reply));
            }
        }
    }

    /// The connection a worker is reachable on: its discovery route, else (before its
    /// first heartbeat) the connection it said hello on.
    fn conn_of(&self, worker: &WorkerId) -> Option<ConnectionId> {
        self.discovery.route(worker).or_else(|| {
            self.conns
                .iter()
                .rev()
                .find(|(_, c)| &c.worker == worker)
                .map(|(id, _)| *id)
        })
    }

    fn on_frame(&mut self, conn: ConnectionId, frame: ToRouter) {
        let Some(info) = self.conns.get(&conn) else {
            return; // the connection ended meanwhile
        };
        let sender = info.worker.clone();
        let node = info.node.clone();
        let m = &self.shared.metrics;
        let kind = match &frame {
            ToRouter::Hello(_) => "hello",
            ToRouter::Heartbeat(_) => "heartbeat",
            ToRouter::OfferResult(_) => "offer-result",
            ToRouter::Token(_) => "token",
            ToRouter::Result(_) => "result",
            ToRouter::Publish(_) => "publish",
            ToRouter::Retract(_) => "retract",
        };
        m.counter_add(
            "den_router_frames_received_total",
            "Frames received from workers, by type.",
            &[("type", kind)],
            1.0,
        );
        match frame {
            ToRouter::Hello(_) => {
                // The connection task answers hello itself and refuses a second one.
            }
            ToRouter::Heartbeat(hb) => {
                if hb.observation.worker_id != sender {
                    self.refuse(
                        conn,
                        format!(
                            "heartbeat for worker {} on the connection of worker {sender}",
                            hb.observation.worker_id
                        ),
                    );
                    return;
                }
                let effects = self.discovery.handle(
                    self.now(),
                    DiscoveryInput::Heartbeat {
                        connection: conn,
                        observation: Box::new(hb.observation),
                    },
                );
                self.apply_discovery(effects);
            }
            ToRouter::OfferResult(m) => self.worker_message(&sender, WorkerMessage::OfferResult(m)),
            ToRouter::Token(m) => self.worker_message(&sender, WorkerMessage::Token(m)),
            ToRouter::Result(m) => self.worker_message(&sender, WorkerMessage::Result(m)),
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

    /// A worker message for the machine, if it comes from the worker the assignment's
    /// current attempt is on.
    fn worker_message(&mut self, sender: &WorkerId, message: WorkerMessage) {
        let request = &message.assignment().request;
        if self.router.current_worker(request) != Some(sender) {
            self.fenced(message.kind());
            return;
        }
        let kind = message.kind();
        let effects = self.router.handle(self.now(), message.into());
        if effects.is_empty() {
            self.fenced(kind);
        }
        self.apply_router(effects);
        self.drain_pending();
    }

    fn fenced(&self, kind: &'static str) {
        self.metrics().counter_add(
            "den_router_fenced_total",
            "Worker messages ignored as late, duplicate or not for the current attempt.",
            &[("type", kind)],
            1.0,
        );
    }

    /// Refuse a connection: a `refused` frame, then close; discovery detaches it when
    /// its input ends.
    fn refuse(&mut self, conn: ConnectionId, detail: String) {
        tracing::warn!(conn = conn.0, "refusing a worker connection: {detail}");
        if let Some(c) = self.conns.get(&conn) {
            let _ = c.outbound.try_send(Outbound::Close(detail));
        }
    }

    fn fire_timers(&mut self) {
        let now = self.now();
        for fired in self.timers.pop_due(now) {
            match fired {
                Fired::Offer(assignment) => {
                    self.metrics().counter_add(
                        "den_router_offer_timeouts_total",
                        "Offer timers that fired.",
                        &[],
                        1.0,
                    );
                    self.drive(RouterInput::OfferTimeout { assignment });
                }
                Fired::Deadline(request) => self.drive(RouterInput::DeadlineExpired { request }),
                Fired::Expiry {
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
                    self.apply_discovery(effects);
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------
    // Effects
    // ---------------------------------------------------------------------------------

    /// Hand one input to the machine, then everything its effects fed back.
    fn drive(&mut self, input: RouterInput) {
        self.pending.push_back(input);
        self.drain_pending();
    }

    fn drain_pending(&mut self) {
        while let Some(input) = self.pending.pop_front() {
            let effects = self.router.handle(self.now(), input);
            self.apply_router(effects);
        }
    }

    fn apply_router(&mut self, effects: Vec<RouterEffect>) {
        for effect in effects {
            match effect {
                RouterEffect::Send(out) => {
                    let kind = out.message.kind();
                    let Some(conn) = self.discovery.route(&out.to) else {
                        if let RouterMessage::Offer(o) = &out.message {
                            // Fast fallback: no live route, no waiting for the timer.
                            self.metrics().counter_add(
                                "den_router_offers_without_route_total",
                                "Offers to a worker with no live route (failed at once).",
                                &[],
                                1.0,
                            );
                            self.pending.push_back(RouterInput::WorkerUnavailable {
                                worker: out.to.clone(),
                                assignment: o.assignment.clone(),
                            });
                        }
                        continue;
                    };
                    let text = match encode(&out) {
                        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                        Err(e) => {
                            tracing::error!("cannot encode a {kind} frame: {e}");
                            continue;
                        }
                    };
                    let sent = self
                        .conns
                        .get(&conn)
                        .is_some_and(|c| c.outbound.try_send(Outbound::Frame(text)).is_ok());
                    if sent {
                        self.metrics().counter_add(
                            "den_router_frames_sent_total",
                            "Frames sent to workers, by type.",
                            &[("type", kind)],
                            1.0,
                        );
                    } else {
                        tracing::warn!(worker = %out.to, "send to worker failed; detaching it");
                        if let Some(c) = self.conns.get(&conn) {
                            let _ = c
                                .outbound
                                .try_send(Outbound::Close("outbound queue full".into()));
                        }
                        let effects = self.discovery.handle(
                            self.now(),
                            DiscoveryInput::SendFailed {
                                connection: conn,
                                worker: out.to.clone(),
                            },
                        );
                        self.apply_discovery(effects);
                    }
                }
                RouterEffect::Local(local) => match local {
                    LocalRouterEffect::SetOfferTimer { assignment, at } => self.timers.set(
                        TimerKey::Offer(assignment.clone()),
                        at,
                        Fired::Offer(assignment),
                    ),
                    LocalRouterEffect::CancelOfferTimer { assignment } => {
                        self.timers.cancel(&TimerKey::Offer(assignment))
                    }
                    LocalRouterEffect::SetDeadlineTimer { request, at } => self.timers.set(
                        TimerKey::Deadline(request.clone()),
                        at,
                        Fired::Deadline(request),
                    ),
                    LocalRouterEffect::CancelDeadlineTimer { request } => {
                        self.timers.cancel(&TimerKey::Deadline(request))
                    }
                    LocalRouterEffect::Deliver(d) => self.deliver(d),
                    LocalRouterEffect::Decision(e) => self.on_decision(e),
                },
            }
        }
    }

    fn deliver(&mut self, d: Delivery) {
        let id = d.request.clone();
        let terminal = d.is_terminal();
        let now = Instant::now();
        let m = Arc::clone(&self.shared.metrics);
        let Some(state) = self.deliveries.get_mut(&id) else {
            return;
        };
        match &d.kind {
            DeliveryKind::Delta { .. } => {
                if let Some(last) = state.last_delta {
                    m.histogram_observe(
                        "den_inter_token_ms",
                        "Time between consecutive streamed tokens of one request, at the router.",
                        LATENCY_MS_BUCKETS,
                        &[],
                        (now - last).as_secs_f64() * 1e3,
                    );
                }
                state.last_delta = Some(now);
            }
            DeliveryKind::Completed { result } => {
                let processed = self.router.record(&id).map_or(0, |r| r.processed_tokens);
                m.counter_add(
                    "den_prompt_tokens_total",
                    "Processed prompt tokens of completed requests.",
                    &[],
                    processed as f64,
                );
                m.counter_add(
                    "den_cached_tokens_total",
                    "Prompt tokens of completed requests served from a cache (as the worker reported).",
                    &[],
                    result.cached_token_count as f64,
                );
                let tier = self
                    .router
                    .record(&id)
                    .and_then(|r| r.chosen())
                    .map_or("none", |a| a.tier.as_str());
                let tier = if result.cached_token_count == 0 {
                    "none"
                } else {
                    tier
                };
                m.counter_add(
                    "den_completed_by_tier_total",
                    "Completed requests by the tier their cached prefix came from.",
                    &[("tier", tier)],
                    1.0,
                );
            }
            _ => {}
        }
        match state.tx.try_send(d) {
            Ok(()) => {
                if terminal {
                    self.deliveries.remove(&id);
                }
            }
            Err(e) => {
                let why = match e {
                    mpsc::error::TrySendError::Full(_) => "slow-client",
                    mpsc::error::TrySendError::Closed(_) => "client-gone",
                };
                self.deliveries.remove(&id);
                if !terminal {
                    m.counter_add(
                        "den_router_client_cancels_total",
                        "Requests cancelled because their client fell behind or went away.",
                        &[("why", why)],
                        1.0,
                    );
                    self.pending.push_back(RouterInput::Cancel { request: id });
                }
            }
        }
    }

    fn on_decision(&mut self, e: DecisionEvent) {
        let m = Arc::clone(&self.shared.metrics);
        match &e.kind {
            DecisionEventKind::Submitted { .. } => m.counter_add(
                "den_router_submitted_total",
                "Requests submitted to the router.",
                &[],
                1.0,
            ),
            DecisionEventKind::Offered { tier, .. } => m.counter_add(
                "den_router_offers_total",
                "Offers made, by the candidate's cache tier.",
                &[("tier", tier.as_str())],
                1.0,
            ),
            DecisionEventKind::AttemptEnded { outcome, .. } => {
                let (kind, reason) = match outcome {
                    AttemptOutcome::Declined { reason, .. } => {
                        ("declined", reason.map(|r| r.as_str()).unwrap_or(""))
                    }
                    AttemptOutcome::TimedOut => ("timed-out", ""),
                    AttemptOutcome::WorkerUnavailable => ("worker-unavailable", ""),
                    AttemptOutcome::Failed { reason } => ("failed", reason.kind.as_str()),
                    AttemptOutcome::Completed => ("completed", ""),
                    AttemptOutcome::Cancelled => ("cancelled", ""),
                    AttemptOutcome::Superseded => ("superseded", ""),
                    AttemptOutcome::Pending | AttemptOutcome::Running => ("other", ""),
                };
                m.counter_add(
                    "den_router_attempts_ended_total",
                    "Attempts that ended, by outcome and decline or failure reason.",
                    &[("outcome", kind), ("reason", reason)],
                    1.0,
                );
            }
            DecisionEventKind::FirstDelta { ttft_ms } => m.histogram_observe(
                "den_ttft_ms",
                "Time to first token: submission to the first streamed token, at the router.",
                LATENCY_MS_BUCKETS,
                &[],
                *ttft_ms as f64,
            ),
            DecisionEventKind::Finished { outcome, .. } => {
                let label = match outcome {
                    TerminalOutcome::Completed => "completed",
                    TerminalOutcome::Failed { .. } => "failed",
                    TerminalOutcome::Cancelled => "cancelled",
                };
                m.counter_add(
                    "den_requests_total",
                    "Requests that finished, by outcome.",
                    &[("outcome", label)],
                    1.0,
                );
            }
            DecisionEventKind::Collected => {
                self.shared.known().remove(&e.request);
                self.dirty.remove(&e.request);
                let frame = FeedMessage::RouteGone {
                    at: e.at,
                    request: e.request.clone(),
                };
                let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
                return;
            }
            DecisionEventKind::Accepted { .. } => {}
        }
        self.dirty.insert(e.request);
    }

    fn apply_discovery(&mut self, effects: Vec<DiscoveryEffect>) {
        let mut workers_changed = false;
        for effect in effects {
            match effect {
                DiscoveryEffect::Updated { worker, .. } => {
                    workers_changed = true;
                    self.metrics().counter_add(
                        "den_router_heartbeats_total",
                        "Heartbeats accepted (a newer observation stored).",
                        &[],
                        1.0,
                    );
                    if self.shared.feed.receiver_count() > 0
                        && let Some(obs) = self.discovery.registry().get(&worker)
                    {
                        let frame = FeedMessage::Worker {
                            at: self.now(),
                            observation: Box::new(obs.clone()),
                        };
                        let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
                    }
                }
                DiscoveryEffect::ArmExpiry {
                    worker,
                    connection,
                    version,
                    at,
                } => self.timers.set(
                    TimerKey::Expiry(worker.clone()),
                    at,
                    Fired::Expiry {
                        worker,
                        connection,
                        version,
                    },
                ),
                DiscoveryEffect::Detached {
                    worker,
                    connection,
                    reason,
                } => {
                    workers_changed = true;
                    tracing::warn!(%worker, conn = connection.0, reason = reason.as_str(), "worker detached");
                    self.metrics().counter_add(
                        "den_router_workers_detached_total",
                        "Workers detached, by reason.",
                        &[("reason", reason.as_str())],
                        1.0,
                    );
                    self.timers.cancel(&TimerKey::Expiry(worker.clone()));
                    let inputs = self.router.unavailable_inputs(&worker);
                    self.pending.extend(inputs);
                    if let Some(node) = self.conns.get(&connection).map(|c| c.node.clone()) {
                        let still_there = self
                            .discovery
                            .registry()
                            .observations()
                            .any(|o| o.node == node);
                        if !still_there {
                            self.catalog.remove_node(&node);
                        }
                    }
                    let frame = FeedMessage::WorkerGone {
                        at: self.now(),
                        worker,
                        reason: reason.as_str().to_owned(),
                    };
                    let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
                }
                DiscoveryEffect::Ignored {
                    worker,
                    version,
                    why,
                } => {
                    tracing::debug!(%worker, %version, ?why, "heartbeat ignored");
                }
            }
        }
        if workers_changed {
            self.update_models();
        }
        self.drain_pending();
    }

    // ---------------------------------------------------------------------------------
    // Feed, models, gauges
    // ---------------------------------------------------------------------------------

    fn flush_feed(&mut self) {
        if self.dirty.is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut self.dirty);
        if self.shared.feed.receiver_count() == 0 {
            return;
        }
        let at = self.now();
        for id in dirty {
            if let Some(record) = self.router.record(&id) {
                let frame = FeedMessage::Route {
                    at,
                    record: Box::new(record.clone()),
                };
                let _ = self.shared.feed.send(Arc::from(encode_feed(&frame)));
            }
        }
    }

    fn snapshot_frame(&self) -> Arc<str> {
        let frame = FeedMessage::Snapshot {
            at: self.now(),
            workers: self.discovery.registry().observations().cloned().collect(),
            routes: self.router.records().cloned().collect(),
        };
        Arc::from(encode_feed(&frame))
    }

    fn update_models(&self) {
        let mut by_model: BTreeMap<&str, (usize, u32)> = BTreeMap::new();
        for obs in self.discovery.registry().observations() {
            if !obs.online || obs.draining {
                continue;
            }
            for m in &obs.models {
                let e = by_model.entry(m.as_str()).or_insert((0, 0));
                e.0 += 1;
                e.1 = e.1.max(obs.max_context);
            }
        }
        let models = by_model
            .into_iter()
            .map(|(id, (workers, max_context))| ServedModel {
                id: id.to_owned(),
                fingerprint: id.into(),
                workers,
                max_context,
            })
            .collect();
        self.shared.set_models(models);
    }

    fn export_gauges(&self) {
        let m = self.metrics();
        let c = self.router.counts();
        m.gauge_set(
            "den_router_workers",
            "Workers with a live route.",
            &[],
            self.discovery.registry().len() as f64,
        );
        for (phase, n) in [
            ("offered", c.offered),
            ("assigned", c.assigned),
            ("completed", c.completed),
            ("failed", c.failed),
            ("cancelled", c.cancelled),
        ] {
            m.gauge_set(
                "den_router_requests",
                "Requests held by the router, by phase (terminal ones until collected).",
                &[("phase", phase)],
                n as f64,
            );
        }
        m.gauge_set(
            "den_catalog_chunks",
            "Chunks published in the catalog.",
            &[],
            self.catalog.chunk_count() as f64,
        );
        m.gauge_set(
            "den_router_timers",
            "Armed timers (offers, deadlines, heartbeat expiries).",
            &[],
            self.timers.len() as f64,
        );
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
