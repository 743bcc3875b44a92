//! End-to-end test helpers: start den's real binaries on loopback and talk to them.
//!
//! - [`process`]: find built workspace binaries ([`binary`], [`target_dir`],
//!   [`cargo_build`]), run them as [`ChildGuard`]s (piped output collected line by line,
//!   killed on drop), and start servers that print `listening on ADDR` as their first
//!   stdout line ([`spawn_listening`]).
//! - [`script`], [`fixture_server`] and [`fixture_client`]: the Skulk-compatible fixture
//!   server (`skulk-fixture-server --script FILE [--listen ADDR] [--var NAME=VALUE]...`),
//!   its script format, and [`FixtureServer`] to start it and read back what it received.
//! - [`router_stub`]: an in-process den router stand-in (console feed WebSocket plus
//!   `/node_id` and `/state`) for console and recording tests.
//! - [`agents`]: starting den's router and workers for end-to-end tests.
//! - [`manage`]: model artifacts, catalog cards and a client of the router's management
//!   API for its end-to-end tests.
//! - Below: [`wait_until`] / [`wait_until_async`] polling, [`free_port`], [`temp_dir`],
//!   and paths of the vendored fixtures ([`fixtures_dir`]).
//!
//! Typical use:
//! ```no_run
//! use den_tests::{FixtureServer, script_path};
//! let server = FixtureServer::start(&script_path("placement_accepted_ready.json"), &[])
//!     .expect("fixture server");
//! // … point a client at server.url() …
//! assert_eq!(server.count("POST", "/instance"), 1);
//! ```
//! Inside this crate's integration tests prefer
//! `FixtureServer::start_with(Path::new(env!("CARGO_BIN_EXE_skulk-fixture-server")), …)`:
//! cargo builds this crate's binaries before its integration tests and names them that
//! way. Other binaries (`den`, `den-agent`) are found with [`binary`].
// Test support: a helper that cannot do its job fails the test that called it, so it may
// unwrap, expect and panic. Nothing here ships in den's binaries.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod agents;
pub mod environment;
pub mod faults;
pub mod fixture_client;
pub mod fixture_server;
pub mod manage;
pub mod process;
pub mod recording;
pub mod router_stub;
pub mod s3;
pub mod script;

use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use fixture_client::{FixtureServer, http_request};
pub use fixture_server::RecordedRequest;
pub use process::{
    ChildGuard, binary, binary_path, cargo_build, parse_listening, spawn_listening, target_dir,
    workspace_dir,
};
pub use router_stub::RouterStub;

/// How often the wait helpers look again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `condition` until it holds (true) or `timeout` passes (false). Blocking.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// [`wait_until`] for async tests: sleeps on the tokio timer between polls.
pub async fn wait_until_async(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Like [`wait_until_async`] with an async condition.
pub async fn wait_until_with<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// A loopback port that was free a moment ago. Racy by nature: prefer letting a server
/// bind port 0 and report its address (see [`spawn_listening`]).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A fresh temporary directory, removed when dropped.
pub fn temp_dir() -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("den-test-").tempdir()
}

/// `tests/fixtures` of the workspace.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// A file of the vendored Skulk 1.3.0 captures, e.g. `runC/node_id.json`.
pub fn skulk_fixture(rel: &str) -> PathBuf {
    fixtures_dir().join("skulk-1.3.0").join(rel)
}

/// A fixture server script of `tests/fixtures/scripts/`.
pub fn script_path(name: &str) -> PathBuf {
    fixtures_dir().join("scripts").join(name)
}
