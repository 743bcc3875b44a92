//! Requests per second through the OpenAI ingress with a zero-cost engine.
//!
//! Serves the ingress on loopback over `ingress::fake::FakeSubmitter` (an in-process
//! stand-in for the router whose synthetic engine answers instantly: every delivery is
//! queued inside `submit`), then drives `POST /v1/chat/completions` from `--concurrency`
//! keep-alive HTTP/1.1 clients (reqwest) in the same process, non-streamed and streamed.
//! Prints req/s, output tokens/s and the median / p99 request latency (send → whole body
//! read). Client and server share the machine's cores, so this is a lower bound on what
//! the ingress alone sustains.
//!
//! `cargo run --release -p den-agent --bin den-agent-ingress-bench -- --concurrency 32`

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use clap::Parser;
use serde_json::json;

use den_agent::ingress::fake::{FakeModel, FakeSubmitter};
use den_agent::ingress::{IngressConfig, routes};
use den_agent::serving::SharedSubmitter;

/// Requests per second through den's OpenAI ingress with a zero-cost fake router.
#[derive(Debug, Parser)]
#[command(name = "den-agent-ingress-bench", version, about)]
struct Args {
    /// Concurrent clients (each one keep-alive connection).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Timed requests per mode (after `--warmup` untimed ones).
    #[arg(long, default_value_t = 20_000)]
    requests: usize,
    #[arg(long, default_value_t = 500)]
    warmup: usize,
    /// `max_tokens` per request (one SSE chunk per token when streamed).
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Runtime worker threads (default: the number of cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Leave Nagle's algorithm on for accepted connections (to show what TCP_NODELAY
    /// is worth for streams).
    #[arg(long)]
    nagle: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = args.threads {
        rt.worker_threads(t.max(1));
    }
    let rt = match rt.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("den-agent-ingress-bench: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("den-agent-ingress-bench: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let fake = FakeSubmitter::unrecorded(vec![FakeModel::new("den-bench", 1 << 20)]);
    let submitter: SharedSubmitter = fake;
    let app = routes(submitter, IngressConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot bind 127.0.0.1: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let nodelay = !args.nagle;
    // The way the router should serve the ingress: small SSE writes must not wait for
    // the client's delayed ACKs.
    let listener = listener.tap_io(move |tcp| {
        if let Err(e) = tcp.set_nodelay(nodelay) {
            eprintln!("den-agent-ingress-bench: cannot set TCP_NODELAY: {e}");
        }
    });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("den-agent-ingress-bench: server stopped: {e}");
        }
    });
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(args.concurrency)
        .build()
        .map_err(|e| e.to_string())?;
    let url = format!("http://{addr}/v1/chat/completions");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "ingress bench: {} cores, {} runtime threads, concurrency {}, {} requests per mode (+{} warm-up), max_tokens {}, TCP_NODELAY {}",
        cores,
        args.threads.unwrap_or(cores),
        args.concurrency,
        args.requests,
        args.warmup,
        args.max_tokens,
        if nodelay { "on" } else { "off" }
    );
    println!(
        "{:>13}  {:>9}  {:>11}  {:>10}  {:>10}",
        "mode", "req/s", "out tok/s", "p50 ms", "p99 ms"
    );
    for stream in [false, true] {
        let body = json!({
            "model": "den-bench",
            "messages": [{"role": "user", "content": "hello den, what is in the cache"}],
            "max_tokens": args.max_tokens,
            "stream": stream,
            "stream_options": {"include_usage": stream},
        })
        .to_string();
        drive(&client, &url, &body, stream, args.warmup, args.concurrency).await?;
        let started = Instant::now();
        let mut latencies = drive(
            &client,
            &url,
            &body,
            stream,
            args.requests,
            args.concurrency,
        )
        .await?;
        let wall = started.elapsed().as_secs_f64();
        latencies.sort();
        let rps = args.requests as f64 / wall;
        println!(
            "{:>13}  {:>9.0}  {:>11.0}  {:>10.3}  {:>10.3}",
            if stream { "streamed" } else { "non-streamed" },
            rps,
            rps * f64::from(args.max_tokens),
            ms(percentile(&latencies, 0.50)),
            ms(percentile(&latencies, 0.99)),
        );
    }
    Ok(())
}

/// Send `total` requests from `concurrency` clients; every response is checked.
async fn drive(
    client: &reqwest::Client,
    url: &str,
    body: &str,
    stream: bool,
    total: usize,
    concurrency: usize,
) -> Result<Vec<Duration>, String> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency.max(1) {
        let (client, url, body, next) = (
            client.clone(),
            url.to_owned(),
            body.to_owned(),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let t = Instant::now();
                let resp = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .map_err(|e| format!("request failed: {e}"))?;
                let status = resp.status();
                let text = resp.text().await.map_err(|e| format!("body failed: {e}"))?;
                latencies.push(t.elapsed());
                let complete = if stream {
                    text.ends_with("data: [DONE]\n\n")
                } else {
                    text.contains("\"finish_reason\":\"length\"")
                };
                if !status.is_success() || !complete {
                    return Err(format!("unexpected response {status}: {text}"));
                }
            }
            Ok::<_, String>(latencies)
        }));
    }
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await.map_err(|e| e.to_string())??);
    }
    Ok(all)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(i).copied().unwrap_or(Duration::ZERO)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
