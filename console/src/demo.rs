//! `den demo`: the embedded default. A den router, three workers with host-memory page
//! pools and a synthetic workload with shared prefixes, all on 127.0.0.1 inside this
//! process, with the console attached (or, `--headless`, a summary after a fixed time).
//!
//! The cluster runs on its own tokio runtime (its own threads) so a busy workload never
//! delays the console's input handling. The agents are the real runtimes of den-agent
//! (WebSockets, page pools, tiers, execution queues), only in-process. The engine is a
//! real model when one is present ([`default_model_file`]: `--model-file`,
//! `$DEN_MODEL_FILE`, or SmolLM2-135M in `tests/fetch-models`' cache): the workers run its
//! forward pass on the CPU over their page pools and the router tokenizes for it.
//! Otherwise it is the model-free synthetic engine (declared costs that really take that
//! time), and the demo says so in one line, with how to fetch the real model.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use den_agent::auth::Token;
use den_agent::engine::EngineCosts;
use den_agent::ingress::TextModels;
use den_agent::model_file::ModelFile;
use den_agent::router::manage::ModelCatalog;
use den_agent::router::{RouterOptions, RouterServer};
use den_agent::worker::{self, RunningWorker, WorkerOptions};
use den_agent::workload::{self, WorkloadReport, WorkloadSpec};
use den_protocol::session::{SourceId, SourceKind};

use crate::config::{Settings, SourceSpec};

/// How to run the demo.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub workers: usize,
    /// Pages per worker (16 tokens each).
    pub pages: u32,
    /// How long the workload runs (`None`: until the console quits).
    pub duration: Option<Duration>,
    /// Conversations in flight at once.
    pub concurrency: usize,
    pub seed: u64,
    /// The cluster's shared token (`DEN_TOKEN`/`--token`); a fresh random one otherwise.
    pub token: Option<String>,
    /// A GGUF model every worker serves (`None`: the synthetic engine).
    pub model_file: Option<PathBuf>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            workers: 3,
            pages: 512,
            duration: None,
            concurrency: 4,
            seed: 1,
            token: None,
            model_file: None,
        }
    }
}

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("demo: cannot start the cluster runtime: {0}")]
    Runtime(std::io::Error),
    #[error("demo: cannot create a temporary directory: {0}")]
    TempDir(std::io::Error),
    #[error("demo: cannot listen on 127.0.0.1: {0}")]
    Bind(std::io::Error),
    #[error("demo: worker {name} did not start: {detail}")]
    Worker { name: String, detail: String },
    #[error("demo: only {ready} of {want} workers registered within 20 s")]
    NotReady { ready: usize, want: usize },
    #[error("demo: cannot write the demo model catalog: {0}")]
    Catalog(String),
    #[error("demo: {0}")]
    Model(String),
}

/// A running demo cluster. Dropping it stops everything (shutdown is best effort);
/// [`Demo::stop`] drains cleanly.
pub struct Demo {
    runtime: Option<Runtime>,
    pub router_url: String,
    pub token: String,
    workers: Vec<RunningWorker>,
    router_stop: Option<oneshot::Sender<()>>,
    router_task: Option<JoinHandle<std::io::Result<()>>>,
    workload: Option<JoinHandle<WorkloadReport>>,
    _data: tempfile::TempDir,
}

