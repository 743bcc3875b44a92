//! Helpers for the agents' end-to-end tests: start the real `den-agent` binary as a router
//! and workers on 127.0.0.1, talk to them over HTTP and WebSockets, and inject faults
//! (signals to processes, the workers' `--fault-admin` endpoint).
//!
//! The binary must be built first (`cargo build -p den-agent`; `tests/run` builds the
//! whole workspace). It is looked up next to the test executable (`target/<profile>/`),
//! or at `$DEN_AGENT_BIN`.
//!
//! Every process writes its log to a temporary file; when a test panics the tail of each
//! log is printed, so a failure shows what the processes saw.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

mod proc;
pub use proc::Proc;

/// The `den-agent` binary.
pub fn agent_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("DEN_AGENT_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> → target/<profile>/den-agent
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let bin = dir.join("den-agent");
    assert!(
        bin.exists(),
        "{} does not exist: build it first with `cargo build -p den-agent`",
        bin.display()
    );
    bin
}

/// A router process.
pub struct Router {
    pub proc: Proc,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub token: Option<String>,
    pub dir: tempfile::TempDir,
    /// The CA certificate (PEM) its https certificate is signed with, when it serves TLS.
    pub ca: Option<PathBuf>,
}

/// A worker process.
pub struct Worker {
    pub proc: Proc,
    pub name: String,
    /// `http://127.0.0.1:PORT` of /metrics and /status.
    pub metrics: String,
    /// `http://127.0.0.1:PORT` of the fault-injection endpoint, when enabled.
    pub fault: Option<String>,
    pub data_dir: PathBuf,
}

/// Start a router on a free loopback port with `--chunk-size 16` and `extra` arguments.
pub fn start_router(token: Option<&str>, extra: &[&str]) -> Router {
    start_router_at("127.0.0.1:0", token, extra)
}

