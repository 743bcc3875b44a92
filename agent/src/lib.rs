//! den-agent: the headless router and worker roles of a den cluster.
//!
//! The binary (`src/main.rs`) is a thin command-line shell over these modules; the
//! decisions themselves live in `den-protocol`, and this crate interprets their effects
//! with real sockets, timers, memory and storage.

/// Every den-agent binary allocates through mimalloc: the router and the worker make
/// and drop many small values per request and per frame (ids, records, frames, chunk
/// hashes), which glibc's allocator serves slowly. BENCHMARKS.md ("The allocator") has
/// the measured difference.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod api_keys;
pub mod auth;
pub mod cli;
pub mod config;
pub mod engine;
pub mod hops;
pub mod ingress;
pub mod listener;
pub mod local_cluster;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod model_file;
pub mod router;
pub mod serving;
pub mod systemd;
pub mod tiers;
pub mod tls;
pub mod worker;
pub mod workload;
pub mod ws;
