//! Shared harness for the ingress tests: the ingress served on a real 127.0.0.1 port by
//! axum + hyper, in front of [`FakeSubmitter`] — an in-process stand-in for the router
//! runtime (which merges separately), emitting the synthetic engine's deterministic
//! deltas with configurable delays and failures.

#![allow(dead_code)] // each test binary uses part of the harness

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;

use den_agent::engine;
use den_agent::ingress::fake::{FakeModel, FakeSubmitter};
use den_agent::ingress::{IngressConfig, routes};
use den_agent::metrics::Metrics;
use den_agent::serving::SharedSubmitter;
use den_protocol::ids::{ModelFingerprint, RequestId};
use den_protocol::request::Token;

pub struct Server {
    pub addr: SocketAddr,
    pub fake: Arc<FakeSubmitter>,
    pub metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// Serve the ingress over a fake with `models` on an ephemeral loopback port.
pub async fn serve(models: Vec<FakeModel>, config: IngressConfig) -> Server {
    let fake = FakeSubmitter::new(models);
    let metrics = config.metrics.clone();
    let submitter: SharedSubmitter = fake.clone();
    let app = routes(submitter, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // As the router serves it: SSE frames are small writes that must not wait for
    // delayed ACKs.
    let listener = listener.tap_io(|tcp| tcp.set_nodelay(true).unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        addr,
        fake,
        metrics,
        task,
    }
}

pub fn client() -> reqwest::Client {
    client_with_timeout(Duration::from_secs(30))
}

/// A client that gives up after `timeout` (to play a client that disconnects). Installs
/// the rustls provider first: tests run in parallel, so none may rely on another test
/// having installed it.
pub fn client_with_timeout(timeout: Duration) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
        .unwrap()
}

/// The default test model: `den-test`, context 4096, zero cost.
pub fn model() -> FakeModel {
    FakeModel::new("den-test", 4096)
}

/// What the synthetic engine generates for `prompt` under model `id` (fingerprint `fp-{id}`).
pub fn expected_tokens(id: &str, prompt: &[Token], n: u32) -> Vec<Token> {
    engine::generate(&ModelFingerprint::new(format!("fp-{id}")), prompt, n)
}

pub fn expected_text(id: &str, prompt: &[Token], n: u32) -> String {
    engine::detokenize(&expected_tokens(id, prompt, n))
}

/// SSE events of a complete body: each `data: …` payload, in order. Panics on any
/// framing other than `data: <payload>\n\n`.
pub fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "body does not end with a blank line: {body:?}"
    );
    body[..body.len() - 2]
        .split("\n\n")
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without `data: `: {e:?}"))
                .to_owned()
        })
        .collect()
}

/// Wait (up to 10 s) until `f` holds.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

pub fn cancels_of(server: &Server, id: &str) -> u32 {
    server
        .fake
        .cancels()
        .get(&RequestId::new(id))
        .copied()
        .unwrap_or(0)
}