/// Start a router on `listen` (e.g. the address of a router that was killed).
pub fn start_router_at(listen: &str, token: Option<&str>, extra: &[&str]) -> Router {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut args: Vec<String> = ["router", "--listen", listen, "--chunk-size", "16"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(t) = token {
        args.extend(["--token".into(), t.into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut proc = Proc::spawn("router", dir.path(), &args, &[]);
    let url = proc.wait_line("den-agent router listening on ", Duration::from_secs(20));
    Router {
        proc,
        url,
        token: token.map(str::to_owned),
        dir,
        ca: None,
    }
}

/// A self-signed certificate for 127.0.0.1 and localhost, and its key, as PEM files in
/// `dir`: `(cert.pem, key.pem)`. The certificate is its own CA (`--ca-cert cert.pem`).
pub fn self_signed_cert(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let issued = rcgen::generate_simple_self_signed(names).expect("self-signed certificate");
    let cert = dir.join(format!("{stem}-cert.pem"));
    let key = dir.join(format!("{stem}-key.pem"));
    std::fs::write(&cert, issued.cert.pem()).expect("write cert");
    std::fs::write(&key, issued.signing_key.serialize_pem()).expect("write key");
    (cert, key)
}

/// Start a router serving https and wss with a fresh self-signed certificate; its
/// `ca` is that certificate, and the [`Router`] helpers trust it.
pub fn start_tls_router(token: Option<&str>, extra: &[&str]) -> Router {
    let certs = tempfile::tempdir().expect("temp dir");
    let (cert, key) = self_signed_cert(certs.path(), "router");
    let (cert_s, key_s) = (cert.display().to_string(), key.display().to_string());
    let mut args = vec!["--tls-cert", cert_s.as_str(), "--tls-key", key_s.as_str()];
    args.extend_from_slice(extra);
    let mut router = start_router(token, &args);
    assert!(router.url.starts_with("https://"), "{}", router.url);
    // Keep the files for the router's lifetime: move them into its directory.
    let ca = router.dir.path().join("router-ca.pem");
    std::fs::copy(&cert, &ca).expect("copy CA");
    router.ca = Some(ca);
    router
}

/// Worker arguments every test uses unless it overrides them: small pages and rows,
/// chunk size 16, metrics on a free port.
pub const BASE_WORKER_ARGS: &[&str] = &[
    "--chunk-size",
    "16",
    "--page-size",
    "16",
    "--pages",
    "256",
    "--kv-bytes-per-token",
    "1KiB",
    "--metrics-listen",
    "127.0.0.1:0",
];

/// Declared engine costs that make a cache hit unmistakable: 4 ms per uncached prompt
/// token (a 100-token prompt is ~400 ms of prefill, a hit a few ms), 2 ms to the first
/// token, 1 ms per further token.
pub const SLOW_PREFILL: &[&str] = &[
    "--prefill-ms-per-token",
    "4",
    "--first-token-ms",
    "2",
    "--decode-ms-per-token",
    "1",
];

/// Start a worker `name` connected to `router`, with the base arguments, a fault-admin
/// endpoint when `fault`, and `extra` arguments (which must not repeat a base flag: clap
/// refuses a flag given twice).
pub fn start_worker(router: &Router, name: &str, fault: bool, extra: &[&str]) -> Worker {
    start_worker_env(router, name, fault, extra, &[])
}

pub fn start_worker_env(
    router: &Router,
    name: &str,
    fault: bool,
    extra: &[&str],
    env: &[(&str, String)],
) -> Worker {
    start_worker_under(router, name, fault, extra, env, &[])
}

/// [`start_worker_env`] with the worker started under `wrapper` ([`Proc::spawn_under`]).
pub fn start_worker_under(
    router: &Router,
    name: &str,
    fault: bool,
    extra: &[&str],
    env: &[(&str, String)],
    wrapper: &[String],
) -> Worker {
    let data_dir = router.dir.path().join(format!("data-{name}"));
    let mut args: Vec<String> = vec![
        "worker".into(),
        "--router".into(),
        router.url.clone(),
        "--name".into(),
        name.into(),
        "--data-dir".into(),
        data_dir.display().to_string(),
    ];
    if let Some(t) = &router.token {
        args.extend(["--token".into(), t.clone()]);
    }
    if let Some(ca) = &router.ca {
        args.extend(["--ca-cert".into(), ca.display().to_string()]);
    }
    args.extend(BASE_WORKER_ARGS.iter().map(|s| s.to_string()));
    if fault {
        args.extend(["--fault-admin".into(), "127.0.0.1:0".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut proc = Proc::spawn_under(name, router.dir.path(), wrapper, &args, env);
    let metrics = proc.wait_line("den-agent worker metrics on ", Duration::from_secs(20));
    let fault =
        fault.then(|| proc.wait_line("den-agent worker fault-admin on ", Duration::from_secs(20)));
    Worker {
        proc,
        name: name.into(),
        metrics,
        fault,
        data_dir,
    }
}

/// An HTTP client (the rustls provider installed once).
pub fn client() -> reqwest::Client {
    client_trusting(None)
}

/// An HTTP client that also trusts the PEM CA certificate `ca`.
pub fn client_trusting(ca: Option<&Path>) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = reqwest::Client::builder().timeout(Duration::from_secs(60));
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).expect("read CA");
        b = b.tls_certs_merge(reqwest::Certificate::from_pem_bundle(&pem).expect("CA PEM"));
    }
    b.build().expect("http client")
}

fn authed(req: reqwest::RequestBuilder, router: &Router) -> reqwest::RequestBuilder {
    match &router.token {
        Some(t) => req.bearer_auth(t),
        None => req,
    }
}

/// Poll `f` every 50 ms until it returns `Some`, or panic with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Router {
    /// An HTTP client for this router (trusting its CA when it serves TLS).
    pub fn http(&self) -> reqwest::Client {
        client_trusting(self.ca.as_deref())
    }

    /// `GET /v1/workers`.
    pub async fn workers(&self) -> Vec<Value> {
        let resp = authed(self.http().get(format!("{}/v1/workers", self.url)), self)
            .send()
            .await
            .expect("GET /v1/workers");
        resp.json().await.expect("workers JSON")
    }

    /// The router's current observation of `worker`.
    pub async fn observation(&self, worker: &str) -> Option<Value> {
        self.workers()
            .await
            .into_iter()
            .find(|w| w["worker_id"] == worker)
    }

    /// Wait until every worker in `names` heartbeats.
    pub async fn wait_workers(&self, names: &[&str]) {
        wait_for("workers to register", Duration::from_secs(20), || async {
            let ws = self.workers().await;
            names
                .iter()
                .all(|n| ws.iter().any(|w| w["worker_id"] == *n))
                .then_some(())
        })
        .await
    }

    /// `GET /v1/requests/{id}` (the decision record).
    pub async fn record(&self, id: &str) -> Value {
        let resp = authed(
            self.http().get(format!("{}/v1/requests/{id}", self.url)),
            self,
        )
        .send()
        .await
        .expect("GET record");
        resp.json().await.expect("record JSON")
    }

    pub async fn metrics(&self) -> String {
        self.http()
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn post(&self, path: &str) -> reqwest::Response {
        authed(self.http().post(format!("{}{path}", self.url)), self)
            .send()
            .await
            .expect("POST")
    }

    /// Run a generation to its end: every NDJSON line, and the client-measured time to
    /// the first delta.
    pub async fn generate(&self, body: Value) -> Generation {
        let mut s = self.stream(body).await;
        while s.next_line().await.is_some() {}
        s.finish()
    }

    /// Start a streaming generation.
    pub async fn stream(&self, body: Value) -> GenerationStream {
        let t0 = Instant::now();
        let resp = authed(self.http().post(format!("{}/v1/generate", self.url)), self)
            .json(&body)
            .send()
            .await
            .expect("POST /v1/generate");
        assert!(
            resp.status().is_success(),
            "generate failed: {} {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        );
        GenerationStream {
            t0,
            stream: Box::pin(resp.bytes_stream().map(|r| r.map(|b| b.to_vec()))),
            buf: Vec::new(),
            lines: Vec::new(),
            first_delta: None,
        }
    }
}

/// A generation in progress.
pub struct GenerationStream {
    t0: Instant,
    stream: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Vec<u8>>> + Send>>,
    buf: Vec<u8>,
    pub lines: Vec<Value>,
    first_delta: Option<Duration>,
}

impl GenerationStream {
    /// The next NDJSON line, or `None` at the end of the stream.
    pub async fn next_line(&mut self) -> Option<Value> {
        match self.try_next_line().await {
            Ok(line) => line,
            Err(e) => panic!("generate stream failed: {e}"),
        }
    }

    /// The next NDJSON line, `None` at the end of the stream, or the transport's error.
    pub async fn try_next_line(&mut self) -> Result<Option<Value>, String> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let v: Value = serde_json::from_slice(&line).expect("NDJSON line");
                if v["type"] == "delta" && self.first_delta.is_none() {
                    self.first_delta = Some(self.t0.elapsed());
                }
                self.lines.push(v.clone());
                return Ok(Some(v));
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(e.to_string()),
                None => return Ok(None),
            }
        }
    }

    pub fn finish(self) -> Generation {
        let terminal = self
            .lines
            .iter()
            .rev()
            .find(|l| l["type"] != "delta")
            .cloned()
            .unwrap_or(Value::Null);
        Generation {
            deltas: self
                .lines
                .iter()
                .filter(|l| l["type"] == "delta")
                .cloned()
                .collect(),
            terminal,
            ttft: self.first_delta,
        }
    }
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Generation {
    pub deltas: Vec<Value>,
    /// The completed / error / cancelled line.
    pub terminal: Value,
    /// Client-measured time from the request to the first delta.
    pub ttft: Option<Duration>,
}

impl Generation {
    pub fn kind(&self) -> &str {
        self.terminal["type"].as_str().unwrap_or("")
    }

    pub fn cached_tokens(&self) -> u64 {
        self.terminal["cached_tokens"].as_u64().unwrap_or(0)
    }

    pub fn worker(&self) -> String {
        self.terminal["worker"].as_str().unwrap_or("").to_owned()
    }

    pub fn tier(&self) -> String {
        self.terminal["tier"].as_str().unwrap_or("").to_owned()
    }

    pub fn tokens(&self) -> Vec<u64> {
        self.terminal["tokens"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    }
}

/// A generate body for `tokens` with `max_new` new tokens.
pub fn body(id: &str, tokens: &[u32], max_new: u32) -> Value {
    json!({"id": id, "tokens": tokens, "max_new_tokens": max_new})
}

/// `n` distinct prompt tokens for `seed`.
pub fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 256 + (i * 7 + seed * 131) % 400)
        .collect()
}

impl Worker {
    /// `GET /status`.
    pub async fn status(&self) -> Value {
        client()
            .get(format!("{}/status", self.metrics))
            .send()
            .await
            .expect("GET /status")
            .json()
            .await
            .expect("status JSON")
    }

    pub async fn metrics_text(&self) -> String {
        client()
            .get(format!("{}/metrics", self.metrics))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics")
    }

    /// `POST {fault}{path}` on the fault-admin endpoint.
    pub async fn fault(&self, path: &str) -> Value {
        let base = self
            .fault
            .as_ref()
            .expect("worker started with a fault-admin endpoint");
        let resp = client()
            .post(format!("{base}{path}"))
            .send()
            .await
            .expect("fault admin");
        assert!(
            resp.status().is_success(),
            "fault admin {path}: {}",
            resp.status()
        );
        resp.json().await.expect("fault admin JSON")
    }

    /// Wait until the worker has no live assignment and no checkpoint in flight.
    pub async fn wait_idle(&self) {
        wait_for(
            &format!("{} to be idle", self.name),
            Duration::from_secs(30),
            || async {
                let s = self.status().await;
                (s["assignments"] == 0 && s["checkpoints_in_flight"] == 0).then_some(())
            },
        )
        .await
    }
}

/// The value of metric `name` with exactly `labels` in Prometheus text (0 when absent).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    den_agent::metrics::read_value(text, name, labels).unwrap_or(0.0)
}

/// Sum of metric `name` over every label set.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| series.split('{').next() == Some(name))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_lookup_matches_exact_label_sets() {
        let text = "# HELP x h\nx{a=\"1\",b=\"2\"} 5\nx{a=\"1\"} 3\ny 7\n";
        assert_eq!(metric(text, "x", &[("b", "2"), ("a", "1")]), 5.0);
        assert_eq!(metric(text, "x", &[("a", "1")]), 3.0);
        assert_eq!(metric(text, "y", &[]), 7.0);
        assert_eq!(metric(text, "z", &[]), 0.0);
        assert_eq!(metric_sum(text, "x"), 8.0);
    }
}
