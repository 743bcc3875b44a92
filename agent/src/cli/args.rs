//! The flags and environment variables of each role (clap).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{parse_bytes, parse_duration};
use crate::logging::LogFormat;
use crate::worker::Backend;

/// den-agent: the headless roles of a den cluster.
///
/// Start one router (`den-agent router`) and one worker per GPU host (`den-agent
/// worker --router ws://ROUTER:7070`), or everything on loopback with `den-agent local`.
/// Options layer as flags > environment variables > TOML config file > defaults.
#[derive(Debug, Parser)]
#[command(name = "den-agent", version, about, long_about)]
pub struct Cli {
    /// TOML config file with `[router]`, `[worker]` and `[local]` sections (default:
    /// ~/.config/den/agent.toml when it exists).
    #[arg(long, global = true, env = "DEN_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Log format: human-readable text or JSON lines.
    #[arg(
        long,
        global = true,
        env = "DEN_LOG_FORMAT",
        value_enum,
        value_name = "FORMAT"
    )]
    pub log_format: Option<LogFormat>,
    /// Log filter in RUST_LOG syntax, e.g. `info` or `den_agent=debug` (default: info).
    #[arg(long, global = true, env = "DEN_LOG", value_name = "FILTER")]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the router: the endpoint workers connect to and clients send requests to.
    Router(Box<RouterArgs>),
    /// Run a worker: one per GPU host; connects out to the router.
    Worker(Box<WorkerArgs>),
    /// Start a router and N workers on loopback (child processes of this binary), run a
    /// synthetic workload with shared prefixes through them, and print TTFT and
    /// cache-hit statistics.
    Local(LocalArgs),
}

/// Options of `den-agent router`.
#[derive(Debug, Clone, Default, Args)]
pub struct RouterArgs {
    /// Address to listen on for workers, clients and consoles [default: 127.0.0.1:7070].
    #[arg(long, env = "DEN_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Shared token workers, consoles and management clients must present as
    /// `Authorization: Bearer TOKEN` (none: everyone is allowed; only for loopback).
    #[arg(long, env = "DEN_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the shared token from this file's first line instead (keeps it out of argv).
    #[arg(long, env = "DEN_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Inference API keys, one per line (# comments): they reach only the inference
    /// endpoints (OpenAI ingress, /v1/generate) and get 403 elsewhere; re-read when the
    /// file changes [default: none].
    #[arg(long, env = "DEN_API_KEYS_FILE", value_name = "PATH")]
    pub api_keys_file: Option<PathBuf>,
    /// This router's name in the console feed [default: router].
    #[arg(long, env = "DEN_NAME", value_name = "NAME")]
    pub name: Option<String>,
    /// How often workers are told to heartbeat [default: 1s].
    #[arg(long, env = "DEN_HEARTBEAT_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
    pub heartbeat_interval: Option<Duration>,
    /// A worker without a heartbeat for this long is detached and its work moved [default: 3s].
    #[arg(long, env = "DEN_HEARTBEAT_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub heartbeat_timeout: Option<Duration>,
    /// An offer unanswered this long is cancelled and the next candidate tried [default: 100ms].
    #[arg(long, env = "DEN_OFFER_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub offer_timeout: Option<Duration>,
    /// Deadline of a request that names none [default: 60s].
    #[arg(long, env = "DEN_REQUEST_DEADLINE", value_name = "DURATION", value_parser = parse_duration)]
    pub request_deadline: Option<Duration>,
    /// Requests that may wait, oldest first, for KV pages no worker has free now; 0
    /// refuses them at once (503, Retry-After) [default: 1024].
    #[arg(long, env = "DEN_MAX_WAITING", value_name = "N")]
    pub max_waiting: Option<usize>,
    /// How long finished requests' decision records are kept [default: 5m].
    #[arg(long, env = "DEN_RETENTION", value_name = "DURATION", value_parser = parse_duration)]
    pub retention: Option<Duration>,
    /// Tokens per chunk of the prefix chain; must equal every worker's --chunk-size [default: 256].
    #[arg(long, env = "DEN_CHUNK_SIZE", value_name = "TOKENS")]
    pub chunk_size: Option<u32>,
    /// Largest control frame accepted from a worker [default: 16MiB].
    #[arg(long, env = "DEN_MAX_FRAME", value_name = "BYTES", value_parser = parse_bytes)]
    pub max_frame: Option<u64>,
    /// On SIGTERM/SIGINT, how long in-flight requests may finish before they are cancelled [default: 30s].
    #[arg(long, env = "DEN_DRAIN_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub drain_timeout: Option<Duration>,
    /// Directory of model cards (*.toml) the management API places (POST /instance);
    /// see agent/catalog/README.md [default: none, nothing can be placed].
    #[arg(long, env = "DEN_CATALOG", value_name = "DIR")]
    pub catalog: Option<PathBuf>,
    /// Where the router keeps its copy of each remote gguf card's file (it tokenizes with
    /// it) [default: ~/.cache/den/catalog].
    #[arg(long, env = "DEN_CATALOG_CACHE", value_name = "DIR")]
    pub catalog_cache: Option<PathBuf>,
    /// A GGUF model the workers serve, as `[ID=]PATH` (the same file, the same `--model`
    /// id): the router tokenizes prompts and renders chats for it; repeat for several
    /// (env: comma-separated).
    #[arg(
        long = "model-file",
        env = "DEN_MODEL_FILES",
        value_name = "[ID=]PATH",
        value_delimiter = ','
    )]
    pub model_files: Vec<String>,
    /// Most connections the router holds at once; more are closed on accept [default: 4096].
    #[arg(long, env = "DEN_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
    /// Most connections from one IP address [default: 512].
    #[arg(long, env = "DEN_MAX_CONNECTIONS_PER_PEER", value_name = "N")]
    pub max_connections_per_peer: Option<usize>,
    /// A connection's first request headers must arrive within this [default: 10s].
    #[arg(long, env = "DEN_HEADER_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub header_timeout: Option<Duration>,
    /// A connection with no byte in either direction for this long is closed [default: 5m].
    #[arg(long, env = "DEN_IDLE_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Serve https and wss with this PEM certificate chain (leaf first); needs --tls-key
    /// [default: plain http].
    #[arg(long, env = "DEN_TLS_CERT", value_name = "PATH", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "DEN_TLS_KEY", value_name = "PATH", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// Options of `den-agent worker`.
