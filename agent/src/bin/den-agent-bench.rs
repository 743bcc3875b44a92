//! Router and worker runtime benchmarks on loopback (real WebSockets, real actors, the
//! synthetic engine at zero declared cost so only den's own overhead is measured):
//!
//! 1. **latency**: one request at a time through a router and one worker: submission →
//!    offer → accept → restore/prefill/decode → result → completed delivery; median, p99.
//! 2. **heartbeats**: heartbeats accepted per second by a router whose whole runtime
//!    (WebSocket reads, frame decoding, the actor) runs on **one** thread, fed by 8
//!    connections that send heartbeats as fast as the router takes them.
//! 3. **throughput**: requests per second through a router and 3 workers with 64 requests
//!    in flight.
//!
//! A round trip is mostly wake-ups — client → router actor → worker (a WebSocket frame)
//! → device thread → worker → router (a frame) → client: six — and what a wake-up costs
//! differs twofold between VMs of the same kind. So the latency line also measures, in
//! the same run, a bare thread handoff round trip (two wake-ups, std channels) and a bare
//! loopback TCP round trip (`TCP_NODELAY`), each between two threads pinned to different
//! cores, and gives den's round trip in handoff round trips: the figure that compares
//! across machines.
//!
//! Usage: `cargo run --release -p den-agent --bin den-agent-bench [-- --quick]`
//! (`-- --heartbeats` or `-- --latency` for that part alone; `-- --one-thread` runs the
//! router and workers on one runtime thread instead of a work-stealing pool;
//! `-- --idle-spin 200us` runs the workers with that `--idle-spin` instead of den-agent's
//! default, 0). Built with
//! `--features hop-trace`, the latency part also prints the median time of each hop of
//! the path (`den_agent::hops`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;

use den_agent::engine::EngineCosts;
use den_agent::hops::{self, Hop};
use den_agent::router::{RouterHandle, RouterOptions, RouterServer};
use den_agent::serving::Submitter;
use den_agent::worker::{self, RunningWorker, WorkerOptions};
use den_agent::workload::quantile;
use den_protocol::observation::Observation;
use den_protocol::request::GenerationRequest;
use den_protocol::router::DeliveryKind;
use den_protocol::wire::PROTOCOL_VERSION;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("den-agent-bench: {e}");
            ExitCode::from(1)
        }
    }
}

/// The flags this bench takes (see the module comment).
const FLAGS: [&str; 4] = ["--quick", "--heartbeats", "--latency", "--one-thread"];

/// The command line, read once: the flags given, and `--idle-spin DURATION` (the workers'
/// device threads poll that long before they park).
struct Args {
    flags: Vec<String>,
    spin: Duration,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut args = std::env::args().skip(1);
        let mut out = Args {
            flags: Vec::new(),
            spin: worker::DEFAULT_IDLE_SPIN,
        };
        while let Some(a) = args.next() {
            if a == "--idle-spin" {
                let v = args
                    .next()
                    .ok_or("--idle-spin needs a duration, e.g. 200us")?;
                out.spin = den_agent::config::parse_duration(&v)
                    .map_err(|e| format!("--idle-spin: {e}"))?;
                if out.spin > worker::MAX_IDLE_SPIN {
                    return Err(format!(
                        "--idle-spin {v} is longer than {:?}, as den-agent allows",
                        worker::MAX_IDLE_SPIN
                    ));
                }
            } else if FLAGS.contains(&a.as_str()) {
                out.flags.push(a);
            } else {
                return Err(format!(
                    "unknown argument {a:?}: it takes {}, --idle-spin DURATION",
                    FLAGS.join(", ")
                ));
            }
        }
        Ok(out)
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

fn run() -> Result<(), String> {
    let args = Args::parse()?;
    let spin = args.spin;
    let quick = args.has("--quick");
    let n_latency = if quick { 300 } else { 3000 };
    let n_throughput = if quick { 2000 } else { 20000 };
    let hb_secs = if quick { 1.0 } else { 3.0 };
    if args.has("--heartbeats") {
        return heartbeats(hb_secs);
    }
    let latency_only = args.has("--latency");
    // `--one-thread`: the router and the workers on one runtime thread (the device
    // threads stay theirs), to show what the runtime's own wake-ups cost.
    let rt = if args.has("--one-thread") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    }
    .map_err(|e| format!("runtime: {e}"))?;
    println!(
        "den-agent-bench ({} build; workers' --idle-spin {spin:?})",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    // The client loop is a task on the agents' runtime, as the OpenAI ingress's request
    // handlers are: driven from `block_on` on the main thread instead, every delivery
    // would also wake a thread outside the runtime, which no deployment has.
    let median = rt
        .block_on(async { tokio::spawn(latency(n_latency, spin)).await })
        .map_err(|e| format!("latency task: {e}"))??;
    // After the agents are gone, so the reference runs on a quiet machine as den did.
    let (tcp, handoff) = machine_round_trips(n_latency)?;
    println!(
        "latency reference, same run: loopback TCP round trip median {tcp:.0} µs, thread handoff round trip median {handoff:.0} µs; den's round trip = {:.1} handoff round trips (its path has six wake-ups, three round trips' worth)",
        median / handoff
    );
    if latency_only {
        return Ok(());
    }
    heartbeats(hb_secs)?;
    rt.block_on(throughput(n_throughput, spin))
}

/// A router on 127.0.0.1:0 in the current runtime.
async fn router() -> Result<(RouterHandle, SocketAddr), String> {
    let opts = RouterOptions {
        chunk_size: 16,
        offer_timeout: Duration::from_secs(5),
        retention: Duration::from_secs(5),
        ..RouterOptions::default()
    };
    let listener = RouterServer::bind(([127, 0, 0, 1], 0).into())
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("bind: {e}"))?;
    let server = RouterServer::start(opts);
    let handle = server.handle();
    tokio::spawn(server.serve(listener, std::future::pending()));
    Ok((handle, addr))
}

