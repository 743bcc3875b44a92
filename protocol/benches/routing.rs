//! Routing decision cost: rank a request's candidates and handle its submission up to
//! the first offer effect, for 8, 64 and 512 workers × 16 alternatives each; and the
//! router node's whole handling of one request — submit, the worker's accept, its
//! result — as den-agent's router drives it, for 1 and 8 workers.
//!
//! `cargo bench -p den-protocol --bench routing`
// A benchmark may unwrap, expect and panic: a broken set-up should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // benches time and read files

use std::sync::Arc;

use den_protocol::candidate::{Candidate, Tier, TransferCapabilities, rank};
use den_protocol::ids::{Epoch, WorkerId};
use den_protocol::request::GenerationRequest;
use den_protocol::router::{Router, RouterEffect, RouterInput};
use den_protocol::time::Millis;
use divan::{Bencher, black_box};

/// The allocator den-agent runs with (`agent/src/lib.rs`), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    divan::main();
}

const ALTERNATIVES: usize = 16;

fn request() -> Arc<GenerationRequest> {
    Arc::new(
        GenerationRequest::new("bench-request", "bench/model", (0..=1024).collect(), 64).unwrap(),
    )
}

/// Per worker: recompute, a GPU prefix, and RAM/SSD/object prefixes at 256-token
/// boundaries, with a worker-specific queue so that the ranking has work to do.
fn candidates(workers: usize) -> Vec<Candidate> {
    let tiers = [Tier::Gpu, Tier::Ram, Tier::Ssd, Tier::Object];
    let mut out = Vec::with_capacity(workers * ALTERNATIVES);
    for w in 0..workers {
        for alt in 0..ALTERNATIVES {
            let (tier, cached) = if alt == 0 {
                (Tier::None, 0)
            } else {
                (
                    tiers[alt % tiers.len()],
                    64 * (1 + (alt as u32 * 7 + w as u32) % 16),
                )
            };
            out.push(Candidate {
                worker_id: WorkerId::from(format!("worker-{w:04}")),
                worker_epoch: Epoch(1),
                tier,
                cached_token_count: cached,
                cached_bytes: cached as u64 * 131_072,
                queue_ms: ((w * 37) % 50) as f64,
                prefix_load_ms: if tier == Tier::Gpu {
                    0.0
                } else {
                    cached as f64 * 0.05
                },
                gpu_restore_ms: if tier == Tier::Gpu {
                    0.0
                } else {
                    cached as f64 * 0.01
                },
                prefill_ms_per_token: 0.2,
                first_token_ms: 2.0,
                page_size: 16,
                free_pages: 4096,
                evictable_pages: 1024,
                max_context: 8192,
                online: true,
                model_loaded: true,
                exact: true,
                source_continuation_id: None,
                resident_token_count: 0,
                transfer: TransferCapabilities::default(),
                imposed_ms: 0.0,
            });
        }
    }
    out
}

/// Rank + submit handling → the first offer effect.
///
/// One decision per sample, its candidates cloned just before: the router builds them
/// (`candidates_for`) immediately before submitting, so they are in cache. With many
/// iterations per sample, divan would build every input first and each decision would
/// read its candidates cold from memory (~150 KB at 64 workers), which measured the
/// memory system rather than the decision.
#[divan::bench(args = [8, 64, 512], sample_size = 1, sample_count = 2000)]
fn submit_to_first_offer(bencher: Bencher, workers: usize) {
    let request = request();
    let all = candidates(workers);
    bencher
        .with_inputs(|| (Router::default(), all.clone()))
        .bench_local_values(|(mut router, candidates)| {
            let effects = router.handle(
                Millis(0),
                RouterInput::Submit {
                    request: Arc::clone(&request),
                    candidates,
                    deadline: None,
                },
            );
            let first = effects
                .iter()
                .position(|e| matches!(e, RouterEffect::Send(_)));
            black_box(first);
            // Returned so that freeing the router is not timed.
            (router, effects)
        });
}

