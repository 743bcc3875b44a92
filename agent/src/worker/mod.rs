//! The worker role: one process per GPU host (spec §3, §5.4 worker endpoint).
//!
//! It connects out to the router ([`link`]), says hello with an epoch that grows on every
//! process start ([`epoch`]), heartbeats with strictly increasing sequence numbers that
//! carry page-pool and queue observations and the GPU prefixes it holds, and runs the
//! worker state machine of `den-protocol` ([`actor`]) against the real page pool
//! ([`pool`]). Restores, prefills and decodes run on one serialized execution queue per
//! device ([`device`]); completed routes are checkpointed into the tiers and published
//! only after the storage receipts ([`store`]). Models placed through the router's
//! management API are downloaded, verified, installed and loaded by [`models`]; their
//! download attempts and runners ride on every heartbeat.
//!
//! Start one with [`start`] (library use: tests, benchmarks, `den-agent local`) or
//! [`run`] (the CLI). Both stop on their shutdown signal by draining: new offers are
//! declined `draining`, in-flight work finishes (up to `drain_timeout`, then it is
//! cancelled and quiesced), and only then is the page memory released.

pub mod actor;
pub mod admin;
pub mod device;
pub mod epoch;
pub mod faults;
pub mod fetch;
pub mod identity;
pub mod link;
pub mod meters;
pub mod models;
pub mod pool;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use den_protocol::chunk::DEFAULT_CHUNK_SIZE;
use den_protocol::ids::{ModelFingerprint, NodeId, WorkerId};
use den_protocol::pool::{Geometry, PagePool};
use den_protocol::wire::{DEFAULT_MAX_FRAME, Hello, PROTOCOL_VERSION};
use den_protocol::worker::Worker;

use crate::auth::Token;
use crate::engine::EngineCosts;
use crate::memory::{ArenaGeometry, CudaMemory, HostMemory, MemoryError, PageMemory};
use crate::metrics::Metrics;
use crate::model_file::ModelFile;
use crate::tiers::{ObjectConfig, ObjectTier, RamTier, SsdTier, TierError};

use self::actor::Actor;
use self::device::{DeviceConfig, DeviceContext};
use self::faults::Faults;
use self::link::LinkOptions;
use self::meters::{Calibration, QueueMeter};
use self::pool::SharedPool;
use self::store::Tiers;

/// Where the page arena lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Plain host memory (works everywhere).
    #[default]
    Host,
    /// GPU memory through the CUDA driver (loaded at run time).
    Cuda,
}

/// Everything a worker needs, already validated (the CLI layers flags, environment and
/// the config file into this).
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The router, e.g. `ws://10.0.0.1:7070` (see [`link::agents_url`]).
    pub router: String,
    pub token: Option<Token>,
    pub name: WorkerId,
    pub node: NodeId,
    pub backend: Backend,
    /// CUDA device ordinal.
    pub device: usize,
    pub pages: u32,
    pub page_size: u32,
    /// Bytes of one synthetic KV row (all layers' K and V of one token).
    pub kv_bytes_per_token: u64,
    /// Model fingerprints the synthetic engine serves; with `model_file`, the public id of
    /// that model (at most one).
    pub models: Vec<ModelFingerprint>,
    /// A GGUF file to serve for real (CPU forward pass over the host page arena): its KV
    /// row size replaces `kv_bytes_per_token`, its context caps `max_context`, and the
    /// worker advertises its fingerprint `ID@KV` (see [`crate::model_file`]).
    pub model_file: Option<PathBuf>,
    /// `model_file` already opened (an in-process cluster opens and hashes it once for
    /// every worker and the router); wins over `model_file`.
    pub opened_model: Option<ModelFile>,
    /// Threads of the model's forward pass (default: every core).
    pub model_threads: Option<usize>,
    /// Rows of one batched step of a real model (decode tokens first, then prompt rows).
    pub batch_tokens: u32,
    /// How long the idle device thread polls its queue before it parks.
    pub idle_spin: Duration,
    pub costs: EngineCosts,
    /// RAM tier capacity (0 disables the tier).
    pub ram_bytes: u64,
    /// SSD tier capacity under `data_dir/ssd` (0 disables the tier).
    pub ssd_bytes: u64,
    pub data_dir: PathBuf,
    pub object_store: Option<ObjectConfig>,
    pub chunk_size: u32,
    /// Largest context admitted (default: the whole pool).
    pub max_context: Option<u32>,
    pub metrics_listen: Option<SocketAddr>,
    /// Loopback address of the fault-injection endpoint (tests only; off when `None`).
    pub fault_admin: Option<SocketAddr>,
    pub drain_timeout: Duration,
    pub verify_restores: bool,
    pub max_frame: usize,
    /// KV page pool budget of a placed model's runner (default: the bytes of the
    /// worker's own arena, pages × page size × kv bytes per token).
    pub kv_budget: Option<u64>,
}

