//! The worker actor: one task that owns the worker state machine and interprets its
//! effects. Every input — router frames, device results and tokens, checkpoint
//! completions, operator commands — goes through [`Actor::run`]'s select loop, so the
//! machine is only ever touched from here.
//!
//! Effects:
//! - `Send` → a frame on the current router connection (dropped when there is none: the
//!   router has detached us and fences everything of the old connection anyway);
//! - `Start(op)` → a job on the device queue, with the assignment's cancellation flag;
//! - `CancelOperation` → raise that flag (the machine fenced the assignment already and
//!   releases its pages when the operation's result comes back, spec §3.7);
//! - `Released { Completed }` → checkpoint the route in the background: record its
//!   prefix identity (so it is advertised), capture its chunks on the device queue,
//!   store them, wait for every receipt, publish, and only then mark the route durable
//!   (which makes it evictable).
//!
//! A lost router connection cancels every live assignment (the router has already moved
//! them elsewhere); the link reconnects on its own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::time::MissedTickBehavior;

use den_protocol::candidate::Tier;
use den_protocol::chunk::{ChunkDescriptor, PrefixHash, plan_chunks};
use den_protocol::ids::{AssignmentId, Epoch, RouteId};
use den_protocol::observation::{Observation, PoolStats, TierUsage};
use den_protocol::pool::{EvictionReason, LeaseId};
use den_protocol::request::Token;
use den_protocol::time::Millis;
use den_protocol::wire::{
    Control, Heartbeat, Publish, Retract, RetractedChunk, ToRouter, WorkerInbound, WorkerMessage,
    encode_text,
};
use den_protocol::worker::{
    LocalWorkerEffect, Operation, OperationKind, OperationOutcome, ReleaseCause, Work, Worker,
    WorkerEffect, WorkerInput,
};

use crate::memory::TransferTotals;
use crate::metrics::{LATENCY_MS_BUCKETS, Metrics};
use crate::tiers::{ChunkKey, ChunkMeta};
use crate::worker::WorkerOptions;
use crate::worker::device::{DeviceContext, DeviceEvent, DeviceHandle, Job};
use crate::worker::fetch::{self, FetchContext, FetchMeter, Fetched};
use crate::worker::link::LinkEvent;
use crate::worker::meters::{Calibration, QueueMeter};
use crate::worker::models::{ModelEvent, Models};
use crate::worker::pool::SharedPool;
use crate::worker::store::{self, BadReplica, CheckpointOutcome, ChunkIndex, Tiers};

mod checkpoint;
mod costs;
mod effects;
mod engine;
mod observe;

use engine::{EngineState, Switch};

pub use checkpoint::checkpoint_plan;

/// Throughputs advertised before anything was measured (bytes per millisecond).
const DEFAULT_RAM_BYTES_PER_MS: f64 = 8e6;
const DEFAULT_SSD_BYTES_PER_MS: f64 = 1.5e6;
const DEFAULT_OBJECT_BYTES_PER_MS: f64 = 1e5;
const DEFAULT_UPLOAD_BYTES_PER_MS: f64 = 8e6;
/// Publish frames carry at most this many chunks.
const PUBLISH_BATCH: usize = 512;
/// After the drain timeout, how long cancelled work may take to quiesce.
const QUIESCE_GRACE: Duration = Duration::from_secs(5);

/// Commands from the metrics and fault-admin endpoints.
pub enum AdminCommand {
    Status(oneshot::Sender<WorkerStatus>),
    /// Evict every evictable resident route (test facility and operator action).
    EvictResident(oneshot::Sender<u32>),
}

/// The worker's state at a glance (`GET /status`).
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    pub worker: String,
    pub epoch: Epoch,
    pub connected: bool,
    pub draining: bool,
    pub assignments: usize,
    pub routes: usize,
    pub pool: PoolStats,
    pub queue_ms: f64,
    pub chunks_indexed: usize,
    pub checkpoints_in_flight: usize,
    pub restore_verified: f64,
    pub restore_mismatch: f64,
    pub backend: String,
}

/// What the actor owns.
pub struct ActorParts {
    pub opts: Arc<WorkerOptions>,
    pub machine: Worker<SharedPool>,
    pub pool: SharedPool,
    pub device: DeviceHandle,
    pub tiers: Tiers,
    pub metrics: Arc<Metrics>,
    pub calibration: Arc<Calibration>,
    pub queue: Arc<QueueMeter>,
    pub totals: Arc<Mutex<TransferTotals>>,
    pub backend: String,
    pub epoch: Epoch,
    /// Downloads, installed artifacts and runners of placed models.
    pub models: Models,
    /// What a new device thread is started with (an engine switch).
    pub device_ctx: DeviceContext,
}

