//! The command line: `den-agent router`, `den-agent worker`, `den-agent local`.
//!
//! Every option can be given as a flag, as an environment variable (named in `--help`)
//! or in the TOML config file (`--config`, `$DEN_CONFIG`, or `~/.config/den/agent.toml`)
//! under `[router]`, `[worker]` or `[local]`, with the flag's name in snake case.
//! Flags win over the environment, which wins over the file, which wins over the
//! built-in defaults. Unknown keys in the file are an error naming the key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use den_protocol::chunk::DEFAULT_CHUNK_SIZE;
use den_protocol::ids::{ModelFingerprint, NodeId, WorkerId};
use den_protocol::wire::DEFAULT_MAX_FRAME;

use crate::auth::Token;
use crate::config::{parse_bytes, parse_duration};
use crate::engine::EngineCosts;
use crate::logging::LogFormat;
use crate::router::RouterOptions;
use crate::router::manage::ModelCatalog;
use crate::tiers::ObjectConfig;
use crate::worker::{Backend, DEFAULT_MODEL, WorkerOptions};

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

/// The config file: one section per role.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub log_format: Option<LogFormat>,
    #[serde(default)]
    pub log: Option<String>,
    #[serde(default)]
    pub router: RouterFile,
    #[serde(default)]
    pub worker: WorkerFile,
    #[serde(default)]
    pub local: LocalFile,
}

/// A size in the file: a number of bytes or a string like "1GiB".
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn bytes(&self, key: &str) -> Result<u64, String> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(s) => parse_bytes(s).map_err(|e| format!("{key}: {e}")),
        }
    }
}

fn dur(s: &Option<String>, key: &str) -> Result<Option<Duration>, String> {
    s.as_deref()
        .map(|v| parse_duration(v).map_err(|e| format!("{key}: {e}")))
        .transpose()
}