impl Demo {
    /// Start the router, the workers and the workload; returns once every worker has
    /// registered with the router.
    pub fn start(opts: &DemoOptions) -> Result<Demo, DemoError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("den-demo")
            .enable_all()
            .build()
            .map_err(DemoError::Runtime)?;
        let data = tempfile::Builder::new()
            .prefix("den-demo-")
            .tempdir()
            .map_err(DemoError::TempDir)?;
        let token = opts.token.clone().unwrap_or_else(demo_token);
        let model = match &opts.model_file {
            Some(path) => Some(ModelFile::open(path, Some(REAL_MODEL)).map_err(DemoError::Model)?),
            None => None,
        };
        let (router_url, router_stop, router_task, workers) = runtime.block_on(start_cluster(
            opts,
            &token,
            data.path().to_path_buf(),
            model.as_ref(),
        ))?;
        let base = match &model {
            // A CPU forward pass: shorter prompts, one conversation per worker.
            Some(_) => WorkloadSpec {
                concurrency: opts.workers.max(1),
                system_tokens: 128,
                turn_tokens: 32,
                ..WorkloadSpec::default()
            },
            None => WorkloadSpec {
                concurrency: opts.concurrency.max(1),
                ..WorkloadSpec::default()
            },
        };
        let spec = WorkloadSpec {
            duration: opts.duration.unwrap_or(Duration::from_secs(24 * 3600)),
            seed: opts.seed,
            // Name it: once `den/demo-chat` is placed, two models are served.
            model: Some(match &model {
                Some(_) => REAL_MODEL.to_owned(),
                None => den_agent::worker::DEFAULT_MODEL.to_owned(),
            }),
            ..base
        };
        let url = router_url.clone();
        let tok = token.clone();
        let workload = runtime.spawn(async move { workload::run(&url, Some(&tok), &spec).await });
        Ok(Demo {
            runtime: Some(runtime),
            router_url,
            token,
            workers,
            router_stop: Some(router_stop),
            router_task: Some(router_task),
            workload: Some(workload),
            _data: data,
        })
    }

    /// Console settings pointing at this cluster's router.
    pub fn settings(&self, base: &Settings) -> Settings {
        let mut s = base.clone();
        s.sources = vec![SourceSpec {
            id: SourceId::new("demo"),
            kind: SourceKind::DenRouter,
            url: self.router_url.clone(),
        }];
        s.token = Some(self.token.clone());
        s
    }

    /// Wait for the workload to finish (headless runs) and return its report.
    pub fn wait_workload(&mut self) -> Option<WorkloadReport> {
        let task = self.workload.take()?;
        let runtime = self.runtime.as_ref()?;
        runtime.block_on(task).ok()
    }

    /// Stop the workload, drain the workers and the router, and release everything.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        if let Some(w) = self.workload.take() {
            w.abort();
        }
        let workers = std::mem::take(&mut self.workers);
        let stop = self.router_stop.take();
        let task = self.router_task.take();
        runtime.block_on(async move {
            for w in workers {
                let _ = tokio::time::timeout(Duration::from_secs(5), w.shutdown()).await;
            }
            if let Some(stop) = stop {
                let _ = stop.send(());
            }
            if let Some(task) = task {
                let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
            }
        });
        runtime.shutdown_timeout(Duration::from_secs(2));
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.shutdown();
    }
}

type Started = (
    String,
    oneshot::Sender<()>,
    JoinHandle<std::io::Result<()>>,
    Vec<RunningWorker>,
);

async fn start_cluster(
    opts: &DemoOptions,
    token: &str,
    data: PathBuf,
    model: Option<&ModelFile>,
) -> Result<Started, DemoError> {
    let catalog = write_catalog(&data).map_err(DemoError::Catalog)?;
    let mut text_models = TextModels::new();
    if let Some(m) = model {
        text_models.add(m);
    }
    let router_opts = RouterOptions {
        name: "demo-router".into(),
        token: Token::new(token),
        chunk_size: 64,
        catalog: Arc::new(catalog),
        // A minute of finished decision records is plenty to look at in a demo, and the
        // router, the console's Routes panel and the recorder's delta bases each hold
        // every retained record (≈ 27 KB with its candidates): at the demo's ~10 requests
        // a second the default 5 minutes grows the process by hundreds of MB.
        retention: Duration::from_secs(60),
        text_models: Arc::new(text_models),
        ..RouterOptions::default()
    };
    let listener = RouterServer::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(DemoError::Bind)?;
    let addr = listener.local_addr().map_err(DemoError::Bind)?;
    let server = RouterServer::start(router_opts)
        .with_ingress()
        .with_management();
    let handle = server.handle();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let router_task = tokio::spawn(server.serve(listener, async {
        let _ = stop_rx.await;
    }));
    let router_url = format!("http://{addr}");
    let mut workers = Vec::new();
    for i in 1..=opts.workers.max(1) {
        let name = format!("w-{i}");
        let mut w = WorkerOptions::new(format!("ws://{addr}"), &name, data.join(&name));
        w.token = Token::new(token);
        w.pages = opts.pages;
        w.chunk_size = 64;
        w.kv_bytes_per_token = 2048;
        w.ram_bytes = 64 << 20;
        w.ssd_bytes = 128 << 20;
        // Slow enough that queues, cache hits and restores are visible to a human.
        w.costs = EngineCosts::new(0.4, 12.0, 4.0).unwrap_or_default();
        if let Some(m) = model {
            w.opened_model = Some(m.clone());
            // The workers share this machine's cores.
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            w.model_threads = Some((cores / opts.workers.max(1)).max(1));
        }
        let running = worker::start(w).await.map_err(|e| DemoError::Worker {
            name: name.clone(),
            detail: e.to_string(),
        })?;
        workers.push(running);
    }
    let want = workers.len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ready = handle.workers().await.len();
        if ready >= want {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(DemoError::NotReady { ready, want });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((router_url, stop_tx, router_task, workers))
}

/// The public id of the real model the demo serves.
pub const REAL_MODEL: &str = "smollm2";

/// The default model file `tests/fetch-models` leaves in its cache.
pub const DEFAULT_MODEL_FILE: &str = "smollm2-135m-instruct-q4_1.gguf";

/// The real model to serve when none is named: `$DEN_MODEL_FILE`, else SmolLM2-135M in
/// `${DEN_MODEL_CACHE:-~/.cache/den/models}` when it is there.
pub fn default_model_file() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DEN_MODEL_FILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let cache = match std::env::var_os("DEN_MODEL_CACHE").filter(|p| !p.is_empty()) {
        Some(c) => PathBuf::from(c),
        None => dirs::home_dir()?.join(".cache/den/models"),
    };
    let path = cache.join(DEFAULT_MODEL_FILE);
    path.is_file().then_some(path)
}