/// Where the actor's inputs come from.
pub struct ActorInputs {
    pub device: mpsc::UnboundedReceiver<DeviceEvent>,
    pub link: mpsc::Receiver<LinkEvent>,
    pub admin: mpsc::Receiver<AdminCommand>,
    pub models: mpsc::UnboundedReceiver<ModelEvent>,
    pub stop: oneshot::Receiver<()>,
}

/// Background completions.
enum Internal {
    Captured {
        route: RouteId,
        tokens: u32,
        lease: LeaseId,
        needed: Vec<ChunkKey>,
        result: Result<Vec<(ChunkMeta, Bytes)>, String>,
    },
    Checkpointed {
        route: RouteId,
        tokens: u32,
        needed: Vec<ChunkKey>,
        outcome: CheckpointOutcome,
    },
    Usage(BTreeMap<Tier, TierUsage>),
    /// The next chunk of a restore's fetch (`None`: the fetch ended), for the device.
    Fetched {
        job: u64,
        fetched: Option<Fetched>,
    },
}

struct Link {
    conn: u64,
    tx: mpsc::Sender<String>,
}

/// What the actor remembers about a live assignment beyond the machine's record.
struct Live {
    work: Arc<Work>,
    accepted: Instant,
    last_token: Option<Instant>,
    output: Vec<Token>,
}

pub struct Actor {
    p: ActorParts,
    started: Instant,
    link: Option<Link>,
    heartbeat_every: Duration,
    sequence: u64,
    next_job: u64,
    flags: BTreeMap<AssignmentId, Arc<AtomicBool>>,
    live: BTreeMap<AssignmentId, Live>,
    index: ChunkIndex,
    tier_usage: BTreeMap<Tier, TierUsage>,
    checkpoints: usize,
    internal_tx: mpsc::UnboundedSender<Internal>,
    internal_rx: mpsc::UnboundedReceiver<Internal>,
    /// Cumulative counters already exported (to add only the increase).
    exported: BTreeMap<String, f64>,
    /// A heartbeat is due soon because something routing depends on changed (a route
    /// became advertised or evictable); coalesces bursts.
    eager: Option<tokio::time::Instant>,
    engine: EngineState,
    switch: Option<Switch>,
    /// Restore chunk fetches in flight (`worker::fetch`).
    fetches: Arc<FetchMeter>,
}

/// How long an eager heartbeat waits for more changes to coalesce.
const EAGER_HEARTBEAT: Duration = Duration::from_millis(5);

impl Actor {
    pub fn new(parts: ActorParts) -> Self {
        let (internal_tx, internal_rx) = mpsc::unbounded_channel();
        Actor {
            started: Instant::now(),
            link: None,
            heartbeat_every: Duration::from_secs(1),
            sequence: 0,
            next_job: 1,
            flags: BTreeMap::new(),
            live: BTreeMap::new(),
            index: ChunkIndex::default(),
            tier_usage: BTreeMap::new(),
            checkpoints: 0,
            internal_tx,
            internal_rx,
            exported: BTreeMap::new(),
            eager: None,
            engine: EngineState::initial(&parts.opts),
            switch: None,
            fetches: Arc::default(),
            p: parts,
        }
    }

