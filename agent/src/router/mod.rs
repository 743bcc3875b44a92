//! The router role: the management node every worker connects to (spec §2, §5.4).
//!
//! One actor task ([`actor`]) owns the router state machine of `den-protocol` — the only
//! decision-maker — together with discovery (connection-bound routes and heartbeat
//! expiry), the chunk catalog, a timer wheel ([`timers`]), the worker connections'
//! outbound queues, the per-request delivery channels and the console feed. Everything
//! reaches the machine through the actor's inbox, so decisions are made one at a time
//! against one consistent state.
//!
//! Endpoints, all on one HTTP server ([`RouterServer`]):
//! - `GET /v1/agents`: the workers' WebSocket (shared token checked before the upgrade;
//!   first frame `hello` with a protocol-version check, answered `welcome` or `refused`);
//! - `GET /v1/console`: the console feed WebSocket (same token);
//! - `POST /v1/generate`: den's native generation endpoint (token ids or text in, NDJSON
//!   deliveries out; a client that disconnects cancels its request);
//! - `GET /v1/requests/{id}`, `POST /v1/requests/{id}/cancel`: a decision record, a
//!   cancellation;
//! - `GET /v1/workers`, `POST /v1/workers/{id}/drain` and `/undrain`;
//! - `GET /metrics` (Prometheus text), `GET /healthz`.
//!
//! The OpenAI-compatible ingress and the management API ([`manage`]: `/node_id`,
//! `/state`, `/instance/…`, `/models/…`) are mounted by their own modules
//! ([`RouterServer::with_ingress`], [`RouterServer::with_management`]); they reach the
//! router through [`RouterHandle`], which implements [`crate::serving::Submitter`].

pub mod actor;
pub mod conn;
pub mod feed;
pub mod generate;
pub mod http;
pub mod identity;
pub mod manage;
pub mod timers;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use den_protocol::chunk::DEFAULT_CHUNK_SIZE;
use den_protocol::decision::DecisionRecord;
use den_protocol::discovery::Discovery;
use den_protocol::ids::{ModelFingerprint, NodeId, RequestId, WorkerId};
use den_protocol::observation::Observation;
use den_protocol::request::GenerationRequest;
use den_protocol::router::RouterConfig;
use den_protocol::wire::DEFAULT_MAX_FRAME;

use crate::auth::Token;
use crate::metrics::Metrics;
use crate::serving::{DELIVERY_QUEUE, DeliveryStream, ServedModel, SubmitError, Submitter};

use self::actor::Command;

/// Router settings (the CLI layers flags, environment and config file into this).
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// This router's name in the console feed.
    pub name: NodeId,
    pub token: Option<Token>,
    /// Inference API keys (`--api-keys-file`): the inference endpoints take them, the
    /// rest answer 403 to them ([`crate::api_keys`]).
    pub api_keys: Option<crate::api_keys::ApiKeys>,
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
    pub offer_timeout: Duration,
    /// Deadline of a request submitted without one.
    pub request_deadline: Duration,
    /// Requests that may wait for KV pages at once (`--max-waiting`; 0: a request no
    /// worker can hold now is refused at once, 503 with `Retry-After`).
    pub max_waiting: usize,
    /// How long finished requests' decision records are kept.
    pub retention: Duration,
    /// Chunk size of the prefix chain; must equal the workers' `--chunk-size`.
    pub chunk_size: u32,
    pub max_frame: usize,
    /// How often the console feed repeats a full snapshot.
    pub snapshot_interval: Duration,
    /// On shutdown, how long in-flight requests may take before they are cancelled.
    pub drain_timeout: Duration,
    /// The model catalog of the management API (`--catalog DIR`; empty by default).
    pub catalog: Arc<manage::ModelCatalog>,
    /// Where the router keeps its copies of remote gguf cards' files (`--catalog-cache`).
    pub catalog_cache: std::path::PathBuf,
    /// Tokenizers and chat templates of the real models served (`--model-file`).
    pub text_models: Arc<crate::ingress::TextModels>,
    /// Connections the listener admits and how long they may stay silent.
    pub limits: crate::listener::Limits,
    /// TLS for https and wss (`--tls-cert`, `--tls-key`); plain HTTP when `None`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for RouterOptions {
    fn default() -> Self {
        let d = RouterConfig::default();
        RouterOptions {
            name: NodeId::from("router"),
            token: None,
            api_keys: None,
            heartbeat_interval: Duration::from_millis(1000),
            heartbeat_timeout: Duration::from_millis(Discovery::DEFAULT_HEARTBEAT_TIMEOUT_MS),
            offer_timeout: Duration::from_millis(d.offer_timeout_ms),
            request_deadline: Duration::from_millis(d.default_deadline_ms),
            max_waiting: den_protocol::router_node::DEFAULT_MAX_WAITING,
            retention: Duration::from_millis(d.retention_ms),
            chunk_size: DEFAULT_CHUNK_SIZE,
            max_frame: DEFAULT_MAX_FRAME,
            snapshot_interval: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(30),
            catalog: Arc::new(manage::ModelCatalog::default()),
            catalog_cache: manage::gguf_cards::default_cache(),
            text_models: Arc::new(crate::ingress::TextModels::new()),
            limits: crate::listener::Limits::default(),
            tls: None,
        }
    }
}