fn size(s: &Option<Size>, key: &str) -> Result<Option<u64>, String> {
    s.as_ref().map(|v| v.bytes(key)).transpose()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterFile {
    pub listen: Option<SocketAddr>,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub api_keys_file: Option<PathBuf>,
    pub name: Option<String>,
    pub heartbeat_interval: Option<String>,
    pub heartbeat_timeout: Option<String>,
    pub offer_timeout: Option<String>,
    pub request_deadline: Option<String>,
    pub max_waiting: Option<usize>,
    pub retention: Option<String>,
    pub chunk_size: Option<u32>,
    pub max_frame: Option<Size>,
    pub drain_timeout: Option<String>,
    pub catalog: Option<PathBuf>,
    pub catalog_cache: Option<PathBuf>,
    #[serde(default)]
    pub model_files: Vec<String>,
    pub max_connections: Option<usize>,
    pub max_connections_per_peer: Option<usize>,
    pub header_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerFile {
    pub router: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca_cert: Option<PathBuf>,
    pub name: Option<String>,
    pub node: Option<String>,
    pub backend: Option<Backend>,
    pub device: Option<usize>,
    pub pages: Option<u32>,
    pub page_size: Option<u32>,
    pub kv_bytes_per_token: Option<Size>,
    #[serde(default)]
    pub models: Vec<String>,
    pub model_file: Option<PathBuf>,
    pub model_threads: Option<usize>,
    pub batch_tokens: Option<u32>,
    pub prefill_ms_per_token: Option<f64>,
    pub decode_ms_per_token: Option<f64>,
    pub first_token_ms: Option<f64>,
    pub ram_bytes: Option<Size>,
    pub ssd_bytes: Option<Size>,
    pub data_dir: Option<PathBuf>,
    pub object_store: Option<String>,
    pub chunk_size: Option<u32>,
    pub max_context: Option<u32>,
    pub metrics_listen: Option<SocketAddr>,
    pub fault_admin: Option<SocketAddr>,
    pub drain_timeout: Option<String>,
    pub verify_restores: Option<bool>,
    pub max_frame: Option<Size>,
    pub kv_budget: Option<Size>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalFile {
    pub workers: Option<usize>,
    pub duration: Option<String>,
    pub requests: Option<usize>,
    pub concurrency: Option<usize>,
    pub max_new_tokens: Option<u32>,
    pub prefill_ms_per_token: Option<f64>,
    pub decode_ms_per_token: Option<f64>,
    pub first_token_ms: Option<f64>,
    pub seed: Option<u64>,
    pub log_dir: Option<PathBuf>,
}

/// Default router address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";

/// The router's address and options from flags/env (`a`) over the file (`f`).
pub fn router_options(
    a: &RouterArgs,
    f: &RouterFile,
) -> Result<(SocketAddr, RouterOptions), String> {
    let d = RouterOptions::default();
    let listen = a.listen.or(f.listen).unwrap_or_else(|| {
        DEFAULT_LISTEN
            .parse()
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 7070)))
    });
    let chunk_size = a.chunk_size.or(f.chunk_size).unwrap_or(DEFAULT_CHUNK_SIZE);
    if chunk_size == 0 {
        return Err("--chunk-size must be positive".into());
    }
    let max_frame = a
        .max_frame
        .or(size(&f.max_frame, "router.max_frame")?)
        .unwrap_or(DEFAULT_MAX_FRAME as u64);
    let opts = RouterOptions {
        name: NodeId::new(
            a.name
                .clone()
                .or(f.name.clone())
                .unwrap_or_else(|| d.name.to_string()),
        ),
        token: Token::choose(
            a.token.as_deref(),
            a.token_file.as_deref(),
            f.token.as_deref(),
            f.token_file.as_deref(),
        )?,
        api_keys: match a.api_keys_file.as_ref().or(f.api_keys_file.as_ref()) {
            Some(path) => Some(crate::api_keys::ApiKeys::from_file(path)?),
            None => None,
        },
        heartbeat_interval: a
            .heartbeat_interval
            .or(dur(&f.heartbeat_interval, "router.heartbeat_interval")?)
            .unwrap_or(d.heartbeat_interval),
        heartbeat_timeout: a
            .heartbeat_timeout
            .or(dur(&f.heartbeat_timeout, "router.heartbeat_timeout")?)
            .unwrap_or(d.heartbeat_timeout),
        offer_timeout: a
            .offer_timeout
            .or(dur(&f.offer_timeout, "router.offer_timeout")?)
            .unwrap_or(d.offer_timeout),
        request_deadline: a
            .request_deadline
            .or(dur(&f.request_deadline, "router.request_deadline")?)
            .unwrap_or(d.request_deadline),
        max_waiting: a.max_waiting.or(f.max_waiting).unwrap_or(d.max_waiting),
        retention: a
            .retention
            .or(dur(&f.retention, "router.retention")?)
            .unwrap_or(d.retention),
        chunk_size,
        max_frame: usize::try_from(max_frame).unwrap_or(usize::MAX),
        snapshot_interval: d.snapshot_interval,
        drain_timeout: a
            .drain_timeout
            .or(dur(&f.drain_timeout, "router.drain_timeout")?)
            .unwrap_or(d.drain_timeout),
        catalog: match a.catalog.as_ref().or(f.catalog.as_ref()) {
            Some(dir) => {
                std::sync::Arc::new(ModelCatalog::load_dir(dir).map_err(|e| e.to_string())?)
            }
            None => d.catalog,
        },
        catalog_cache: a
            .catalog_cache
            .clone()
            .or(f.catalog_cache.clone())
            .unwrap_or(d.catalog_cache),
        text_models: {
            let specs = if a.model_files.is_empty() {
                &f.model_files
            } else {
                &a.model_files
            };
            std::sync::Arc::new(text_models(specs)?)
        },
        limits: {
            let l = crate::listener::Limits::default();
            crate::listener::Limits {
                max_connections: a
                    .max_connections
                    .or(f.max_connections)
                    .unwrap_or(l.max_connections),
                max_per_peer: a
                    .max_connections_per_peer
                    .or(f.max_connections_per_peer)
                    .unwrap_or(l.max_per_peer),
                header_timeout: a
                    .header_timeout
                    .or(dur(&f.header_timeout, "router.header_timeout")?)
                    .unwrap_or(l.header_timeout),
                idle_timeout: a
                    .idle_timeout
                    .or(dur(&f.idle_timeout, "router.idle_timeout")?)
                    .unwrap_or(l.idle_timeout),
            }
        },
        tls: match (
            a.tls_cert.as_ref().or(f.tls_cert.as_ref()),
            a.tls_key.as_ref().or(f.tls_key.as_ref()),
        ) {
            (Some(cert), Some(key)) => Some(crate::tls::server_config(cert, key)?),
            (None, None) => None,
            (Some(_), None) => {
                return Err("--tls-cert needs --tls-key (the certificate's private key)".into());
            }
            (None, Some(_)) => {
                return Err("--tls-key needs --tls-cert (the certificate chain)".into());
            }
        },
    };
    let l = &opts.limits;
    if l.max_connections == 0
        || l.max_per_peer == 0
        || l.header_timeout.is_zero()
        || l.idle_timeout.is_zero()
    {
        return Err("--max-connections, --max-connections-per-peer, --header-timeout and --idle-timeout must be positive".into());
    }
    if opts.heartbeat_interval >= opts.heartbeat_timeout {
        return Err(format!(
            "--heartbeat-interval ({:?}) must be shorter than --heartbeat-timeout ({:?})",
            opts.heartbeat_interval, opts.heartbeat_timeout
        ));
    }
    Ok((listen, opts))
}

