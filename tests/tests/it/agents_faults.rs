//! Faults over real sockets and processes: a worker killed or paused in the middle of a
//! restore, a worker killed after the first streamed token, a directed partition from the
//! router to one worker, and a corrupted chunk.
//!
//! Both workers share a `file://` object store, so a prefix one of them checkpointed can
//! be restored by the other.

use std::time::Duration;

use den_tests::agents::{
    Router, SLOW_PREFILL, Worker, body, metric, metric_sum, prompt, start_router, start_worker,
    wait_for,
};

const COSTS: &[&str] = SLOW_PREFILL;

/// Router + w-a + w-b with a shared object store; w-a has served (and checkpointed)
/// `tokens`, and its resident copy is evicted, so the next request for the same prefix
/// restores from a tier. Returns the router and the two workers.
async fn restore_setup(router_args: &[&str], tokens: &[u32]) -> (Router, Worker, Worker) {
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
    let mut b_args: Vec<&str> = vec!["--prefill-ms-per-token", "200"];
    b_args.extend(args.iter().copied().skip(2));
    let b = start_worker(&router, "w-b", true, &b_args);
    router.wait_workers(&["w-a", "w-b"]).await;
    a.fault("/fault/evict-resident").await;
    wait_for(
        "w-a's eviction to be advertised",
        Duration::from_secs(10),
        || async {
            let obs = router.observation("w-a").await?;
            obs["gpu_prefixes"].as_array()?.is_empty().then_some(())
        },
    )
    .await;
    (router, a, b)
}