/// Commands buffered in the actor's inbox before submissions are refused as overload.
pub const INBOX: usize = 65_536;

/// State shared by the actor and every handle.
pub(crate) struct Shared {
    pub(crate) opts: RouterOptions,
    pub(crate) metrics: Arc<Metrics>,
    /// Ids the router state machine knows (live or retained): a new submit with one of
    /// them is refused instead of being silently ignored by the machine.
    known: Mutex<BTreeSet<RequestId>>,
    models: RwLock<Vec<ServedModel>>,
    /// Placed instances and the model fingerprint each serves (for `?den_instance=`).
    instances: RwLock<BTreeMap<String, ModelFingerprint>>,
    shutting_down: AtomicBool,
    next_connection: AtomicU64,
    next_request: AtomicU64,
    pub(crate) feed: broadcast::Sender<Arc<str>>,
    /// Turns true when the actor stopped: console feeds close, worker connections stop
    /// reading and send what the actor queued last (its `refused: shutdown`).
    pub(crate) closing: watch::Sender<bool>,
    /// Every open worker connection and console feed: `serve` waits (bounded) for them
    /// to say goodbye before it returns, because a process that exits right after would
    /// drop their last frames unsent.
    pub(crate) sockets: TaskTracker,
    pub(crate) started_unix_ms: u64,
    /// The instance that served each completed request of a placed model, until its
    /// record is collected (the ingress names it as `served_by`).
    served_by: Mutex<BTreeMap<RequestId, String>>,
    /// The credential (its sha256) each worker name was first seen with (`conn.rs`).
    pub(crate) identities: Mutex<BTreeMap<WorkerId, [u8; 32]>>,
}

impl Shared {
    pub(crate) fn known(&self) -> MutexGuard<'_, BTreeSet<RequestId>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_models(&self, models: Vec<ServedModel>) {
        *self.models.write().unwrap_or_else(|p| p.into_inner()) = models;
    }

    pub(crate) fn set_instances(&self, instances: BTreeMap<String, ModelFingerprint>) {
        *self.instances.write().unwrap_or_else(|p| p.into_inner()) = instances;
    }

    pub(crate) fn served_by(&self) -> MutexGuard<'_, BTreeMap<RequestId, String>> {
        self.served_by.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A cheap, cloneable handle to a running router: submit, cancel, inspect. This is what
/// the OpenAI ingress holds (as a [`Submitter`]).
#[derive(Clone)]
pub struct RouterHandle {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
}

impl RouterHandle {
    /// Submit with an explicit deadline (relative to now); `None` uses the router's.
    pub fn submit_with_deadline(
        &self,
        request: GenerationRequest,
        deadline: Option<Duration>,
    ) -> Result<DeliveryStream, SubmitError> {
        self.submit_to(request, deadline, None)
    }

