//! `den-agent`: the command-line shell over the router and worker runtimes (see
//! `den_agent::cli` for the options and their layering).
//!
//! Machine-readable lines on stdout (everything else is logged to stderr):
//! - `den-agent router listening on http://ADDR` (https with `--tls-cert`)
//! - `den-agent worker metrics on http://ADDR` (with `--metrics-listen`)
//! - `den-agent worker fault-admin on http://ADDR` (with `--fault-admin`)

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use den_agent::cli::{self, Cli, Command, FileConfig, LocalArgs};
use den_agent::config;
use den_agent::local_cluster::{LocalCluster, LocalClusterSpec};
use den_agent::router::RouterServer;
use den_agent::workload::{self, WorkloadSpec};
use den_agent::{logging, worker};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let file: FileConfig = match config::load(cli.config.as_deref()) {
        Ok(f) => f,
        Err(e) => return fail(2, &e.to_string()),
    };
    let format = cli.log_format.or(file.log_format).unwrap_or_default();
    logging::init(format, cli.log.as_deref().or(file.log.as_deref()));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(1, &format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Router(args) => router(&args, &file).await,
            Command::Worker(args) => run_worker(&args, &file).await,
            Command::Local(args) => local(&args, &file).await,
        }
    })
}

async fn router(args: &cli::RouterArgs, file: &FileConfig) -> ExitCode {
    let (listen, mut opts) = match cli::router_options(args, &file.router) {
        Ok(x) => x,
        Err(e) => return fail(2, &e),
    };
    if let Err(e) = den_agent::router::manage::gguf_cards::resolve(&mut opts).await {
        return fail(2, &e);
    }
    if opts.token.is_none() && !listen.ip().is_loopback() {
        tracing::warn!(
            %listen,
            "no --token: anyone who can reach this address can register workers and send requests; set DEN_TOKEN"
        );
    }
    let listener = match RouterServer::bind(listen).await {
        Ok(l) => l,
        Err(e) => return fail(1, &format!("cannot listen on {listen}: {e}")),
    };
    let addr = listener.local_addr().unwrap_or(listen);
    let scheme = if opts.tls.is_some() { "https" } else { "http" };
    say(&format!("den-agent router listening on {scheme}://{addr}"));
    tracing::info!(
        %addr,
        chunk_size = opts.chunk_size,
        catalog = opts.catalog.len(),
        "router started"
    );
    let server = RouterServer::start(opts).with_ingress().with_management();
    // The listener is bound: connections queue until `serve` takes them.
    notify_ready(&format!("router listening on {addr}"));
    let stop = async {
        shutdown_signal().await;
        if let Err(e) = den_agent::systemd::stopping() {
            tracing::warn!("{e}");
        }
    };
    match server.serve(listener, stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(1, &format!("router failed: {e}")),
    }
}

/// systemd readiness (`Type=notify`); a failure is a warning, not a stop.
fn notify_ready(status: &str) {
    if let Err(e) = den_agent::systemd::ready(status) {
        tracing::warn!("{e}");
    }
}

async fn run_worker(args: &cli::WorkerArgs, file: &FileConfig) -> ExitCode {
    let opts = match cli::worker_options(args, &file.worker) {
        Ok(o) => o,
        Err(e) => return fail(2, &e),
    };
    // Before the first connection: every client of this process trusts the same roots.
    if let Some(ca) = args.ca_cert.as_ref().or(file.worker.ca_cert.as_ref())
        && let Err(e) = den_agent::tls::trust_also(ca)
    {
        return fail(2, &format!("--ca-cert: {e}"));
    }
    let running = match worker::start(opts).await {
        Ok(w) => w,
        Err(e) => return fail(1, &e.to_string()),
    };
    if let Some(a) = running.endpoints.metrics {
        say(&format!("den-agent worker metrics on http://{a}"));
    }
    if let Some(a) = running.endpoints.fault_admin {
        say(&format!("den-agent worker fault-admin on http://{a}"));
    }
    notify_ready("worker started");
    shutdown_signal().await;
    if let Err(e) = den_agent::systemd::stopping() {
        tracing::warn!("{e}");
    }
    running.shutdown().await;
    ExitCode::SUCCESS
}

