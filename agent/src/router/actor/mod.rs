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

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, oneshot};

use den_protocol::candidate::Tier;
use den_protocol::candidate_generation::candidates_for;
use den_protocol::chunk::plan_chunks;
use den_protocol::chunk_catalog::ChunkCatalog;
use den_protocol::decision::{
    AttemptOutcome, DecisionEvent, DecisionEventKind, DecisionRecord, TerminalOutcome,
};
use den_protocol::discovery::{
    ConnectionId, DetachReason, Discovery, DiscoveryEffect, DiscoveryInput,
};
use den_protocol::feed::{FEED_VERSION, FeedMessage, encode as encode_feed};
use den_protocol::ids::{HeartbeatVersion, NodeId, RequestId, WorkerId};
use den_protocol::observation::{GpuPrefix, Observation};
use den_protocol::request::GenerationRequest;
use den_protocol::router::{
    Delivery, DeliveryKind, LocalRouterEffect, Router, RouterConfig, RouterEffect, RouterInput,
};
use den_protocol::time::Millis;
use den_protocol::wire::{
    Control, ControlToWorker, RefusalReason, RouterMessage, ToRouter, WorkerMessage, encode,
};

use crate::metrics::{LATENCY_MS_BUCKETS, Metrics};
use crate::router::Shared;
use crate::router::timers::{Fired, TimerKey, TimerWheel};
use crate::serving::ServedModel;
use speculation::Speculation;

mod effects;
mod inflight;
mod manage;
mod report;
mod speculation;

/// What a connection task writes to its socket.
#[derive(Debug)]
pub enum Outbound {
    Frame(String),
    /// Send a `refused` frame with this reason and one-line detail, then close.
    Refuse {
        reason: RefusalReason,
        detail: String,
    },
}

/// What a new console subscriber gets: `hello` and a snapshot, then the live stream.
pub type FeedStart = (Vec<Arc<str>>, broadcast::Receiver<Arc<str>>);

/// Everything that reaches the actor.
pub enum Command {
    Submit {
        request: Arc<GenerationRequest>,
        deliveries: mpsc::Sender<Delivery>,
        deadline: Option<Duration>,
        /// Offer only to the worker of this placed instance.
        pin: Option<den_protocol::skulk::InstanceId>,
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
        reply: oneshot::Sender<FeedStart>,
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
    /// A management API request (`crate::router::manage`).
    Manage(crate::router::manage::Request),
}

struct ConnInfo {
    worker: WorkerId,
    node: NodeId,
    outbound: mpsc::Sender<Outbound>,
}

struct DeliveryState {
    tx: mpsc::Sender<Delivery>,
    last_delta: Option<Instant>,
    /// Kept to announce the completed route's prefix (see [`Speculation`]).
    request: Arc<GenerationRequest>,
}

pub struct RouterActor {
    shared: Arc<Shared>,
    router: Router,
    discovery: Discovery,
    catalog: ChunkCatalog,
    speculation: Speculation,
    /// Offered work the workers' heartbeats do not show yet (see [`inflight`]).
    unreflected: inflight::Unreflected,
    timers: TimerWheel,
    conns: BTreeMap<ConnectionId, ConnInfo>,
    deliveries: BTreeMap<RequestId, DeliveryState>,
    /// Inputs produced while interpreting effects, handled before the next command.
    pending: VecDeque<RouterInput>,
    /// Records changed since the last feed flush.
    dirty: BTreeSet<RequestId>,
    /// A worker's observation changed since the served-model listing was last rebuilt.
    models_dirty: bool,
    started: Instant,
    shutdown: Option<(Instant, oneshot::Sender<()>)>,
    cancelled_for_shutdown: bool,
    /// Instances, commands and the workers' download and runner reports.
    manager: crate::router::manage::Manager,
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
        let manager = crate::router::manage::Manager::new(
            crate::router::manage::ManageConfig {
                node: o.name.clone(),
                heartbeat_timeout_ms: ms(o.heartbeat_timeout),
                id_seed: format!(
                    "{}-{}-{}",
                    o.name,
                    shared.started_unix_ms,
                    std::process::id()
                ),
            },
            Arc::clone(&o.catalog),
        );
        RouterActor {
            manager,
            router: Router::new(config),
            discovery,
            catalog: ChunkCatalog::default(),
            speculation: Speculation::default(),
            unreflected: inflight::Unreflected::default(),
            timers: TimerWheel::default(),
            conns: BTreeMap::new(),
            deliveries: BTreeMap::new(),
            pending: VecDeque::new(),
            dirty: BTreeSet::new(),
            models_dirty: false,
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
            if std::mem::take(&mut self.models_dirty) {
                self.update_models();
            }
            self.flush_feed();
            if self.shutdown_done() {
                break;
            }
        }
        for conn in self.conns.values() {
            let _ = conn.outbound.try_send(Outbound::Refuse {
                reason: RefusalReason::Shutdown,
                detail: "the router is shutting down".into(),
            });
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
                pin,
            } => {
                let amended = self.observations_with_speculation();
                let mut candidates = candidates_for(
                    &request,
                    self.shared.opts.chunk_size,
                    amended.iter().map(|o| o.as_ref()),
                    &self.catalog,
                );
                if let Some(pin) = &pin {
                    let worker = self.manager.worker_of(pin);
                    candidates.retain(|c| Some(&c.worker_id) == worker.as_ref());
                }
                self.amend_queues(&mut candidates);
                let now = self.now();
                self.deliveries.insert(
                    request.id.clone(),
                    DeliveryState {
                        tx: deliveries,
                        last_delta: None,
                        request: Arc::clone(&request),
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
                // Detach first: it needs the connection's node to drop its replicas.
                let effects = self.discovery.handle(
                    self.now(),
                    DiscoveryInput::Disconnected { connection: conn },
                );
                self.apply_discovery(effects);
                if let Some(info) = self.conns.remove(&conn) {
                    self.unreflected.forget(&info.worker);
                    tracing::info!(worker = %info.worker, conn = conn.0, "worker connection closed");
                }
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
            Command::Manage(request) => self.on_manage(request),
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
                let version = hb.observation.version();
                let effects = self.discovery.handle(
                    self.now(),
                    DiscoveryInput::Heartbeat {
                        connection: conn,
                        observation: Box::new(hb.observation),
                    },
                );
                self.apply_discovery(effects);
                let accepted = self
                    .discovery
                    .registry()
                    .get(&sender)
                    .is_some_and(|o| o.version() == version);
                if accepted {
                    self.unreflected.heartbeat(&sender);
                }
            }
            ToRouter::OfferResult(m) => {
                self.unreflected
                    .answered(&sender, &m.assignment, m.accepted);
                self.worker_message(&sender, WorkerMessage::OfferResult(m))
            }
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
            let _ = c.outbound.try_send(Outbound::Refuse {
                reason: RefusalReason::Malformed,
                detail,
            });
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
                    self.unreflected.withdrawn(&assignment);
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
