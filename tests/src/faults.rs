//! Shared parts of the fault matrix (tests/tests/it/fault_matrix*.rs): the two-worker
//! restore setup, waiting for an assignment, and the checks every row ends with.

use std::time::Duration;

use crate::agents::{Router, SLOW_PREFILL, Worker, body, start_router, start_worker, wait_for};

/// Declared engine costs of the matrix's workers (a cache hit is unmistakable).
pub const COSTS: &[&str] = SLOW_PREFILL;

/// Router + w-a + w-b with a shared `file://` object store under the router's directory;
/// w-a has served (and checkpointed) `tokens`, and its resident copy is evicted, so the
/// next request for the same prefix restores from a tier. Returns the router and the two
/// workers.
pub async fn restore_setup(router_args: &[&str], tokens: &[u32]) -> (Router, Worker, Worker) {
    let router = start_router(None, router_args);
    let objects = format!("file://{}/objects", router.dir.path().display());
    let mut args: Vec<&str> = COSTS.to_vec();
    args.extend(["--object-store", objects.as_str()]);
    let a = start_worker(&router, "w-a", true, &args);
    router.wait_workers(&["w-a"]).await;
    // Only w-a is up: it serves the first request and checkpoints it (RAM + objects).
    let first = router.generate(body("warm", tokens, 2)).await;
    assert_eq!(
        (first.kind(), first.worker().as_str()),
        ("completed", "w-a")
    );
    a.wait_idle().await;
    // w-b prefills 50× slower, so w-a's RAM restore wins by hundreds of ms, not by the
    // ~1 ms of object reads between two equal workers: w-a's *measured* costs (prefill,
    // upload), inflated on a loaded machine, are compared with w-b's declared ones, and
    // that margin was erased (w-b was chosen first and w-a never saw the request). After
    // the fault w-b restores from objects and prefills the few tokens after the chunks.
    // And its first token is declared 10× dearer than w-a's default: a full restore needs
    // no prefill, and w-a's *measured* first-token cost (4 ms on a loaded machine) against
    // w-b's declared 2 ms once handed w-b the first offer anyway (a full run, 2026-12-03).
    let b_args: Vec<&str> = vec![
        "--prefill-ms-per-token",
        "200",
        "--first-token-ms",
        "20",
        "--decode-ms-per-token",
        "1",
        "--object-store",
        objects.as_str(),
    ];
    let b = start_worker(&router, "w-b", true, &b_args);
    router.wait_workers(&["w-a", "w-b"]).await;
    evict_and_wait(&router, &a).await;
    (router, a, b)
}

/// Evicts `w`'s resident routes and waits until the router's view shows it.
pub async fn evict_and_wait(router: &Router, w: &Worker) {
    w.fault("/fault/evict-resident").await;
    wait_for(
        &format!("{}'s eviction to be advertised", w.name),
        Duration::from_secs(10),
        || async {
            let obs = router.observation(&w.name).await?;
            obs["gpu_prefixes"].as_array()?.is_empty().then_some(())
        },
    )
    .await;
}

/// Evicts `w`'s evictable resident routes and waits until the router sees fewer of its
/// prefixes than before (routes whose checkpoint failed stay resident: not evictable).
pub async fn evict_evictable_and_wait(router: &Router, w: &Worker) {
    let count = |obs: &serde_json::Value| obs["gpu_prefixes"].as_array().map_or(0, Vec::len);
    let before = count(&router.observation(&w.name).await.unwrap_or_default());
    w.fault("/fault/evict-resident").await;
    wait_for(
        &format!("{}'s eviction to be advertised", w.name),
        Duration::from_secs(10),
        || async { (count(&router.observation(&w.name).await?) < before).then_some(()) },
    )
    .await;
}

/// Waits until `w` holds one assignment; on timeout the failure shows the router's
/// decision record for `request` (which worker got it, and why).
pub async fn wait_accepted(router: &Router, w: &Worker, request: &str) {
    let t0 = std::time::Instant::now();
    while w.status().await["assignments"] != 1 {
        if t0.elapsed() > Duration::from_secs(10) {
            panic!(
                "{} did not accept {request} within 10 s; the router's record: {}",
                w.name,
                router.record(request).await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGKILLs whichever of `a` and `b` is named `serving`, waits for it to exit, and
/// returns the other.
pub fn kill_the_serving<'w>(serving: &str, a: &'w mut Worker, b: &'w mut Worker) -> &'w Worker {
    let (victim, other) = if serving == a.name { (a, b) } else { (b, a) };
    victim.proc.signal("KILL");
    victim.proc.wait_exit(Duration::from_secs(10));
    other
}

/// Every row's ending: each request has exactly one terminal outcome in the router's
/// record, and each surviving worker is idle with its pages fully accounted (none
/// reserved; free and resident add up to the pool).
pub async fn assert_clean(router: &Router, requests: &[&str], workers: &[&Worker]) {
    for id in requests {
        let record = router.record(id).await;
        let kind = record["outcome"]["kind"].as_str().unwrap_or_default();
        assert!(
            matches!(kind, "completed" | "failed" | "cancelled"),
            "{id} has no terminal outcome: {record}"
        );
        let attempts = record["attempts"].as_array().cloned().unwrap_or_default();
        let completed = attempts
            .iter()
            .filter(|a| a["outcome"]["kind"] == "completed")
            .count();
        assert!(completed <= 1, "{id} completed twice: {record}");
    }
    for w in workers {
        w.wait_idle().await;
        wait_for(
            &format!("{}'s pages to be accounted", w.name),
            Duration::from_secs(10),
            || async {
                let pool = w.status().await["pool"].clone();
                let n = |k: &str| pool[k].as_u64().unwrap_or(u64::MAX);
                (n("reserved") == 0 && n("free") + n("resident") == n("total_pages")).then_some(())
            },
        )
        .await;
    }
}

/// Every file under `dir`, recursively.
pub fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