#[derive(Debug, Clone, Default, Args)]
pub struct WorkerArgs {
    /// The router to connect to, e.g. ws://10.0.0.1:7070 (http:// works too; /v1/agents is added).
    #[arg(long, env = "DEN_ROUTER", value_name = "URL")]
    pub router: Option<String>,
    /// The router's shared token.
    #[arg(long, env = "DEN_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the shared token from this file's first line instead (keeps it out of argv).
    #[arg(long, env = "DEN_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Trust this PEM CA certificate, besides the system's roots, when verifying a
    /// wss:// or https:// router (a private CA, or the router's self-signed certificate).
    #[arg(long, env = "DEN_CA_CERT", value_name = "PATH")]
    pub ca_cert: Option<PathBuf>,
    /// This worker's stable name [default: the host name].
    #[arg(long, env = "DEN_NAME", value_name = "NAME")]
    pub name: Option<String>,
    /// The storage node this worker's RAM/SSD replicas live on [default: the worker name].
    #[arg(long, env = "DEN_NODE", value_name = "NODE")]
    pub node: Option<String>,
    /// Where the KV page arena lives: host memory, or GPU memory through the CUDA driver [default: host].
    #[arg(long, env = "DEN_BACKEND", value_enum, value_name = "BACKEND")]
    pub backend: Option<Backend>,
    /// CUDA device ordinal (with --backend cuda) [default: 0].
    #[arg(long, env = "DEN_DEVICE", value_name = "N")]
    pub device: Option<usize>,
    /// Number of KV pages in the pool [default: 1024].
    #[arg(long, env = "DEN_PAGES", value_name = "N")]
    pub pages: Option<u32>,
    /// Token rows per page [default: 16].
    #[arg(long, env = "DEN_PAGE_SIZE", value_name = "TOKENS")]
    pub page_size: Option<u32>,
    /// Bytes of one synthetic KV row (every layer's K and V of one token) [default: 4KiB].
    #[arg(long, env = "DEN_KV_BYTES_PER_TOKEN", value_name = "BYTES", value_parser = parse_bytes)]
    pub kv_bytes_per_token: Option<u64>,
    /// A model fingerprint the synthetic engine serves; repeat for several (env: comma-separated) [default: den-synthetic].
    #[arg(
        long = "model",
        env = "DEN_MODELS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub models: Vec<String>,
    /// Serve this GGUF model for real (CPU forward pass over the host page arena); `--model`
    /// then names its public id [default: the file name without .gguf].
    #[arg(long, env = "DEN_MODEL_FILE", value_name = "PATH")]
    pub model_file: Option<PathBuf>,
    /// Threads of the model's forward pass [default: every core].
    #[arg(long, env = "DEN_MODEL_THREADS", value_name = "N")]
    pub model_threads: Option<usize>,
    /// Rows of one batched step (real model or synthetic engine): every running decode's
    /// next token, then prompt rows of requests still prefilling [default: 64].
    #[arg(long, env = "DEN_BATCH_TOKENS", value_name = "N")]
    pub batch_tokens: Option<u32>,
    /// How long an idle device thread watches its queue before it sleeps, e.g. 200us: a
    /// sleeping thread's wake-up costs tens of µs on a VM whose idle vCPUs halt, but the
    /// watching thread holds a core; at most 10ms [default: 0, sleep at once].
    #[arg(long, env = "DEN_IDLE_SPIN", value_name = "DURATION", value_parser = parse_duration)]
    pub idle_spin: Option<Duration>,
    /// Synthetic engine: declared cost of one prompt row of a step, really spent on the device thread [default: 0.05].
    #[arg(long, env = "DEN_PREFILL_MS_PER_TOKEN", value_name = "MS")]
    pub prefill_ms_per_token: Option<f64>,
    /// Synthetic engine: the least a step with decode rows takes, whatever the batch [default: 5].
    #[arg(long, env = "DEN_DECODE_MS_PER_TOKEN", value_name = "MS")]
    pub decode_ms_per_token: Option<f64>,
    /// Synthetic engine: the least a step that yields some request's first token takes [default: 2].
    #[arg(long, env = "DEN_FIRST_TOKEN_MS", value_name = "MS")]
    pub first_token_ms: Option<f64>,
    /// Capacity of the RAM chunk tier; 0 disables it [default: 1GiB].
    #[arg(long, env = "DEN_RAM_BYTES", value_name = "BYTES", value_parser = parse_bytes)]
    pub ram_bytes: Option<u64>,
    /// Capacity of the SSD chunk tier under DATA_DIR/ssd; 0 disables it [default: 0].
    #[arg(long, env = "DEN_SSD_BYTES", value_name = "BYTES", value_parser = parse_bytes)]
    pub ssd_bytes: Option<u64>,
    /// Directory for the epoch file and the SSD tier [default: ~/.local/share/den/worker-NAME].
    #[arg(long, env = "DEN_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Shared object store for chunks: s3://bucket/prefix (endpoint and credentials from
    /// AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), file:///dir or memory://.
    #[arg(long, env = "DEN_OBJECT_STORE", value_name = "URL")]
    pub object_store: Option<String>,
    /// Tokens per chunk of the prefix chain; must equal the router's --chunk-size [default: 256].
    #[arg(long, env = "DEN_CHUNK_SIZE", value_name = "TOKENS")]
    pub chunk_size: Option<u32>,
    /// Largest context admitted, in tokens [default: pages × page size].
    #[arg(long, env = "DEN_MAX_CONTEXT", value_name = "TOKENS")]
    pub max_context: Option<u32>,
    /// Serve Prometheus metrics (/metrics) and a JSON status (/status) on this address
    /// [default: none]. Port 0 picks a free port; the address is printed on stdout.
    #[arg(long, env = "DEN_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// TEST FACILITY, off by default: serve a fault-injection endpoint on this loopback
    /// address (drop frames from the router, slow restores, evict resident routes).
    #[arg(long, env = "DEN_FAULT_ADMIN", value_name = "ADDR")]
    pub fault_admin: Option<SocketAddr>,
    /// On SIGTERM/SIGINT, how long in-flight work may finish before it is cancelled [default: 30s].
    #[arg(long, env = "DEN_DRAIN_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub drain_timeout: Option<Duration>,
    /// Read every restored chunk back from the pages and compare it byte-exact with
    /// recomputation (counts den_restore_verified_total / den_restore_mismatch_total) [default: true].
    #[arg(long, env = "DEN_VERIFY_RESTORES", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub verify_restores: Option<bool>,
    /// Largest control frame accepted from the router [default: 16MiB].
    #[arg(long, env = "DEN_MAX_FRAME", value_name = "BYTES", value_parser = parse_bytes)]
    pub max_frame: Option<u64>,
    /// KV page pool budget of a placed model's runner: its pages are sized from the
    /// model card's KV bytes per token within it [default: pages × page size × kv bytes per token].
    #[arg(long, env = "DEN_KV_BUDGET", value_name = "BYTES", value_parser = parse_bytes)]
    pub kv_budget: Option<u64>,
}

/// Options of `den-agent local`.
#[derive(Debug, Clone, Default, Args)]
pub struct LocalArgs {
    /// Number of workers [default: 3].
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// How long the workload runs [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Stop after this many requests (instead of, or before, --duration).
    #[arg(long, value_name = "N")]
    pub requests: Option<usize>,
    /// Conversations in flight at once [default: 6].
    #[arg(long, value_name = "N")]
    pub concurrency: Option<usize>,
    /// Tokens generated per request [default: 16].
    #[arg(long, value_name = "N")]
    pub max_new_tokens: Option<u32>,
    /// Workers' declared prefill cost per uncached token [default: 0.5].
    #[arg(long, value_name = "MS")]
    pub prefill_ms_per_token: Option<f64>,
    /// Workers' declared decode cost per token [default: 2].
    #[arg(long, value_name = "MS")]
    pub decode_ms_per_token: Option<f64>,
    /// Workers' declared first-token cost [default: 2].
    #[arg(long, value_name = "MS")]
    pub first_token_ms: Option<f64>,
    /// Seed of the synthetic workload [default: 1].
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Keep the processes' logs in this directory (default: discarded).
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
}
