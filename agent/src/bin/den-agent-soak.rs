//! The router under a sustained load, on loopback: a real `den-agent router` process,
//! `--workers` simulated workers (light WebSocket clients in this process that hello,
//! heartbeat at 1 Hz, and answer every offer at once: accept, the tokens, the result) and
//! an open-loop client sending `--rate` requests per second to `/v1/generate` for
//! `--duration`. Reported every `--every`: requests answered and lost, the router's RSS
//! and CPU, heartbeats per second; at the end, lost and duplicated results, RSS growth
//! after warm-up (the first quarter), and heartbeats per CPU-second of the router.
//!
//! The simulated workers stand in for real ones because a thousand real workers (each a
//! page pool and an engine) cannot run on one machine; what is measured is the router,
//! which sees exactly the frames real workers send.
//!
//! Usage: `cargo run --release -p den-agent --bin den-agent-soak -- [--workers 1000]
//! [--rate 500] [--duration 10m] [--every 30s]`. Exits 1 when any request was lost or
//! answered twice.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use den_protocol::ids::{Epoch, WorkerId};
use den_protocol::observation::Observation;
use den_protocol::wire::{
    self, Heartbeat, Hello, OfferResult, PROTOCOL_VERSION, ResultMessage, RouterMessage, ToRouter,
    TokenDelta, WorkerInbound, WorkerResult,
};

struct Args {
    workers: usize,
    rate: u64,
    duration: Duration,
    every: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        workers: 1000,
        rate: 500,
        duration: Duration::from_secs(600),
        every: Duration::from_secs(30),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--workers" => a.workers = value()?.parse().map_err(|e| format!("--workers: {e}"))?,
            "--rate" => a.rate = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--duration" => a.duration = den_agent::config::parse_duration(&value()?)?,
            "--every" => a.every = den_agent::config::parse_duration(&value()?)?,
            other => return Err(format!("unknown argument {other:?}: see the file's header")),
        }
    }
    if a.workers == 0 || a.rate == 0 || a.duration.is_zero() || a.every.is_zero() {
        return Err("--workers, --rate, --duration and --every must be positive".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("den-agent-soak: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("den-agent-soak: runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(soak(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("den-agent-soak: {e}");
            ExitCode::from(1)
        }
    }
}

/// The router process, killed when dropped.
struct RouterProc {
    child: Child,
    addr: SocketAddr,
}

impl Drop for RouterProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_router(workers: usize) -> Result<RouterProc, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let bin = exe.with_file_name("den-agent");
    let cap = (workers + 1024).to_string();
    let mut child = Command::new(&bin)
        .args(["router", "--listen", "127.0.0.1:0", "--chunk-size", "16"])
        .args([
            "--max-connections",
            &cap,
            "--max-connections-per-peer",
            &cap,
        ])
        .args(["--retention", "10s", "--heartbeat-timeout", "5s"])
        .env("DEN_LOG", "warn")
        .env_remove("DEN_CONFIG")
        .env_remove("DEN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {}: {e} (build it: cargo build --release -p den-agent)",
                bin.display()
            )
        })?;
    let stdout = child.stdout.take().ok_or("no router stdout")?;
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
        .map_err(|e| format!("router stdout: {e}"))?;
    let addr = line
        .trim()
        .strip_prefix("den-agent router listening on http://")
        .and_then(|a| a.parse().ok())
        .ok_or(format!("unexpected router output {line:?}"))?;
    Ok(RouterProc { child, addr })
}

/// What one sample of the router process reads from /proc.
#[derive(Clone, Copy)]
struct ProcSample {
    rss_kib: u64,
    cpu: Duration,
}

fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name's closing parenthesis: utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant of the running system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ProcSample {
        rss_kib,
        cpu: Duration::from_millis(ticks * 1000 / hz),
    })
}

/// Counts shared by the clients.
#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    lost: AtomicU64,
    offers: AtomicU64,
    heartbeats: AtomicU64,
    connected: AtomicU64,
    /// Request ids answered, to catch a second terminal answer.
    answered: Mutex<HashSet<u64>>,
    duplicated: AtomicU64,
}