/// Waits until `w` holds one assignment; on timeout the failure shows the router's
/// decision record for `request` (which worker got it, and why).
async fn wait_accepted(router: &Router, w: &Worker, request: &str) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_worker_killed_mid_restore_request_completes_on_the_other_worker() {
    let tokens = prompt(3, 100);
    let (router, mut a, b) = restore_setup(&[], &tokens).await;
    a.fault("/fault/restore-delay?ms=2000").await;

    let mut s = router.stream(body("k1", &tokens, 4)).await;
    wait_accepted(&router, &a, "k1").await;
    a.proc.signal("KILL");
    a.proc.wait_exit(Duration::from_secs(10));

    while s.next_line().await.is_some() {}
    let g = s.finish();
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(g.worker(), "w-b");
    assert_eq!(g.tier(), "object", "w-b restores what w-a checkpointed");
    assert_eq!(g.cached_tokens(), 99);
    let attempts = g.terminal["attempts"].as_array().unwrap();
    assert_eq!(attempts.first().unwrap()["worker"], "w-a");
    assert_eq!(attempts.first().unwrap()["outcome"], "became unavailable");
    let status = b.status().await;
    assert!(
        status["restore_verified"].as_f64().unwrap() >= 7.0,
        "{status}"
    );
    assert_eq!(status["restore_mismatch"], 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_worker_paused_mid_restore_its_late_result_is_ignored() {
    let tokens = prompt(4, 100);
    let (router, a, b) = restore_setup(
        &["--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s"],
        &tokens,
    )
    .await;
    // Seven chunks at 300 ms each: the restore takes ~2 s, long enough to pause it.
    a.fault("/fault/restore-delay?ms=300").await;

    let mut s = router.stream(body("p1", &tokens, 4)).await;
    wait_accepted(&router, &a, "p1").await;
    a.proc.signal("STOP");
    // Heartbeats stop; after the timeout the router detaches w-a and moves the request.
    while s.next_line().await.is_some() {}
    let g = s.finish();
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(g.worker(), "w-b");
    let before = metric_sum(&router.metrics().await, "den_router_fenced_total");

    // w-a wakes up, finishes its stale attempt and reports it: the router ignores it.
    a.proc.signal("CONT");
    wait_for(
        "w-a's late result to be fenced",
        Duration::from_secs(20),
        || async {
            let m = router.metrics().await;
            (metric(&m, "den_router_fenced_total", &[("type", "result")]) >= 1.0).then_some(())
        },
    )
    .await;
    assert!(metric_sum(&router.metrics().await, "den_router_fenced_total") > before);
    let record = router.record("p1").await;
    assert_eq!(record["outcome"]["kind"], "completed");
    let attempts = record["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{record}");
    assert_eq!(attempts[0]["outcome"]["kind"], "worker-unavailable");
    assert_eq!(attempts[1]["worker"], "w-b");
    assert_eq!(attempts[1]["outcome"]["kind"], "completed");
    // The client saw one stream: four deltas and one terminal line.
    assert_eq!(g.deltas.len(), 4);
    // w-a is back and routable again (its newer heartbeat re-bound the connection).
    wait_for("w-a to re-register", Duration::from_secs(10), || async {
        router.observation("w-a").await.map(|_| ())
    })
    .await;
    let _ = b;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_worker_killed_after_first_delta_gives_one_clean_error_and_no_retry() {
    let router = start_router(None, &[]);
    let slow = [
        "--decode-ms-per-token",
        "200",
        "--prefill-ms-per-token",
        "0.1",
    ];
    let mut a = start_worker(&router, "w-a", false, &slow);
    let mut b = start_worker(&router, "w-b", false, &slow);
    router.wait_workers(&["w-a", "w-b"]).await;

    let mut s = router.stream(body("d1", &prompt(5, 30), 20)).await;
    let first = s.next_line().await.unwrap();
    assert_eq!(first["type"], "delta");
    let record = router.record("d1").await;
    let serving = record["attempts"][0]["worker"].as_str().unwrap().to_owned();
    let (victim, other) = if serving == "w-a" {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    victim.proc.signal("KILL");
    victim.proc.wait_exit(Duration::from_secs(10));

    while s.next_line().await.is_some() {}
    let lines = s.lines.clone();
    let g = s.finish();
    assert_eq!(g.kind(), "error", "{:?}", g.terminal);
    assert_eq!(
        g.terminal["error"]["kind"],
        "worker-unavailable-after-stream"
    );
    assert!(g.terminal["message"].as_str().unwrap().contains("resubmit"));
    let terminals = lines.iter().filter(|l| l["type"] != "delta").count();
    assert_eq!(terminals, 1, "exactly one terminal line: {lines:?}");
    let record = router.record("d1").await;
    assert_eq!(
        record["attempts"].as_array().unwrap().len(),
        1,
        "no retry: {record}"
    );
    let om = other.metrics_text().await;
    assert_eq!(
        metric_sum(&om, "den_offers_total"),
        0.0,
        "the other worker got no offer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_directed_partition_times_out_the_offer_cancels_and_falls_back() {
    let router = start_router(None, &["--offer-timeout", "1s"]);
    let a = start_worker(&router, "w-a", true, COSTS);
    let b = start_worker(&router, "w-b", true, COSTS);
    router.wait_workers(&["w-a", "w-b"]).await;
    // Frames from the router to w-a are dropped; w-a's heartbeats still arrive, so the
    // router keeps offering to it (identical idle workers: w-a ranks first by name).
    a.fault("/fault/drop-inbound?on=true").await;

    let g = router.generate(body("n1", &prompt(6, 40), 4)).await;
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(g.worker(), "w-b");
    let record = router.record("n1").await;
    let attempts = record["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["worker"], "w-a", "{record}");
    assert_eq!(attempts[0]["outcome"]["kind"], "timed-out");
    assert_eq!(attempts[1]["worker"], "w-b");
    let rm = router.metrics().await;
    assert!(metric(&rm, "den_router_offer_timeouts_total", &[]) >= 1.0);
    assert!(
        metric(&rm, "den_router_frames_sent_total", &[("type", "cancel")]) >= 1.0,
        "the timed-out offer was cancelled"
    );
    let am = a.metrics_text().await;
    assert!(
        metric(&am, "den_fault_dropped_frames_total", &[]) >= 2.0,
        "offer and cancel dropped"
    );
    assert_eq!(metric_sum(&am, "den_offers_total"), 0.0);
    // w-a never stopped heartbeating: still registered; healed, it serves again.
    assert!(router.observation("w-a").await.is_some());
    a.fault("/fault/drop-inbound?on=false").await;
    b.proc.signal("STOP");
    let g = router
        .generate(serde_json::json!({"id": "n2", "tokens": prompt(7, 20), "max_new_tokens": 2, "deadline_ms": 20000}))
        .await;
    b.proc.signal("CONT");
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_corrupt_chunk_is_recomputed_never_wrong_kv() {
    let router = start_router(None, &[]);
    let args: Vec<&str> = [COSTS, &["--ram-bytes", "0", "--ssd-bytes", "64MiB"]].concat();
    let a = start_worker(&router, "w-a", true, &args);
    router.wait_workers(&["w-a"]).await;
    let tokens = prompt(8, 100);
    let first = router.generate(body("x1", &tokens, 4)).await;
    assert_eq!(first.kind(), "completed");
    a.wait_idle().await;

    // Flip one byte in the payload of every stored chunk file.
    let mut damaged = 0;
    for entry in walk(&a.data_dir.join("ssd").join("chunks")) {
        let mut bytes = std::fs::read(&entry).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xFF;
        std::fs::write(&entry, bytes).unwrap();
        damaged += 1;
    }
    assert!(damaged >= 7, "{damaged} chunk files");
    a.fault("/fault/evict-resident").await;
    wait_for(
        "the eviction to be advertised",
        Duration::from_secs(10),
        || async {
            let obs = router.observation("w-a").await?;
            obs["gpu_prefixes"].as_array()?.is_empty().then_some(())
        },
    )
    .await;

    let second = router.generate(body("x2", &tokens, 4)).await;
    assert_eq!(second.kind(), "completed", "{:?}", second.terminal);
    assert_eq!(second.tier(), "ssd", "the router believed the replica");
    assert_eq!(second.cached_tokens(), 0, "nothing usable was restored");
    assert_eq!(
        second.tokens(),
        first.tokens(),
        "recomputed, identical output"
    );
    let m = a.metrics_text().await;
    assert!(
        metric(
            &m,
            "den_restore_fetch_failures_total",
            &[("tier", "ssd"), ("kind", "corrupt")]
        ) >= 1.0
    );
    assert_eq!(metric(&m, "den_restore_mismatch_total", &[]), 0.0);
    assert_eq!(metric(&m, "den_recomputed_tokens_total", &[]), 198.0);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
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