/// Opens each `[ID=]PATH` for its tokenizer and template.
fn text_models(specs: &[String]) -> Result<crate::ingress::TextModels, String> {
    let mut out = crate::ingress::TextModels::new();
    for spec in specs {
        let spec = spec.trim();
        if spec.is_empty() {
            continue;
        }
        // `ID=PATH`, unless what precedes `=` looks like a path itself.
        let (id, path) = match spec.split_once('=') {
            Some((id, path)) if !id.contains('/') && !id.is_empty() => (Some(id), path),
            _ => (None, spec),
        };
        let model = crate::model_file::ModelFile::open(std::path::Path::new(path), id)
            .map_err(|e| format!("--model-file {spec}: {e}"))?;
        out.add(&model);
    }
    Ok(out)
}

/// The worker's options from flags/env (`a`) over the file (`f`).
pub fn worker_options(a: &WorkerArgs, f: &WorkerFile) -> Result<WorkerOptions, String> {
    let router = a.router.clone().or(f.router.clone()).ok_or(
        "no router: give --router ws://ROUTER:7070 (or DEN_ROUTER, or router = \"…\" under [worker])",
    )?;
    let name = a.name.clone().or(f.name.clone()).unwrap_or_else(hostname);
    let data_dir = a
        .data_dir
        .clone()
        .or(f.data_dir.clone())
        .unwrap_or_else(|| {
            dirs::data_dir()
                .unwrap_or_else(std::env::temp_dir)
                .join("den")
                .join(format!("worker-{name}"))
        });
    let mut o = WorkerOptions::new(router, &name, data_dir);
    o.token = Token::choose(
        a.token.as_deref(),
        a.token_file.as_deref(),
        f.token.as_deref(),
        f.token_file.as_deref(),
    )?;
    if let Some(node) = a.node.clone().or(f.node.clone()) {
        o.node = NodeId::new(node);
    }
    o.name = WorkerId::new(name);
    o.backend = a.backend.or(f.backend).unwrap_or_default();
    o.device = a.device.or(f.device).unwrap_or(0);
    o.pages = a.pages.or(f.pages).unwrap_or(o.pages);
    o.page_size = a.page_size.or(f.page_size).unwrap_or(o.page_size);
    o.kv_bytes_per_token = a
        .kv_bytes_per_token
        .or(size(&f.kv_bytes_per_token, "worker.kv_bytes_per_token")?)
        .unwrap_or(o.kv_bytes_per_token);
    let models = if a.models.is_empty() {
        &f.models
    } else {
        &a.models
    };
    o.models = if models.is_empty() {
        vec![ModelFingerprint::from(DEFAULT_MODEL)]
    } else {
        models
            .iter()
            .map(|m| ModelFingerprint::new(m.trim()))
            .collect()
    };
    o.model_file = a.model_file.clone().or(f.model_file.clone());
    o.model_threads = a.model_threads.or(f.model_threads);
    o.batch_tokens = a.batch_tokens.or(f.batch_tokens).unwrap_or(o.batch_tokens);
    if o.batch_tokens == 0 {
        return Err("--batch-tokens must be positive".into());
    }
    let d = EngineCosts::default();
    o.costs = EngineCosts::new(
        a.prefill_ms_per_token
            .or(f.prefill_ms_per_token)
            .unwrap_or(d.prefill_ms_per_token),
        a.decode_ms_per_token
            .or(f.decode_ms_per_token)
            .unwrap_or(d.decode_ms_per_token),
        a.first_token_ms
            .or(f.first_token_ms)
            .unwrap_or(d.first_token_ms),
    )
    .map_err(|e| e.to_string())?;
    o.ram_bytes = a
        .ram_bytes
        .or(size(&f.ram_bytes, "worker.ram_bytes")?)
        .unwrap_or(o.ram_bytes);
    o.ssd_bytes = a
        .ssd_bytes
        .or(size(&f.ssd_bytes, "worker.ssd_bytes")?)
        .unwrap_or(o.ssd_bytes);
    o.object_store = match a.object_store.clone().or(f.object_store.clone()) {
        Some(url) => Some(ObjectConfig::from_url_and_env(&url).map_err(|e| e.to_string())?),
        None => None,
    };
    o.chunk_size = a.chunk_size.or(f.chunk_size).unwrap_or(o.chunk_size);
    o.max_context = a.max_context.or(f.max_context);
    o.metrics_listen = a.metrics_listen.or(f.metrics_listen);
    o.fault_admin = a.fault_admin.or(f.fault_admin);
    o.drain_timeout = a
        .drain_timeout
        .or(dur(&f.drain_timeout, "worker.drain_timeout")?)
        .unwrap_or(o.drain_timeout);
    o.verify_restores = a.verify_restores.or(f.verify_restores).unwrap_or(true);
    o.kv_budget = a.kv_budget.or(size(&f.kv_budget, "worker.kv_budget")?);
    o.max_frame = usize::try_from(
        a.max_frame
            .or(size(&f.max_frame, "worker.max_frame")?)
            .unwrap_or(DEFAULT_MAX_FRAME as u64),
    )
    .unwrap_or(usize::MAX);
    Ok(o)
}

