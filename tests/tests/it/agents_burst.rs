//! A burst between two heartbeats spreads over the workers: the router counts the work
//! it offered since each worker's last heartbeat instead of pricing every request of the
//! burst by the same stale, idle `queue_ms` (protocol/src/router_node/inflight.rs).

use std::collections::BTreeMap;

use futures_util::future::join_all;

use den_tests::agents::{SLOW_PREFILL, body, prompt, start_router, start_worker};

/// 100 distinct uncached tokens at 4 ms each: every request of the burst is ~400 ms of
/// prefill, so none completes (and no eager heartbeat follows) while the burst arrives.
const COSTS: &[&str] = SLOW_PREFILL;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_a_burst_between_heartbeats_spreads_over_the_workers() {
    // Heartbeats every 2 s: the burst is routed on the idle heartbeats of the start.
    let router = start_router(
        None,
        &["--heartbeat-interval", "2s", "--heartbeat-timeout", "10s"],
    );
    let _a = start_worker(&router, "w-a", false, COSTS);
    let _b = start_worker(&router, "w-b", false, COSTS);
    router.wait_workers(&["w-a", "w-b"]).await;

    let bodies: Vec<_> = (0..6)
        .map(|i| body(&format!("burst-{i}"), &prompt(100 + i, 100), 2))
        .collect();
    let results = join_all(bodies.into_iter().map(|b| router.generate(b))).await;
    let mut per_worker: BTreeMap<String, usize> = BTreeMap::new();
    for g in &results {
        assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
        *per_worker.entry(g.worker()).or_default() += 1;
    }
    // Each request adds ~400 ms to its worker's predicted queue, so the router alternates;
    // priced by the start's heartbeats alone, all six would go to the same worker.
    assert_eq!(
        per_worker.len(),
        2,
        "one worker took the whole burst: {per_worker:?}"
    );
    assert!(
        per_worker.values().all(|&n| n >= 2),
        "the burst was not spread: {per_worker:?}"
    );
}