async fn workers(addr: SocketAddr, n: usize, spin: Duration) -> Result<Vec<RunningWorker>, String> {
    let mut out = Vec::new();
    for i in 0..n {
        let dir = std::env::temp_dir().join(format!("den-bench-{}-w{i}", std::process::id()));
        let mut o = WorkerOptions::new(format!("ws://{addr}"), &format!("bench-{i}"), dir);
        o.costs = EngineCosts::new(0.0, 0.0, 0.0).map_err(|e| e.to_string())?;
        o.ram_bytes = 0;
        o.pages = 8192;
        o.kv_bytes_per_token = 256;
        o.chunk_size = 16;
        o.verify_restores = false;
        o.idle_spin = spin;
        out.push(worker::start(o).await.map_err(|e| format!("worker: {e}"))?);
    }
    Ok(out)
}

async fn wait_workers(h: &RouterHandle, n: usize) {
    while h.workers().await.len() < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn request(i: u64, max_new: u32) -> Option<GenerationRequest> {
    // Distinct prompts: every request is a miss (prefill + decode), no cache effects. The
    // first two tokens spell `i` in base 400, so no two of 160,000 requests share a chunk.
    let tokens: Vec<u32> = (0..32u64)
        .map(|k| match k {
            0 => 256 + (i % 400) as u32,
            1 => 256 + (i / 400 % 400) as u32,
            _ => 256 + ((i * 131 + k * 7) % 400) as u32,
        })
        .collect();
    GenerationRequest::new(format!("b-{i}"), "den-synthetic", tokens, max_new).ok()
}

async fn run_one(h: &RouterHandle, i: u64) -> bool {
    let Some(Ok(mut rx)) = request(i, 1).map(|r| h.submit(r)) else {
        return false;
    };
    while let Some(d) = rx.recv().await {
        match d.kind {
            DeliveryKind::Delta { .. } => {}
            DeliveryKind::Completed { .. } => {
                hops::mark(Hop::Delivered);
                return true;
            }
            _ => return false,
        }
    }
    false
}

/// One request at a time; returns the median round trip, µs.
async fn latency(n: usize, spin: Duration) -> Result<f64, String> {
    let (h, addr) = router().await?;
    let ws = workers(addr, 1, spin).await?;
    wait_workers(&h, 1).await;
    for i in 0..50 {
        run_one(&h, 1_000_000 + i).await; // warm-up
    }
    let mut samples = Vec::with_capacity(n);
    let mut legs: Vec<Vec<f64>> = vec![Vec::with_capacity(n); hops::PATH.len()];
    for i in 0..n as u64 {
        let t0 = Instant::now();
        hops::mark(Hop::Submitted);
        if !run_one(&h, i).await {
            return Err(format!("request {i} failed"));
        }
        samples.push(t0.elapsed().as_secs_f64() * 1e6);
        if let Some(at) = hops::read() {
            for (k, pair) in at.windows(2).enumerate() {
                legs[k + 1].push((pair[1] as f64 - pair[0] as f64) / 1e3);
            }
        }
    }
    let (p50, p99) = (
        median(&mut samples),
        quantile(&mut samples, 0.99).unwrap_or(f64::NAN),
    );
    println!(
        "latency: submit → offer → accept → prefill+decode (1 token) → result, 1 worker, {n} sequential requests: median {p50:.0} µs, p99 {p99:.0} µs"
    );
    if hops::read().is_some() {
        println!("  where it goes (median µs of each hop; hop-trace build, so slightly slower):");
        for ((_, what), leg) in hops::PATH.iter().zip(legs.iter_mut()).skip(1) {
            println!("  {:>7.1}  {what}", median(leg));
        }
    }
    for w in ws {
        w.shutdown().await;
    }
    Ok(p50)
}

fn median(samples: &mut [f64]) -> f64 {
    quantile(samples, 0.5).unwrap_or(f64::NAN)
}

/// Medians of `n` one-byte loopback TCP round trips and of `n` std-channel round trips
/// between two threads, µs: what this machine's wake-ups cost, measured beside den's.
/// The two sides are pinned to different cores where there are two: left to the
/// scheduler, a pair shares a core in some runs (a handoff in 9 µs instead of 50), and
/// den's actors do not.
fn machine_round_trips(n: usize) -> Result<(f64, f64), String> {
    std::thread::spawn(move || {
        pin_to(0);
        Ok((tcp_round_trips(n)?, handoff_round_trips(n)?))
    })
    .join()
    .map_err(|_| "the reference thread panicked".to_string())?
}

fn tcp_round_trips(n: usize) -> Result<f64, String> {
    use std::io::{Read, Write};
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("bind: {e}"))?;
    let echo = std::thread::spawn(move || {
        pin_to(1);
        if let Ok((mut s, _)) = listener.accept() {
            let _ = s.set_nodelay(true);
            let mut b = [0u8; 1];
            while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
        }
    });
    let mut c = std::net::TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    c.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
    let mut samples = Vec::with_capacity(n);
    let mut b = [0u8; 1];
    for i in 0..n + 100 {
        let t0 = Instant::now();
        c.write_all(&[1]).map_err(|e| format!("tcp write: {e}"))?;
        c.read_exact(&mut b).map_err(|e| format!("tcp read: {e}"))?;
        if i >= 100 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(c);
    let _ = echo.join();
    Ok(median(&mut samples))
}

fn handoff_round_trips(n: usize) -> Result<f64, String> {
    let (to_tx, to_rx) = std::sync::mpsc::channel::<u8>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<u8>();
    let bounce = std::thread::spawn(move || {
        pin_to(1);
        while let Ok(x) = to_rx.recv() {
            if back_tx.send(x).is_err() {
                break;
            }
        }
    });
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 100 {
        let t0 = Instant::now();
        to_tx.send(1).map_err(|e| format!("channel: {e}"))?;
        back_rx.recv().map_err(|e| format!("channel: {e}"))?;
        if i >= 100 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(to_tx);
    let _ = bounce.join();
    Ok(median(&mut samples))
}

/// Pins the calling thread to core `cpu` when the machine has more than one; best
/// effort (a failure leaves the thread where the scheduler puts it).
fn pin_to(cpu: usize) {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is the empty set, CPU_SET writes inside it (cpu < 2 <
    // CPU_SETSIZE), and pid 0 makes sched_setaffinity change the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn heartbeats(secs: f64) -> Result<(), String> {
    // The router's whole runtime on one thread.
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // Asks the router thread for its own CPU time (per core = per CPU-second of it).
    let (cpu_tx, mut cpu_rx) = tokio::sync::mpsc::channel::<oneshot::Sender<Option<Duration>>>(4);
    let router_thread = std::thread::Builder::new()
        .name("hb-router".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = addr_tx.send(Err(format!("router runtime: {e}")));
                    return;
                }
            };
            rt.block_on(async move {
                let _ = addr_tx.send(router().await);
                // A current-thread runtime: this task reads the router thread's own clock.
                tokio::spawn(async move {
                    while let Some(reply) = cpu_rx.recv().await {
                        let _ = reply.send(thread_cpu());
                    }
                });
                let _ = stop_rx.await;
            });
        });
    let router_thread = router_thread.map_err(|e| format!("router thread: {e}"))?;
    let (handle, addr) = addr_rx
        .recv()
        .map_err(|_| "the router thread ended".to_owned())??;
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(|e| format!("client runtime: {e}"))?;
    let count = |h: &RouterHandle| h.metrics().value("den_router_heartbeats_total", &[]);
    let (elapsed, accepted, busy) = clients.block_on(async {
        let conns = 8;
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for c in 0..conns {
            let stop = Arc::clone(&stop);
            tasks.push(tokio::spawn(heartbeat_client(addr, c, stop)));
        }
        tokio::time::sleep(Duration::from_millis(300)).await; // connect and warm up
        let cpu = || async {
            let (tx, rx) = oneshot::channel();
            cpu_tx.send(tx).await.ok()?;
            rx.await.ok().flatten()
        };
        let cpu0 = cpu().await;
        let c0 = count(&handle);
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        let c1 = count(&handle);
        let elapsed = t0.elapsed();
        let cpu1 = cpu().await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
        }
        let busy = match (cpu0, cpu1) {
            (Some(a), Some(b)) => b.checked_sub(a),
            _ => None,
        };
        (elapsed, c1 - c0, busy)
    });
    println!(
        "heartbeats: {:.0} accepted per second by a router on one thread (8 connections, {:.1} s)",
        accepted / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    // The clients share the machine's cores with the router, so the wall-clock rate is
    // bounded by them too; the router thread's own CPU time gives the per-core figure.
    match busy {
        Some(busy) if !busy.is_zero() => println!(
            "heartbeats per core: {:.0} per CPU-second of the router thread ({:.0} % of a core busy)",
            accepted / busy.as_secs_f64(),
            100.0 * busy.as_secs_f64() / elapsed.as_secs_f64()
        ),
        _ => println!("heartbeats per core: the router thread's CPU time is not readable here"),
    }
    let _ = stop_tx.send(());
    let _ = router_thread.join();
    Ok(())
}

