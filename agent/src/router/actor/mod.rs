//! The router actor: the one task that owns the router node
//! ([`den_protocol::router_node`], where every routing decision is made) and the timer
//! wheel, and carries out the node's effects (spec §2.8b, §5.4): bytes to connections,
//! timers, deliveries to clients, metrics, the console feed, the management API.
//!
//! - **Time.** `now` is milliseconds since the actor started; timers are kept in a
//!   [`TimerWheel`] and the select loop sleeps until the earliest one.
//! - **Sending.** The node names the connection of each frame (the one the worker's
//!   newest accepted heartbeat arrived on). A full or closed queue is a send failure,
//!   handed back to the node, which detaches the worker. Offers to a worker with no live
//!   route, detaches, pinning and fencing are the node's.
//! - **Delivery.** Each request has a bounded channel (`serving::DELIVERY_QUEUE`); a full
//!   or closed one means a slow or vanished client: the request is cancelled.
//! - **Fencing is the node's.** Messages it ignores (late, duplicate, not for the current
//!   attempt) are counted in `den_router_fenced_total`.
//! - **Feed.** Decision events mark records dirty; dirty records are sent as `route`
//!   frames after each batch of commands (so bursts coalesce); a full snapshot repeats
//!   every `snapshot_interval`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, oneshot};

use den_protocol::decision::{
    AttemptOutcome, DecisionEvent, DecisionEventKind, DecisionRecord, TerminalOutcome,
};
use den_protocol::discovery::ConnectionId;
use den_protocol::feed::{FEED_VERSION, FeedMessage, encode as encode_feed};
use den_protocol::ids::{NodeId, RequestId, WorkerId};
use den_protocol::observation::Observation;
use den_protocol::request::GenerationRequest;
use den_protocol::router::{Delivery, DeliveryKind, RouterConfig};
use den_protocol::router_node::{NodeConfig, NodeEffect, NodeInput, Pin, RouterNode};
use den_protocol::time::Millis;
use den_protocol::wire::{Control, ControlToWorker, RefusalReason, ToRouter, encode_text};

use crate::metrics::{LATENCY_MS_BUCKETS, Metrics};
use crate::router::Shared;
use crate::router::timers::TimerWheel;
use crate::serving::ServedModel;

mod effects;
mod manage;
mod report;

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

/// A connection's outbound queue (which worker said hello on it is the node's: `peer`).
struct ConnInfo {
    outbound: mpsc::Sender<Outbound>,
}

struct DeliveryState {
    tx: mpsc::Sender<Delivery>,
    last_delta: Option<Instant>,
}

pub struct RouterActor {
    shared: Arc<Shared>,
    /// Every routing decision (see [`den_protocol::router_node`]).
    node: RouterNode,
    /// The node's effects, one buffer reused for every input.
    effects: Vec<NodeEffect>,
    timers: TimerWheel,
    conns: BTreeMap<ConnectionId, ConnInfo>,
    deliveries: BTreeMap<RequestId, DeliveryState>,
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
        let config = NodeConfig {
            router: RouterConfig {
                offer_timeout_ms: ms(o.offer_timeout),
                default_deadline_ms: ms(o.request_deadline),
                retention_ms: ms(o.retention),
                ..RouterConfig::default()
            },
            heartbeat_timeout_ms: ms(o.heartbeat_timeout),
            chunk_size: o.chunk_size,
            max_waiting: o.max_waiting,
        };
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
            node: RouterNode::new(config),
            effects: Vec::new(),
            timers: TimerWheel::default(),
            conns: BTreeMap::new(),
            deliveries: BTreeMap::new(),
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
                    self.drive(NodeInput::Tick);
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

    /// During shutdown: true once no accepted request is unfinished, waiting for pages
    /// included (cancelling what is left at the drain deadline).
    fn shutdown_done(&mut self) -> bool {
        let Some((deadline, _)) = &self.shutdown else {
            return false;
        };
        if self.node.router().counts().unfinished() == 0 {
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
                self.drive(NodeInput::Cancel { request });
            }
            self.flush_feed();
            return self.node.router().counts().unfinished() == 0;
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
                crate::hops::mark(crate::hops::Hop::AtRouter);
                let pin = match &pin {
                    None => Pin::Any,
                    Some(instance) => match self.manager.worker_of(instance) {
                        Some(worker) => Pin::Worker(worker),
                        None => Pin::Nowhere,
                    },
                };
                let now = self.now();
                self.deliveries.insert(
                    request.id.clone(),
                    DeliveryState {
                        tx: deliveries,
                        last_delta: None,
                    },
                );
                self.drive(NodeInput::Submit {
                    request,
                    deadline: deadline.map(|d| now + ms(d)),
                    pin,
                });
            }
            Command::Cancel { request } => self.drive(NodeInput::Cancel { request }),
            Command::Connected {
                conn,
                worker,
                node,
                outbound,
            } => {
                tracing::info!(%worker, %node, conn = conn.0, "worker connected");
                self.conns.insert(conn, ConnInfo { outbound });
                self.drive(NodeInput::Connected { conn, worker, node });
            }
            Command::Frame { conn, frame } => {
                if matches!(frame, ToRouter::Result(_)) {
                    crate::hops::mark(crate::hops::Hop::ResultAtRouter);
                }
                self.drive(NodeInput::Frame { conn, frame })
            }
            Command::Disconnected { conn } => {
                if let Some((worker, _)) = self.node.peer(conn) {
                    tracing::info!(%worker, conn = conn.0, "worker connection closed");
                }
                self.drive(NodeInput::Disconnected { conn });
                self.conns.remove(&conn);
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
                let sent = match (self.node.conn_of(&worker), encode_text(&frame)) {
                    (Some(conn), Ok(text)) => self.queue_frame(conn, text, frame.control.kind()),
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
                let _ = reply.send(
                    self.node
                        .discovery()
                        .registry()
                        .observations()
                        .cloned()
                        .collect(),
                );
            }
            Command::Record { request, reply } => {
                let _ = reply.send(self.node.router().record(&request).cloned());
            }
            Command::Shutdown { drain, reply } => {
                self.shutdown = Some((Instant::now() + drain, reply));
            }
            Command::Manage(request) => self.on_manage(request),
        }
    }

    fn fire_timers(&mut self) {
        let now = self.now();
        for timer in self.timers.pop_due(now) {
            self.drive(NodeInput::TimerFired(timer));
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