impl WorkerOptions {
    /// Defaults for a worker named `name` connecting to `router`, with its data under
    /// `data_dir`: host backend, 1024 pages of 16 tokens, 4 KiB rows, one model
    /// `den-synthetic`, default engine costs, 1 GiB RAM tier, no SSD or object tier.
    pub fn new(router: impl Into<String>, name: &str, data_dir: impl Into<PathBuf>) -> Self {
        WorkerOptions {
            router: router.into(),
            token: None,
            name: WorkerId::from(name),
            node: NodeId::from(name),
            backend: Backend::Host,
            device: 0,
            pages: 1024,
            page_size: 16,
            kv_bytes_per_token: 4096,
            models: vec![ModelFingerprint::from(DEFAULT_MODEL)],
            model_file: None,
            opened_model: None,
            model_threads: None,
            batch_tokens: DEFAULT_BATCH_TOKENS,
            idle_spin: DEFAULT_IDLE_SPIN,
            costs: EngineCosts::default(),
            ram_bytes: 1 << 30,
            ssd_bytes: 0,
            data_dir: data_dir.into(),
            object_store: None,
            chunk_size: DEFAULT_CHUNK_SIZE,
            max_context: None,
            metrics_listen: None,
            fault_admin: None,
            drain_timeout: Duration::from_secs(30),
            verify_restores: true,
            max_frame: DEFAULT_MAX_FRAME,
            kv_budget: None,
        }
    }
}

/// Rows of one batched step: on the CPU a weight pass of 64 rows costs little more per
/// row than a longer one (den-model runs 64 rows per pass), and keeps a step, which every
/// running decode waits for, to one pass.
pub const DEFAULT_BATCH_TOKENS: u32 = 64;

/// How long an idle device thread polls its queue before it parks (`--idle-spin`); by
/// default it parks at once. Waking a parked thread is a futex wake and, where the idle
/// vCPU has halted, a VM exit and an inter-processor interrupt: 25–45 µs on the VMs den is
/// measured on, whose kernels turn the guest's own halt-polling off
/// (`haltpoll.guest_halt_poll_ns=0`). Polling 200 µs halves the loopback bench's round
/// trip there, but the polling thread holds a core the rest of the path needs: on those
/// 2-vCPU VMs it cost the bench's throughput a fifth and made sequential HTTP requests
/// to separate router and worker processes no faster (BENCHMARKS.md, "Polling before
/// parking"). So it is an operator's choice for hosts with cores to spare, not a default.
pub const DEFAULT_IDLE_SPIN: Duration = Duration::ZERO;

/// The longest `--idle-spin` accepted: past this, polling is a core burnt, not a wake
/// saved.
pub const MAX_IDLE_SPIN: Duration = Duration::from_millis(10);

/// The model the synthetic engine serves when none is named.
pub const DEFAULT_MODEL: &str = "den-synthetic";

/// Why a worker could not start. One line each, saying what to do.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Epoch(#[from] epoch::EpochError),
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("storage tier: {0}")]
    Tier(#[from] TierError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the device thread: {0}")]
    Thread(std::io::Error),
}

/// Addresses a started worker serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerEndpoints {
    pub metrics: Option<SocketAddr>,
    pub fault_admin: Option<SocketAddr>,
}

