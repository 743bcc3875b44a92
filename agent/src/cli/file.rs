//! The TOML config file: one section per role, each key a flag's name in snake case;
//! sizes and durations as numbers or text ("1GiB", "250ms").

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{parse_bytes, parse_duration};
use crate::logging::LogFormat;
use crate::worker::Backend;

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

pub(super) fn dur(s: &Option<String>, key: &str) -> Result<Option<Duration>, String> {
    s.as_deref()
        .map(|v| parse_duration(v).map_err(|e| format!("{key}: {e}")))
        .transpose()
}

pub(super) fn size(s: &Option<Size>, key: &str) -> Result<Option<u64>, String> {
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
    pub idle_spin: Option<String>,
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