/// CPU time the calling thread has run (Linux `/proc/thread-self/schedstat`).
fn thread_cpu() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// One connection sending heartbeats with increasing sequence numbers until `stop`.
async fn heartbeat_client(addr: SocketAddr, c: usize, stop: Arc<AtomicBool>) {
    let url = format!("ws://{addr}/v1/agents");
    let Ok((mut ws, _)) = tokio_tungstenite::connect_async(url).await else {
        eprintln!("heartbeat client {c}: cannot connect");
        return;
    };
    let name = format!("hb-{c}");
    let hello = json!({"type": "hello", "protocol_version": PROTOCOL_VERSION,
                       "worker_id": name, "node": name, "epoch": 1});
    if ws.send(Message::text(hello.to_string())).await.is_err() {
        return;
    }
    let _welcome = ws.next().await;
    let mut obs = Observation::new(name.as_str(), name.as_str());
    obs.epoch = den_protocol::ids::Epoch(1);
    obs.models.insert("den-synthetic".into());
    let (mut sink, mut stream) = ws.split();
    // Drain whatever the router sends (nothing, normally).
    tokio::spawn(async move { while stream.next().await.is_some() {} });
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        obs.sequence = seq;
        seq += 1;
        let frame = json!({"type": "heartbeat", "observation": &obs}).to_string();
        if sink.send(Message::text(frame)).await.is_err() {
            break;
        }
    }
}

async fn throughput(n: usize, spin: Duration) -> Result<(), String> {
    let (h, addr) = router().await?;
    let ws = workers(addr, 3, spin).await?;
    wait_workers(&h, 3).await;
    let in_flight = 64;
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..in_flight {
        let h = h.clone();
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u64;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n as u64 {
                    return ok;
                }
                if run_one(&h, 2_000_000 + i).await {
                    ok += 1;
                }
            }
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap_or(0);
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "throughput: {:.0} requests/s through the router, 3 workers, zero engine cost, {in_flight} in flight ({ok} of {n} completed in {secs:.2} s)",
        ok as f64 / secs
    );
    for w in ws {
        w.shutdown().await;
    }
    Ok(())
}