    fn now(&self) -> Millis {
        Millis(u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// The select loop; returns once drained and quiesced after `stop`.
    pub async fn run(mut self, mut inputs: ActorInputs) {
        self.refresh_usage();
        let mut heartbeat = tokio::time::interval(self.heartbeat_every);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut draining = false;
        let mut drain_deadline = tokio::time::Instant::now();
        let mut cancelled_all = false;
        loop {
            if draining && self.machine_idle() {
                break;
            }
            if !draining {
                self.try_switch();
            }
            if cancelled_all && tokio::time::Instant::now() >= drain_deadline + QUIESCE_GRACE {
                tracing::error!(
                    "operations did not quiesce after cancellation; releasing memory anyway"
                );
                break;
            }
            tokio::select! {
                biased;
                Some(ev) = inputs.device.recv() => self.on_device(ev),
                Some(ev) = inputs.link.recv() => {
                    if let Some(every) = self.on_link(ev) {
                        heartbeat = tokio::time::interval(every);
                        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
                    }
                }
                Some(ev) = self.internal_rx.recv() => self.on_internal(ev),
                Some(ev) = inputs.models.recv() => self.on_model_event(ev),
                Some(cmd) = inputs.admin.recv() => self.on_admin(cmd),
                _ = heartbeat.tick() => self.heartbeat(),
                _ = sleep_until(self.eager), if self.eager.is_some() => self.heartbeat(),
                _ = &mut inputs.stop, if !draining => {
                    draining = true;
                    drain_deadline = tokio::time::Instant::now() + self.p.opts.drain_timeout;
                    tracing::info!(
                        assignments = self.p.machine.assignments().count(),
                        timeout_ms = self.p.opts.drain_timeout.as_millis() as u64,
                        "draining: declining new offers, finishing in-flight work"
                    );
                    let effects = self.p.machine.handle(self.now(), WorkerInput::SetDraining { draining: true });
                    self.apply(effects);
                    self.heartbeat();
                }
                _ = tokio::time::sleep_until(drain_deadline), if draining && !cancelled_all => {
                    cancelled_all = true;
                    tracing::warn!("drain timeout: cancelling the remaining work");
                    self.cancel_all();
                }
                _ = tokio::time::sleep(Duration::from_millis(100)), if cancelled_all => {}
            }
        }
        tracing::info!("drained; closing the router connection and releasing memory");
        self.p.models.shutdown();
        self.link = None;
        self.p.device.shutdown();
        tracing::info!("worker stopped");
    }

    fn machine_idle(&self) -> bool {
        self.p.machine.assignments().next().is_none()
    }

    // ---------------------------------------------------------------------------------
    // Inputs
    // ---------------------------------------------------------------------------------

    /// Returns the new heartbeat interval when a connection came up.
    fn on_link(&mut self, ev: LinkEvent) -> Option<Duration> {
        match ev {
            LinkEvent::Up { conn, tx, welcome } => {
                self.link = Some(Link { conn, tx });
                self.heartbeat_every = Duration::from_millis(welcome.heartbeat_interval_ms.max(1));
                self.p.metrics.gauge_set(
                    "den_worker_connected",
                    "1 while the worker holds a live connection to the router.",
                    &[],
                    1.0,
                );
                self.heartbeat();
                let all = self.index.all();
                for batch in all.chunks(PUBLISH_BATCH) {
                    self.send(&ToRouter::Publish(Publish {
                        chunks: batch.to_vec(),
                    }));
                }
                Some(self.heartbeat_every)
            }
            LinkEvent::Inbound { conn, message } => {
                if self.link.as_ref().is_some_and(|l| l.conn == conn) {
                    self.on_router(message);
                }
                None
            }
            LinkEvent::Down { conn, .. } => {
                if self.link.as_ref().is_some_and(|l| l.conn == conn) {
                    self.link = None;
                    self.p.metrics.gauge_set(
                        "den_worker_connected",
                        "1 while the worker holds a live connection to the router.",
                        &[],
                        0.0,
                    );
                    // The router fences whatever ran on the old connection and has moved it
                    // elsewhere: stop spending the device on it.
                    self.cancel_all();
                }
                None
            }
        }
    }

    fn on_router(&mut self, message: WorkerInbound) {
        match message {
            WorkerInbound::Router(m) => {
                if m.kind() == "offer" {
                    crate::hops::mark(crate::hops::Hop::OfferAtWorker);
                }
                let effects = self.p.machine.handle(self.now(), m.into());
                self.apply(effects);
            }
            WorkerInbound::Control(Control::Drain { draining }) => {
                tracing::info!(draining, "drain set by the router");
                let effects = self
                    .p
                    .machine
                    .handle(self.now(), WorkerInput::SetDraining { draining });
                self.apply(effects);
                self.heartbeat();
            }
            WorkerInbound::Control(Control::PlaceRunner(place)) => {
                self.p.models.place(*place);
                self.models_changed();
            }
            WorkerInbound::Control(Control::RemoveRunner(remove)) => {
                self.p.models.remove(&remove);
                self.plan_switch();
                self.models_changed();
            }
            WorkerInbound::Welcome(_)
            | WorkerInbound::Refused(_)
            | WorkerInbound::Ignored { .. } => {}
        }
    }

    fn on_device(&mut self, ev: DeviceEvent) {
        match ev {
            DeviceEvent::Token {
                assignment,
                token,
                index,
            } => {
                let now = Instant::now();
                if let Some(live) = self.live.get_mut(&assignment) {
                    let since = match live.last_token {
                        None => {
                            self.p.metrics.histogram_observe(
                                "den_worker_ttft_ms",
                                "Acceptance of an offer to its first token, on the worker.",
                                LATENCY_MS_BUCKETS,
                                &[],
                                ms(now - live.accepted),
                            );
                            None
                        }
                        Some(t) => Some(now - t),
                    };
                    if let Some(d) = since {
                        self.p.metrics.histogram_observe(
                            "den_worker_inter_token_ms",
                            "Time between consecutive tokens of one assignment, on the worker.",
                            LATENCY_MS_BUCKETS,
                            &[],
                            ms(d),
                        );
                    }
                    live.last_token = Some(now);
                }
                let effects = self.p.machine.handle(
                    self.now(),
                    WorkerInput::Token {
                        assignment,
                        token,
                        index,
                    },
                );
                self.apply(effects);
            }
            DeviceEvent::Done {
                assignment,
                outcome,
            } => {
                if matches!(outcome, OperationOutcome::Decoded { .. }) {
                    crate::hops::mark(crate::hops::Hop::DoneAtWorker);
                }
                let (kind, result) = match &outcome {
                    OperationOutcome::Restored { .. } => ("restore", "ok"),
                    OperationOutcome::Prefilled => ("prefill", "ok"),
                    OperationOutcome::Decoded { .. } => ("decode", "ok"),
                    OperationOutcome::Failed { operation, .. } => (op_name(*operation), "failed"),
                };
                self.p.metrics.counter_add(
                    "den_operations_total",
                    "Device operations finished, by kind and result.",
                    &[("kind", kind), ("result", result)],
                    1.0,
                );
                if let OperationOutcome::Decoded { tokens, .. } = &outcome
                    && let Some(live) = self.live.get_mut(&assignment)
                {
                    live.output = tokens.clone();
                }
                let effects = self.p.machine.handle(
                    self.now(),
                    WorkerInput::OperationDone {
                        assignment,
                        outcome,
                    },
                );
                self.apply(effects);
            }
            DeviceEvent::BadReplica(bad) => self.on_bad_replica(bad),
        }
    }

    fn on_internal(&mut self, ev: Internal) {
        match ev {
            Internal::Captured {
                route,
                tokens,
                lease,
                needed,
                result,
            } => {
                self.p.pool.lock().release_lease(lease);
                match result {
                    Ok(captured) => {
                        let tiers = self.p.tiers.clone();
                        let tx = self.internal_tx.clone();
                        tokio::spawn(async move {
                            let outcome = store::checkpoint(tiers, captured).await;
                            let _ = tx.send(Internal::Checkpointed {
                                route,
                                tokens,
                                needed,
                                outcome,
                            });
                        });
                    }
                    Err(e) => {
                        self.checkpoints = self.checkpoints.saturating_sub(1);
                        tracing::warn!(%route, "checkpoint capture failed: {e}");
                    }
                }
            }
            Internal::Checkpointed {
                route,
                tokens,
                needed,
                outcome,
            } => {
                self.checkpoints = self.checkpoints.saturating_sub(1);
                self.on_checkpointed(route, tokens, needed, outcome);
            }
            Internal::Usage(usage) => self.tier_usage = usage,
            Internal::Fetched { job, fetched } => {
                // A closed device queue fails every operation already (shutdown).
                let _ = self.p.device.submit(Job::Fetched { job, fetched });
            }
        }
    }

    fn on_admin(&mut self, cmd: AdminCommand) {
        match cmd {
            AdminCommand::Status(reply) => {
                let _ = reply.send(self.status());
            }
            AdminCommand::EvictResident(reply) => {
                let mut freed = 0;
                {
                    let protected = self.p.machine.protected_routes().clone();
                    let mut pool = self.p.pool.lock();
                    let routes: Vec<RouteId> = pool.routes().map(|(id, _)| id.clone()).collect();
                    for r in routes {
                        if pool.is_evictable(&r, &protected)
                            && let Ok(e) = pool.evict(&r, EvictionReason::Explicit)
                        {
                            freed += e.pages_freed;
                        }
                    }
                }
                tracing::info!(pages = freed, "evicted every evictable resident route");
                self.heartbeat();
                let _ = reply.send(freed);
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

fn op_name(kind: OperationKind) -> &'static str {
    match kind {
        OperationKind::Restore => "restore",
        OperationKind::Prefill => "prefill",
        OperationKind::Decode => "decode",
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn positive(v: f64, fallback: f64) -> f64 {
    if v.is_finite() && v > 0.0 {
        v
    } else {
        fallback
    }
}