async fn local(args: &LocalArgs, file: &FileConfig) -> ExitCode {
    let f = &file.local;
    let agent = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            return fail(
                1,
                &format!("cannot find this binary to start children: {e}"),
            );
        }
    };
    let data = match tempfile_dir() {
        Ok(d) => d,
        Err(e) => return fail(1, &format!("cannot create a temporary directory: {e}")),
    };
    let workers = args.workers.or(f.workers).unwrap_or(3).max(1);
    let mut spec = LocalClusterSpec::new(agent, workers, data.clone());
    spec.log_dir = args.log_dir.clone().or(f.log_dir.clone());
    let prefill = args
        .prefill_ms_per_token
        .or(f.prefill_ms_per_token)
        .unwrap_or(0.5);
    let decode = args
        .decode_ms_per_token
        .or(f.decode_ms_per_token)
        .unwrap_or(2.0);
    let first = args.first_token_ms.or(f.first_token_ms).unwrap_or(2.0);
    spec.worker_args = vec![
        "--prefill-ms-per-token".into(),
        prefill.to_string(),
        "--decode-ms-per-token".into(),
        decode.to_string(),
        "--first-token-ms".into(),
        first.to_string(),
        "--pages".into(),
        "2048".into(),
        "--kv-bytes-per-token".into(),
        "1024".into(),
        "--ram-bytes".into(),
        "256MiB".into(),
    ];
    let workload = WorkloadSpec {
        duration: args
            .duration
            .or(match f.duration.as_deref().map(config::parse_duration) {
                Some(Ok(d)) => Some(d),
                Some(Err(e)) => return fail(2, &format!("local.duration: {e}")),
                None => None,
            })
            .unwrap_or(std::time::Duration::from_secs(10)),
        requests: args.requests.or(f.requests),
        concurrency: args.concurrency.or(f.concurrency).unwrap_or(6),
        max_new_tokens: args.max_new_tokens.or(f.max_new_tokens).unwrap_or(16),
        seed: args.seed.or(f.seed).unwrap_or(1),
        ..WorkloadSpec::default()
    };
    say(&format!(
        "starting a router and {workers} workers on loopback (prefill {prefill} ms/token, first token {first} ms, decode {decode} ms/token)"
    ));
    let cluster = match LocalCluster::start(&spec).await {
        Ok(c) => c,
        Err(e) => return fail(1, &e.to_string()),
    };
    say(&format!("router: {}", cluster.router_url));
    say(&format!(
        "running the workload: {} conversations at a time over {} shared system prompts, {} s{}",
        workload.concurrency,
        workload.system_prompts,
        workload.duration.as_secs_f64(),
        workload
            .requests
            .map(|n| format!(" or {n} requests"))
            .unwrap_or_default()
    ));
    let report = tokio::select! {
        r = workload::run(&cluster.router_url, None, &workload) => Some(r),
        _ = shutdown_signal() => None,
    };
    cluster.stop().await;
    let _ = std::fs::remove_dir_all(&data);
    match report {
        Some(r) => {
            say(&r.summary());
            if r.completed() == 0 {
                return fail(1, "no request completed");
            }
            ExitCode::SUCCESS
        }
        None => ExitCode::from(130),
    }
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("den-local-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Resolves on the first SIGTERM or SIGINT; a second one exits at once.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).ok();
    let first = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = first => {}
    }
    tracing::info!("signal received: draining (send it again to exit at once)");
    tokio::spawn(async move {
        let again = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = again => {}
        }
        eprintln!("den-agent: second signal, exiting without draining");
        // The operator asked twice: leave now, without unwinding the drain in progress.
        #[allow(clippy::exit)]
        std::process::exit(130);
    });
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// One line on stderr; with JSON logs, an error event instead (the shipper's format).
fn fail(code: u8, message: &str) -> ExitCode {
    if logging::is_json() {
        tracing::error!("{message}");
    } else {
        eprintln!("den-agent: {message}");
    }
    ExitCode::from(code)
}