async fn soak(args: Args) -> Result<bool, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let router = start_router(args.workers)?;
    let pid = router.child.id();
    let counts = Arc::new(Counts::default());
    println!(
        "den-agent-soak: router pid {pid} on {}, {} simulated workers at 1 Hz, {} requests/s for {:?}",
        router.addr, args.workers, args.rate, args.duration
    );
    for i in 0..args.workers {
        tokio::spawn(sim_worker(router.addr, i, Arc::clone(&counts)));
        if i % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let t_wait = Instant::now();
    while (counts.connected.load(Ordering::Relaxed) as usize) < args.workers {
        if t_wait.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "only {} of {} simulated workers connected in 60 s",
                counts.connected.load(Ordering::Relaxed),
                args.workers
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let every worker's first heartbeat land before requests start.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(1024)
        .build()
        .map_err(|e| format!("client: {e}"))?;
    let url = format!("http://{}/v1/generate", router.addr);
    let start = Instant::now();
    let load = {
        let counts = Arc::clone(&counts);
        let rate = args.rate;
        let duration = args.duration;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut i = 0u64;
            let mut tasks = tokio::task::JoinSet::new();
            while start.elapsed() < duration {
                tick.tick().await;
                tasks.spawn(one_request(
                    client.clone(),
                    url.clone(),
                    i,
                    Arc::clone(&counts),
                ));
                i += 1;
                while tasks.try_join_next().is_some() {}
            }
            while tasks.join_next().await.is_some() {}
        })
    };

    let first = proc_sample(pid).ok_or("cannot read the router's /proc entry")?;
    let mut samples = vec![(Duration::ZERO, first, 0u64)];
    let mut last_print = Instant::now();
    println!("   t      sent  completed  failed  lost  rss MiB  router cpu %  heartbeats/s");
    while !load.is_finished() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if last_print.elapsed() < args.every && !load.is_finished() {
            continue;
        }
        last_print = Instant::now();
        let Some(s) = proc_sample(pid) else { break };
        let hb = counts.heartbeats.load(Ordering::Relaxed);
        let (t_prev, prev, hb_prev) = samples.last().copied().unwrap_or((Duration::ZERO, s, 0));
        let t = start.elapsed();
        let dt = (t - t_prev).as_secs_f64().max(1e-9);
        println!(
            "{:5.0}s {:9} {:10} {:7} {:5} {:8.1} {:13.0} {:13.0}",
            t.as_secs_f64(),
            counts.sent.load(Ordering::Relaxed),
            counts.completed.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed),
            counts.lost.load(Ordering::Relaxed),
            s.rss_kib as f64 / 1024.0,
            100.0 * (s.cpu.saturating_sub(prev.cpu)).as_secs_f64() / dt,
            (hb - hb_prev) as f64 / dt,
        );
        samples.push((t, s, hb));
    }
    let _ = load.await;
    let end = proc_sample(pid).ok_or("the router exited during the soak")?;
    let total = start.elapsed();
    let sent = counts.sent.load(Ordering::Relaxed);
    let completed = counts.completed.load(Ordering::Relaxed);
    let failed = counts.failed.load(Ordering::Relaxed);
    let lost = counts.lost.load(Ordering::Relaxed);
    let duplicated = counts.duplicated.load(Ordering::Relaxed);
    // RSS after warm-up: the sample nearest a quarter of the run, against the last.
    let warm = samples
        .iter()
        .find(|(t, _, _)| *t >= total / 4)
        .map_or(first, |(_, s, _)| *s);
    let cpu = end.cpu.saturating_sub(first.cpu).as_secs_f64();
    let hb_total = counts.heartbeats.load(Ordering::Relaxed);
    println!(
        "summary: {sent} requests in {:.0} s ({:.0}/s): {completed} completed, {failed} failed, {lost} lost, {duplicated} answered twice; {} offers answered",
        total.as_secs_f64(),
        sent as f64 / total.as_secs_f64(),
        counts.offers.load(Ordering::Relaxed)
    );
    println!(
        "summary: router RSS {:.1} MiB after warm-up, {:.1} MiB at the end ({:+.1} %); router CPU {:.0} % of a core on average",
        warm.rss_kib as f64 / 1024.0,
        end.rss_kib as f64 / 1024.0,
        100.0 * (end.rss_kib as f64 - warm.rss_kib as f64) / (warm.rss_kib.max(1) as f64),
        100.0 * cpu / total.as_secs_f64()
    );
    println!(
        "summary: {:.0} heartbeats/s sent; {:.0} requests and {:.0} heartbeats per CPU-second of the router",
        hb_total as f64 / total.as_secs_f64(),
        sent as f64 / cpu.max(1e-9),
        hb_total as f64 / cpu.max(1e-9)
    );
    Ok(lost == 0 && duplicated == 0 && failed == 0)
}