/// A running worker.
pub struct RunningWorker {
    pub endpoints: WorkerEndpoints,
    pub epoch: den_protocol::ids::Epoch,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl RunningWorker {
    /// Drain (bounded by `drain_timeout`), release memory and wait until done.
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Wait until the worker stopped on its own (it only does on shutdown).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Run a worker until `shutdown` completes, then drain and stop.
pub async fn run(
    opts: WorkerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WorkerError> {
    let worker = start(opts).await?;
    let RunningWorker { stop, task, .. } = worker;
    shutdown.await;
    if let Some(s) = stop {
        let _ = s.send(());
    }
    let _ = task.await;
    Ok(())
}

/// Opens the worker's model file (off the runtime: opening hashes every tensor), unless
/// it came opened, and makes the options describe it.
async fn open_model(opts: &mut WorkerOptions) -> Result<Option<ModelFile>, WorkerError> {
    let model = match (opts.opened_model.take(), opts.model_file.clone()) {
        (Some(m), _) => m,
        (None, Some(path)) => {
            if opts.models.len() > 1 {
                return Err(WorkerError::Config(
                    "--model-file serves one model: give at most one --model (its public id)"
                        .into(),
                ));
            }
            let id = opts
                .models
                .first()
                .map(|m| m.as_str().to_owned())
                .filter(|m| m != DEFAULT_MODEL);
            tokio::task::spawn_blocking(move || ModelFile::open(&path, id.as_deref()))
                .await
                .map_err(|e| WorkerError::Config(format!("opening the model file panicked: {e}")))?
                .map_err(WorkerError::Config)?
        }
        (None, None) => return Ok(None),
    };
    // The host arena runs the model on the CPU; the CUDA arena on its GPU
    // (`den_model::gpu`), which needs the `cuda` feature.
    if opts.backend != Backend::Host && !(cfg!(feature = "cuda") && opts.backend == Backend::Cuda) {
        return Err(WorkerError::Config(format!(
            "--model-file {}: this den-agent runs real models on the CPU (host page arena) only; start the worker with --backend host",
            model.path.display()
        )));
    }
    opts.kv_bytes_per_token = model.row_bytes();
    opts.models = vec![model.fingerprint().clone()];
    // The model's trained context, within what the pool holds (the default of a
    // synthetic worker) and what the operator allows.
    let pool = u64::from(opts.pages) * u64::from(opts.page_size);
    let context = model
        .text
        .context_length
        .min(u32::try_from(pool).unwrap_or(u32::MAX));
    opts.max_context = Some(opts.max_context.map_or(context, |m| m.min(context)));
    tracing::info!(
        model = %model.fingerprint(),
        file = %model.path.display(),
        row_bytes = opts.kv_bytes_per_token,
        context,
        "model loaded"
    );
    Ok(Some(model))
}

/// Start a worker: advance the epoch, open memory and tiers, bind the metrics (and
/// fault) endpoints, start the device thread, the router link and the actor.
pub async fn start(mut opts: WorkerOptions) -> Result<RunningWorker, WorkerError> {
    let url = link::agents_url(&opts.router).map_err(WorkerError::Config)?;
    let model_file = open_model(&mut opts).await?;
    if opts.models.is_empty() {
        return Err(WorkerError::Config(
            "no model: name at least one with --model".into(),
        ));
    }
    opts.costs
        .validate()
        .map_err(|e| WorkerError::Config(e.to_string()))?;
    if opts.chunk_size == 0 || opts.page_size == 0 || opts.pages == 0 {
        return Err(WorkerError::Config(
            "--chunk-size, --page-size and --pages must be positive".into(),
        ));
    }
    if let Some(addr) = opts.fault_admin
        && !addr.ip().is_loopback()
    {
        return Err(WorkerError::Config(format!(
            "--fault-admin {addr} is not a loopback address: the fault-injection endpoint is a test facility and only listens on 127.0.0.1 or ::1"
        )));
    }
    let epoch = epoch::advance(&opts.data_dir)?;
    let credential = identity::load_or_create(&opts.data_dir)?;
    let geometry = ArenaGeometry::new(opts.page_size, opts.pages, opts.kv_bytes_per_token)?;
    let memory: Box<dyn PageMemory> = match opts.backend {
        Backend::Host => Box::new(HostMemory::open(geometry)?),
        Backend::Cuda => {
            let device = opts.device;
            let m = tokio::task::spawn_blocking(move || CudaMemory::open(device, geometry))
                .await
                .map_err(|e| {
                    WorkerError::Config(format!("opening the CUDA device panicked: {e}"))
                })??;
            Box::new(m)
        }
    };
    let backend = memory.describe();
    let pool = SharedPool::new(
        PagePool::new(Geometry::new(
            opts.page_size,
            opts.pages,
            geometry.page_bytes(),
        ))
        .map_err(|e| WorkerError::Config(e.to_string()))?,
    );
    let tiers = Tiers {
        ram: (opts.ram_bytes > 0).then(|| Arc::new(RamTier::new(opts.ram_bytes))),
        ssd: if opts.ssd_bytes > 0 {
            Some(Arc::new(SsdTier::open(
                opts.data_dir.join("ssd"),
                opts.ssd_bytes,
            )?))
        } else {
            None
        },
        object: match &opts.object_store {
            Some(cfg) => Some(Arc::new(ObjectTier::open(cfg)?)),
            None => None,
        },
    };
    if tiers.is_empty() {
        tracing::warn!(
            "no storage tier (--ram-bytes 0, no --ssd-bytes, no --object-store): completed routes are released at once, so nothing is cached"
        );
    }
    let metrics = Arc::new(Metrics::new());
    let calibration = Arc::new(Calibration::default());
    let queue = Arc::new(QueueMeter::default());
    let faults = Arc::new(Faults::default());
    let totals = Arc::new(Mutex::new(Default::default()));
    let engine_plan = Arc::new(Mutex::new(None));
    let (device_tx, device_rx) = mpsc::unbounded_channel();
    let device_ctx = DeviceContext {
        pool: pool.clone(),
        tiers: tiers.clone(),
        runtime: tokio::runtime::Handle::current(),
        events: device_tx,
        config: DeviceConfig {
            costs: opts.costs,
            chunk_size: opts.chunk_size,
            row_bytes: opts.kv_bytes_per_token,
            verify_restores: opts.verify_restores,
            batch_tokens: opts.batch_tokens,
            idle_spin: opts.idle_spin,
        },
        metrics: Arc::clone(&metrics),
        calibration: Arc::clone(&calibration),
        queue: Arc::clone(&queue),
        faults: Arc::clone(&faults),
        totals: Arc::clone(&totals),
        engine_plan: Arc::clone(&engine_plan),
    };
    let static_model = model_file.is_some();
    let device = device::spawn(memory, device_ctx.clone(), model_file, opts.model_threads)
        .map_err(WorkerError::Config)?;
    let (models_tx, models_rx) = mpsc::unbounded_channel();
    let models = models::Models::open(
        models::ModelsConfig {
            dir: opts.data_dir.join("models"),
            backend: opts.backend,
            device: opts.device,
            page_size: opts.page_size,
            kv_budget: opts.kv_budget.unwrap_or_else(|| geometry.arena_bytes()),
            model_threads: opts.model_threads,
            static_model,
            worker: opts.name.clone(),
            epoch,
        },
        models_tx,
    )
    .map_err(|e| {
        WorkerError::Config(format!(
            "cannot prepare {}: {e}",
            opts.data_dir.join("models").display()
        ))
    })?;
    let machine = Worker::new(
        opts.name.clone(),
        epoch,
        opts.models.iter().cloned(),
        pool.clone(),
    );

    let (admin_tx, admin_rx) = mpsc::channel(64);
    let metrics_addr = match opts.metrics_listen {
        Some(addr) => Some(
            admin::serve_metrics(addr, Arc::clone(&metrics), admin_tx.clone())
                .await
                .map_err(|source| WorkerError::Listen { addr, source })?,
        ),
        None => None,
    };
    let fault_addr = match opts.fault_admin {
        Some(addr) => Some(
            admin::serve_faults(addr, Arc::clone(&faults), admin_tx.clone())
                .await
                .map_err(|source| WorkerError::Listen { addr, source })?,
        ),
        None => None,
    };
    drop(admin_tx);

    let (link_tx, link_rx) = mpsc::channel(1024);
    let (stop_link_tx, stop_link_rx) = watch::channel(false);
    let link_opts = LinkOptions {
        url,
        token: opts.token.clone(),
        hello: Hello {
            protocol_version: PROTOCOL_VERSION,
            worker_id: opts.name.clone(),
            node: opts.node.clone(),
            epoch,
            credential: Some(credential),
        },
        max_frame: opts.max_frame,
    };
    let link_task = tokio::spawn(link::run(
        link_opts,
        link_tx,
        Arc::clone(&faults),
        Arc::clone(&metrics),
        stop_link_rx,
    ));
    tracing::info!(
        worker = %opts.name,
        node = %opts.node,
        %epoch,
        backend = %backend,
        pages = opts.pages,
        page_size = opts.page_size,
        tiers = ?tiers.kinds(),
        "worker started"
    );
    let (stop_tx, stop_rx) = oneshot::channel();
    let actor = Actor::new(actor::ActorParts {
        opts: Arc::new(opts),
        machine,
        pool,
        device,
        tiers,
        metrics,
        calibration,
        queue,
        totals,
        backend,
        epoch,
        models,
        device_ctx,
    });
    let task = tokio::spawn(async move {
        actor
            .run(actor::ActorInputs {
                device: device_rx,
                link: link_rx,
                admin: admin_rx,
                models: models_rx,
                stop: stop_rx,
            })
            .await;
        let _ = stop_link_tx.send(true);
        let _ = link_task.await;
    });
    Ok(RunningWorker {
        endpoints: WorkerEndpoints {
            metrics: metrics_addr,
            fault_admin: fault_addr,
        },
        epoch,
        stop: Some(stop_tx),
        task,
    })
}