/// This host's name (for the default worker name).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "worker".to_owned())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config;

    #[test]
    fn flags_win_over_the_file_which_wins_over_defaults() {
        let file: FileConfig = config::parse(
            Path::new("agent.toml"),
            r#"
            [worker]
            router = "ws://file:1"
            pages = 64
            ram_bytes = "2MiB"
            models = ["a", "b"]
            drain_timeout = "2s"
            [router]
            chunk_size = 32
            "#,
        )
        .unwrap();
        let args = WorkerArgs {
            pages: Some(8),
            name: Some("w1".into()),
            ..WorkerArgs::default()
        };
        let o = worker_options(&args, &file.worker).unwrap();
        assert_eq!(o.router, "ws://file:1");
        assert_eq!(o.pages, 8, "flag over file");
        assert_eq!(o.ram_bytes, 2 << 20, "file over default");
        assert_eq!(o.page_size, 16, "default");
        assert_eq!(o.models.len(), 2);
        assert_eq!(o.drain_timeout, Duration::from_secs(2));
        assert_eq!(o.node.as_str(), "w1", "node defaults to the name");
        let (_, r) = router_options(&RouterArgs::default(), &file.router).unwrap();
        assert_eq!(r.chunk_size, 32);
    }

    #[test]
    fn config_errors_name_what_is_wrong() {
        let e = config::parse::<FileConfig>(Path::new("a.toml"), "[worker]\npagez = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pagez"), "{e}");
        let e = worker_options(&WorkerArgs::default(), &WorkerFile::default()).unwrap_err();
        assert!(e.contains("--router"), "{e}");
        let args = WorkerArgs {
            router: Some("ws://r:1".into()),
            prefill_ms_per_token: Some(-1.0),
            ..WorkerArgs::default()
        };
        assert!(
            worker_options(&args, &WorkerFile::default())
                .unwrap_err()
                .contains("prefill")
        );
        let args = RouterArgs {
            heartbeat_interval: Some(Duration::from_secs(5)),
            ..RouterArgs::default()
        };
        assert!(
            router_options(&args, &RouterFile::default())
                .unwrap_err()
                .contains("shorter")
        );
    }

    #[test]
    fn help_explains_every_option() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        cmd.build();
        for sub in ["router", "worker", "local"] {
            let s = cmd.find_subcommand(sub).unwrap();
            for arg in s.get_arguments() {
                assert!(
                    arg.get_help().is_some() || arg.get_id() == "help",
                    "{sub} --{} has no help",
                    arg.get_id()
                );
            }
        }
    }
}