/// Ranking alone, for comparison.
#[divan::bench(args = [8, 64, 512])]
fn rank_only(bencher: Bencher, workers: usize) {
    let request = request();
    let all = candidates(workers);
    bencher
        .with_inputs(|| all.clone())
        .bench_local_values(|candidates| rank(&request, candidates));
}

mod node {
    use std::sync::Arc;

    use den_protocol::discovery::ConnectionId;
    use den_protocol::ids::{AssignmentId, Epoch};
    use den_protocol::observation::Observation;
    use den_protocol::request::GenerationRequest;
    use den_protocol::router::RouterConfig;
    use den_protocol::router_node::{
        DEFAULT_MAX_WAITING, NodeConfig, NodeEffect, NodeInput, Pin, RouterNode,
    };
    use den_protocol::time::Millis;
    use den_protocol::wire::{
        Heartbeat, OfferResult, ResultMessage, RouterMessage, ToRouter, WorkerResult,
    };
    use divan::{Bencher, black_box};

    const MODEL: &str = "bench/model";

    /// A node with `workers` idle workers, each on its own connection.
    fn fleet(workers: usize) -> RouterNode {
        let mut node = RouterNode::new(NodeConfig {
            router: RouterConfig::default(),
            heartbeat_timeout_ms: 60_000,
            chunk_size: 16,
            max_waiting: DEFAULT_MAX_WAITING,
        });
        for w in 0..workers {
            let name = format!("worker-{w:04}");
            let conn = ConnectionId(w as u64 + 1);
            node.handle(
                Millis(0),
                NodeInput::Connected {
                    conn,
                    worker: name.as_str().into(),
                    node: name.as_str().into(),
                },
            );
            let mut o = Observation::new(name.as_str(), name.as_str());
            o.epoch = Epoch(1);
            o.sequence = 1;
            o.models.insert(MODEL.into());
            o.free_pages = 4_096;
            o.page_size = 16;
            o.prefill_ms_per_token = 0.05;
            o.first_token_ms = 2.0;
            node.handle(
                Millis(0),
                NodeInput::Frame {
                    conn,
                    frame: ToRouter::Heartbeat(Box::new(Heartbeat { observation: o })),
                },
            );
        }
        node
    }

    /// Submit, accept, complete: the three inputs one request brings the router node
    /// at zero engine cost (what `den-agent-bench --latency` sends through it).
    #[divan::bench(args = [1, 8])]
    fn request_lifecycle(bencher: Bencher, workers: usize) {
        let mut node = fleet(workers);
        let mut i = 0u64;
        let mut now = 1u64;
        bencher.bench_local(|| {
            i += 1;
            now += 1;
            let id = format!("r{i}");
            let request =
                Arc::new(GenerationRequest::new(id.as_str(), MODEL, (0..64).collect(), 1).unwrap());
            let effects = node.handle(
                Millis(now),
                NodeInput::Submit {
                    request,
                    deadline: None,
                    pin: Pin::Any,
                },
            );
            let (conn, attempt) = effects
                .iter()
                .find_map(|e| match e {
                    NodeEffect::Send { conn, frame } => match &frame.message {
                        RouterMessage::Offer(o) => Some((*conn, o.assignment.attempt)),
                        _ => None,
                    },
                    _ => None,
                })
                .expect("an offer");
            let assignment = AssignmentId::new(id.as_str(), attempt);
            black_box(node.handle(
                Millis(now),
                NodeInput::Frame {
                    conn,
                    frame: ToRouter::OfferResult(OfferResult {
                        assignment: assignment.clone(),
                        worker_epoch: Epoch(1),
                        accepted: true,
                        reason: None,
                    }),
                },
            ));
            black_box(node.handle(
                Millis(now),
                NodeInput::Frame {
                    conn,
                    frame: ToRouter::Result(ResultMessage {
                        assignment,
                        result: Box::new(WorkerResult::completed(vec![7], 0)),
                    }),
                },
            ));
        });
    }
}