    /// Submit, offering the request only to the worker of placed instance `pin` (no
    /// candidate when the instance is unknown).
    pub fn submit_to(
        &self,
        request: GenerationRequest,
        deadline: Option<Duration>,
        pin: Option<den_protocol::skulk::InstanceId>,
    ) -> Result<DeliveryStream, SubmitError> {
        if self.shared.shutting_down.load(Ordering::Relaxed) {
            return Err(SubmitError::ShuttingDown);
        }
        let id = request.id.clone();
        if !self.shared.known().insert(id.clone()) {
            return Err(SubmitError::DuplicateId(id));
        }
        let (tx, rx) = mpsc::channel(DELIVERY_QUEUE);
        let cmd = Command::Submit {
            request: Arc::new(request),
            deliveries: tx,
            deadline,
            pin,
        };
        match self.tx.try_send(cmd) {
            Ok(()) => Ok(rx),
            Err(e) => {
                self.shared.known().remove(&id);
                Err(match e {
                    mpsc::error::TrySendError::Full(_) => SubmitError::Overloaded(format!(
                        "{INBOX} commands are waiting for the router; retry shortly"
                    )),
                    mpsc::error::TrySendError::Closed(_) => SubmitError::ShuttingDown,
                })
            }
        }
    }

    /// The decision record of a request the router still holds.
    pub async fn record(&self, request: &RequestId) -> Option<DecisionRecord> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Record {
            request: request.clone(),
            reply,
        })
        .await;
        rx.await.ok().flatten()
    }

    /// Pins or checks a worker's credential ([`identity::admit`]).
    pub(crate) fn admit_identity(
        &self,
        worker: &WorkerId,
        credential: Option<&str>,
    ) -> identity::Admission {
        let mut pins = self
            .shared
            .identities
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        identity::admit(&mut pins, worker, credential)
    }

    /// True once a shutdown began (no new requests are taken).
    pub fn shutting_down(&self) -> bool {
        self.shared.shutting_down.load(Ordering::Relaxed)
    }

    /// The newest observation of every live worker.
    pub async fn workers(&self) -> Vec<Observation> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Workers { reply }).await;
        rx.await.unwrap_or_default()
    }

    /// Ask a worker to stop (or resume) taking new offers. False when it is not connected.
    pub async fn drain(&self, worker: &WorkerId, draining: bool) -> bool {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Drain {
            worker: worker.clone(),
            draining,
            reply,
        })
        .await;
        rx.await.unwrap_or(false)
    }

    /// The router's metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    pub fn options(&self) -> &RouterOptions {
        &self.shared.opts
    }

    /// A fresh request id for callers that have none (`gen-<n>-<start time>`).
    pub fn next_request_id(&self) -> RequestId {
        let n = self.shared.next_request.fetch_add(1, Ordering::Relaxed);
        RequestId::new(format!("gen-{}-{n}", self.shared.started_unix_ms))
    }

    /// Stop taking requests, let in-flight ones finish for up to `drain`, cancel the
    /// rest, close worker and console connections, stop the actor.
    pub async fn shutdown(&self, drain: Duration) {
        self.shared.shutting_down.store(true, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        self.send(Command::Shutdown { drain, reply }).await;
        let _ = rx.await;
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn next_connection(&self) -> u64 {
        self.shared.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) async fn send(&self, cmd: Command) {
        let _ = self.tx.send(cmd).await;
    }
}

impl Submitter for RouterHandle {
    fn submit(&self, request: GenerationRequest) -> Result<DeliveryStream, SubmitError> {
        self.submit_with_deadline(request, None)
    }

    fn submit_pinned(
        &self,
        request: GenerationRequest,
        instance: Option<&str>,
    ) -> Result<DeliveryStream, SubmitError> {
        if let Some(instance) = instance {
            let serves = self
                .shared
                .instances
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(instance)
                .cloned();
            match serves {
                None => return Err(SubmitError::UnknownInstance(instance.to_owned())),
                Some(f) if f != request.model => {
                    return Err(SubmitError::InstanceModel {
                        instance: instance.to_owned(),
                        serves: f.public_id().to_owned(),
                        asked: request.model.public_id().to_owned(),
                    });
                }
                Some(_) => {}
            }
        }
        let pin = instance.map(den_protocol::skulk::InstanceId::from);
        self.submit_to(request, None, pin)
    }

    fn cancel(&self, request: &RequestId) {
        let cmd = Command::Cancel {
            request: request.clone(),
        };
        match self.tx.try_send(cmd) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(cmd)) => {
                // A cancellation must not be lost to a momentarily full inbox.
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let tx = self.tx.clone();
                    rt.spawn(async move {
                        let _ = tx.send(cmd).await;
                    });
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn models(&self) -> Vec<ServedModel> {
        self.shared
            .models
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn served_by(&self, request: &RequestId) -> Option<String> {
        self.shared.served_by().get(request).cloned()
    }
}

/// The router's HTTP server: built-in endpoints plus whatever is mounted with
/// [`RouterServer::with_routes`].
pub struct RouterServer {
    handle: RouterHandle,
    app: axum::Router,
    actor: JoinHandle<()>,
}

impl RouterServer {
    /// Start the router actor (needs a tokio runtime).
    pub fn start(opts: RouterOptions) -> RouterServer {
        let (tx, rx) = mpsc::channel(INBOX);
        // Bounded: a lagging console gets a fresh (bounded) snapshot instead of a backlog.
        let (feed, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            metrics: Arc::new(Metrics::new()),
            known: Mutex::new(BTreeSet::new()),
            models: RwLock::new(Vec::new()),
            instances: RwLock::new(BTreeMap::new()),
            shutting_down: AtomicBool::new(false),
            next_connection: AtomicU64::new(1),
            next_request: AtomicU64::new(1),
            feed,
            closing: watch::channel(false).0,
            sockets: TaskTracker::new(),
            started_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            served_by: Mutex::new(BTreeMap::new()),
            identities: Mutex::new(BTreeMap::new()),
            opts,
        });
        let actor = tokio::spawn(actor::RouterActor::new(Arc::clone(&shared)).run(rx));
        let handle = RouterHandle { tx, shared };
        let app = http::routes(handle.clone());
        RouterServer { handle, app, actor }
    }

    pub fn handle(&self) -> RouterHandle {
        self.handle.clone()
    }

    /// Mount more routes (the OpenAI ingress, the management API) on the same server:
    /// `server.with_routes(ingress::routes(server.handle()))`.
    pub fn with_routes(mut self, routes: axum::Router) -> Self {
        self.app = self.app.merge(routes);
        self
    }

    /// Mount the OpenAI-compatible ingress (`/v1/models`, `/v1/chat/completions`,
    /// `/v1/completions`) with this router's token and metrics registry.
    pub fn with_ingress(self) -> Self {
        let config = crate::ingress::IngressConfig {
            token: self.handle.shared.opts.token.clone(),
            api_keys: self.handle.shared.opts.api_keys.clone(),
            metrics: Arc::clone(self.handle.metrics()),
            text_models: Arc::clone(&self.handle.shared.opts.text_models),
            ..crate::ingress::IngressConfig::default()
        };
        let routes = crate::ingress::routes(Arc::new(self.handle.clone()), config);
        self.with_routes(routes)
    }

    /// Mount the management API ([`manage::http`]) with this router's token and catalog.
    pub fn with_management(self) -> Self {
        let routes = manage::http::routes(self.handle.clone());
        self.with_routes(routes)
    }

    /// Bind `addr` (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
        TcpListener::bind(addr).await
    }

    /// Serve until `shutdown` completes; then stop taking requests, drain in-flight ones
    /// (bounded by the drain timeout), close connections and return.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let RouterServer { handle, app, actor } = self;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        // Bounded connections, header and idle deadlines, and TCP_NODELAY (small SSE
        // and NDJSON writes must not wait for the peer's delayed ACK).
        let listener = crate::listener::GuardedListener::new(listener, handle.shared.opts.limits)
            .with_tls(handle.shared.opts.tls.clone());
        let server = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = stop_rx.await;
        });
        let mut server = Box::pin(server.into_future());
        tokio::select! {
            r = &mut server => return r,
            _ = shutdown => {}
        }
        tracing::info!("shutting down: draining in-flight requests");
        handle.shutdown(handle.shared.opts.drain_timeout).await;
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        let _ = actor.await;
        // Each socket's own goodbye is bounded by the same (`crate::ws::goodbye`).
        let sockets = &handle.shared.sockets;
        sockets.close();
        if tokio::time::timeout(crate::ws::GOODBYE, sockets.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = sockets.len(),
                "closing with sockets that did not finish their goodbye within {} s",
                crate::ws::GOODBYE.as_secs()
            );
        }
        tracing::info!("router stopped");
        Ok(())
    }
}