/// One request with a prompt of its own (no cache effects), two tokens, not streamed.
async fn one_request(client: reqwest::Client, url: String, i: u64, counts: Arc<Counts>) {
    counts.sent.fetch_add(1, Ordering::Relaxed);
    let tokens: Vec<u64> = (0..32u64)
        .map(|k| 256 + (i * 131 + k * 7919) % 30000)
        .collect();
    let body = serde_json::json!({
        "id": format!("soak-{i}"), "tokens": tokens, "max_new_tokens": 2, "stream": false,
    });
    let answer = match client.post(&url).json(&body).send().await {
        Ok(r) => r.text().await.ok(),
        Err(_) => None,
    };
    let terminal = answer.as_deref().and_then(|text| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["type"] != "delta")
    });
    match terminal {
        None => {
            counts.lost.fetch_add(1, Ordering::Relaxed);
        }
        Some(v) => {
            let first = counts
                .answered
                .lock()
                .map(|mut s| s.insert(i))
                .unwrap_or(true);
            if !first {
                counts.duplicated.fetch_add(1, Ordering::Relaxed);
            }
            if v["type"] == "completed" {
                counts.completed.fetch_add(1, Ordering::Relaxed);
            } else {
                counts.failed.fetch_add(1, Ordering::Relaxed);
                if counts.failed.load(Ordering::Relaxed) <= 5 {
                    eprintln!("request soak-{i}: {v}");
                }
            }
        }
    }
}

/// A simulated worker: hello, a heartbeat a second, and every offer answered at once.
async fn sim_worker(addr: SocketAddr, i: usize, counts: Arc<Counts>) {
    let url = format!("ws://{addr}/v1/agents");
    let Ok((ws, _)) = tokio_tungstenite::connect_async(url).await else {
        eprintln!("simulated worker {i}: cannot connect");
        return;
    };
    let (mut sink, mut stream) = ws.split();
    let me = WorkerId::new(format!("sim-{i:04}"));
    let hello = ToRouter::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        worker_id: me.clone(),
        node: format!("node-{i:04}").into(),
        epoch: Epoch(1),
        credential: Some(format!("{i:064x}")),
    });
    let Ok(frame) = wire::encode(&hello) else {
        return;
    };
    if sink.send(Message::binary(frame)).await.is_err() {
        return;
    }
    let _welcome = stream.next().await;
    counts.connected.fetch_add(1, Ordering::Relaxed);
    let mut obs = Observation::new(me.clone(), format!("node-{i:04}"));
    obs.epoch = Epoch(1);
    obs.models.insert("den-synthetic".into());
    obs.free_pages = 4096;
    obs.pool.total_pages = 4096;
    obs.pool.free = 4096;
    obs.prefill_ms_per_token = 0.01;
    obs.first_token_ms = 1.0;
    // Spread the heartbeats over the second.
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_millis((i as u64 * 7919) % 1000),
        Duration::from_secs(1),
    );
    let mut seq = 0u64;
    loop {
        let frames: Vec<ToRouter> = tokio::select! {
            _ = tick.tick() => {
                obs.sequence = seq;
                seq += 1;
                counts.heartbeats.fetch_add(1, Ordering::Relaxed);
                vec![ToRouter::Heartbeat(Box::new(Heartbeat { observation: obs.clone() }))]
            }
            msg = stream.next() => {
                let Some(Ok(msg)) = msg else { return };
                answer(&msg, &me, &counts)
            }
        };
        for f in frames {
            let Ok(bytes) = wire::encode(&f) else { return };
            if sink.send(Message::binary(bytes)).await.is_err() {
                return;
            }
        }
    }
}

/// The frames answering one from the router: an offer is accepted and served at once.
fn answer(msg: &Message, me: &WorkerId, counts: &Counts) -> Vec<ToRouter> {
    let bytes: &[u8] = match msg {
        Message::Text(t) => t.as_bytes(),
        Message::Binary(b) => b,
        _ => return Vec::new(),
    };
    let Ok(WorkerInbound::Router(RouterMessage::Offer(offer))) =
        wire::decode_for_worker(bytes, wire::DEFAULT_MAX_FRAME, me)
    else {
        return Vec::new();
    };
    counts.offers.fetch_add(1, Ordering::Relaxed);
    let a = offer.assignment.clone();
    let n = offer.request.max_new_tokens;
    let tokens: Vec<u32> = (0..n).map(|k| 1000 + k).collect();
    let mut out = vec![ToRouter::OfferResult(OfferResult {
        assignment: a.clone(),
        worker_epoch: Epoch(1),
        accepted: true,
        reason: None,
    })];
    for (index, &token) in tokens.iter().enumerate() {
        out.push(ToRouter::Token(TokenDelta {
            assignment: a.clone(),
            token,
            index: index as u32,
        }));
    }
    out.push(ToRouter::Result(ResultMessage {
        assignment: a,
        result: Box::new(WorkerResult::completed(tokens, 0)),
    }));
    out
}