/// One line saying which engine the demo runs.
pub fn banner(model_file: Option<&Path>) -> String {
    match model_file {
        Some(p) => format!(
            "serving {} as `{REAL_MODEL}` (real model, CPU forward pass over den's pages)",
            p.display()
        ),
        None => format!(
            "SYNTHETIC ENGINE (model-free stand-in): for a real model run tests/fetch-models (it caches {DEFAULT_MODEL_FILE}) or pass --model-file PATH.gguf"
        ),
    }
}

/// A per-run token: the demo listens on loopback only, but a token keeps other local
/// users from steering it, and exercises the same authenticated paths as production.
fn demo_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let pid = std::process::id();
    format!("demo-{:x}", nanos ^ (u128::from(pid) << 64))
}

/// The model operators can place in the demo: `place den/demo-chat`.
pub const DEMO_MODEL: &str = "den/demo-chat";

/// A one-card catalog under `data/catalog` whose artifact (two small files with their
/// sizes and SHA-256) is served from `data/artifacts/demo-chat` through `file://`, so a
/// placement really downloads, verifies, installs and loads it.
fn write_catalog(data: &Path) -> Result<ModelCatalog, String> {
    use sha2::{Digest, Sha256};
    let artifacts = data.join("artifacts").join("demo-chat");
    let cards = data.join("catalog");
    std::fs::create_dir_all(&artifacts).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&cards).map_err(|e| e.to_string())?;
    let config = b"{\"architecture\": \"den-synthetic\", \"layers\": 2}\n".to_vec();
    // Deterministic "weights": the demo's engine is synthetic; the bytes only have to
    // be downloaded, verified and loaded.
    let weights: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let mut files = String::new();
    for (name, bytes) in [("config.json", &config), ("weights.bin", &weights)] {
        std::fs::write(artifacts.join(name), bytes).map_err(|e| e.to_string())?;
        let sha = hex::encode(Sha256::digest(bytes));
        files.push_str(&format!(
            "\n[[files]]\npath = \"{name}\"\nbytes = {}\nsha256 = \"{sha}\"\n",
            bytes.len()
        ));
    }
    let card = format!(
        "model_id = \"{DEMO_MODEL}\"\nregistry_card_id = \"den-registry:demo-chat:v1\"\nfamily = \"den-synthetic\"\nquantization = \"bf16\"\nsource = \"file://{}\"\ncontext_length = 4096\nbackends = [\"host\", \"cuda\"]\nrequired_capabilities = [\"text-generation\"]\n\n[kv]\nlayers = 2\nkv_heads = 2\nhead_dim = 64\ndtype = \"bf16\"\n{files}",
        artifacts.display()
    );
    std::fs::write(cards.join("demo-chat.toml"), card).map_err(|e| e.to_string())?;
    ModelCatalog::load_dir(&cards).map_err(|e| e.to_string())
}
