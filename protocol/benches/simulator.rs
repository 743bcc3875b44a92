//! Simulator throughput: events delivered per second on a workload of many requests
//! (8 workers, 2 000 requests with 3 alternatives each, 16 streamed tokens per request).
//!
//! `cargo bench -p den-protocol --bench simulator`
// A benchmark may unwrap, expect and panic: a broken set-up should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // benches time and read files

use den_protocol::candidate::{Candidate, Tier, TransferCapabilities};
use den_protocol::ids::{Epoch, WorkerId};
use den_protocol::request::GenerationRequest;
use den_protocol::sim::{SimConfig, Simulation};
use den_protocol::worker::Counters;
use divan::counter::ItemsCount;
use divan::{Bencher, black_box};

/// The allocator den-agent runs with (`agent/src/lib.rs`), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

const WORKERS: usize = 8;
const REQUESTS: usize = 2_000;

fn candidate(worker: usize, tier: Tier, cached: u32, queue_ms: f64) -> Candidate {
    Candidate {
        worker_id: WorkerId::from(format!("worker-{worker}")),
        worker_epoch: Epoch(0),
        tier,
        cached_token_count: cached,
        cached_bytes: cached as u64 * 1024,
        queue_ms,
        prefix_load_ms: if tier == Tier::Ssd { 3.0 } else { 0.0 },
        gpu_restore_ms: if tier == Tier::Ssd { 1.0 } else { 0.0 },
        prefill_ms_per_token: 0.1,
        first_token_ms: 2.0,
        page_size: 16,
        free_pages: 1_000_000,
        evictable_pages: 0,
        max_context: 4096,
        online: true,
        model_loaded: true,
        exact: true,
        source_continuation_id: None,
        resident_token_count: 0,
        transfer: TransferCapabilities::default(),
        imposed_ms: 0.0,
    }
}

/// A simulation with every request submitted at t = 0, ready to run.
fn prepared(trace: bool) -> Simulation {
    let mut sim = Simulation::new(SimConfig {
        decode_ms_per_token: 1.0,
        deadline_ms: 1_000_000,
        trace,
        ..SimConfig::default()
    });
    for w in 0..WORKERS {
        sim.add_worker(
            format!("worker-{w}"),
            ["bench/model"],
            Counters::new(1_000_000, 0),
        );
    }
    for i in 0..REQUESTS {
        let request =
            GenerationRequest::new(format!("req-{i}"), "bench/model", (0..=256).collect(), 16)
                .unwrap();
        let home = i % WORKERS;
        let candidates = vec![
            candidate(home, Tier::Gpu, 192, (i % 7) as f64),
            candidate((home + 1) % WORKERS, Tier::Ssd, 128, 0.0),
            candidate((home + 2) % WORKERS, Tier::None, 0, 1.0),
        ];
        sim.submit(request, candidates);
    }
    sim
}

#[divan::bench(args = [false, true])]
fn run_to_quiet(bencher: Bencher, trace: bool) {
    let template = prepared(trace);
    let mut probe = template.clone();
    let before = probe.events_delivered();
    probe.run_until_quiet(10_000_000).unwrap();
    let events = probe.events_delivered() - before;
    bencher
        .counter(ItemsCount::new(events))
        .with_inputs(|| template.clone())
        .bench_local_values(|mut sim| {
            black_box(sim.run_until_quiet(10_000_000).unwrap());
            sim
        });
}
