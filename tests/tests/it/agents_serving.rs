//! Router + workers over real sockets: a request is served, the same prefix sent again
//! is served from the cache (resident GPU prefix, then a verified restore from the RAM
//! tier), and a client that disconnects frees exactly the pages its request reserved.

use std::time::Duration;

use den_tests::agents::{
    GenerationStream, Router, SLOW_PREFILL, Worker, body, metric, prompt, start_router,
    start_worker, wait_for,
};

/// Prefill is declared expensive (4 ms per uncached token) so a cache hit is
/// unmistakable: a 100-token prompt costs ~400 ms to prefill, a hit a few ms.
const COSTS: &[&str] = SLOW_PREFILL;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_request_served_then_prefix_reused_from_gpu_and_ram() {
    let router = start_router(Some("s3cret"), &[]);
    let a = start_worker(&router, "w-a", true, COSTS);
    let b = start_worker(&router, "w-b", true, COSTS);
    router.wait_workers(&["w-a", "w-b"]).await;

    let tokens = prompt(1, 100);
    let first = router.generate(body("r1", &tokens, 4)).await;
    assert_eq!(first.kind(), "completed", "{:?}", first.terminal);
    assert_eq!(first.deltas.len(), 4);
    assert_eq!(first.cached_tokens(), 0);
    let served = first.worker();
    let worker = if served == "w-a" { &a } else { &b };

    // The completed route is advertised as a resident prefix by the next heartbeat.
    wait_for(
        "the resident prefix to be advertised",
        Duration::from_secs(10),
        || async {
            let obs = router.observation(&served).await?;
            (!obs["gpu_prefixes"].as_array()?.is_empty()).then_some(())
        },
    )
    .await;
    let second = router.generate(body("r2", &tokens, 4)).await;
    assert_eq!(second.kind(), "completed", "{:?}", second.terminal);
    assert_eq!(second.tier(), "gpu");
    assert_eq!(second.worker(), served);
    assert_eq!(
        second.cached_tokens(),
        99,
        "the whole processed prompt was resident"
    );
    assert!(
        second.ttft.unwrap() < first.ttft.unwrap(),
        "cache hit TTFT {:?} should be lower than the miss {:?}",
        second.ttft,
        first.ttft
    );
    assert_eq!(
        second.tokens(),
        first.tokens(),
        "same prompt, same greedy output"
    );

    // Evict the resident routes: the next identical prompt restores from the RAM tier,
    // and every restored chunk is read back and checked byte-exact.
    evict_resident(&router, worker, &served).await;
    let third = router.generate(body("r3", &tokens, 4)).await;
    assert_eq!(third.kind(), "completed", "{:?}", third.terminal);
    assert_eq!(third.tier(), "ram");
    assert_eq!(third.cached_tokens(), 99);
    assert!(third.ttft.unwrap() < first.ttft.unwrap());
    assert_eq!(third.tokens(), first.tokens());
    let status = worker.status().await;
    assert!(
        status["restore_verified"].as_f64().unwrap() >= 7.0,
        "{status}"
    );
    assert_eq!(status["restore_mismatch"], 0.0);
    let m = worker.metrics_text().await;
    assert_eq!(
        metric(&m, "den_restored_tokens_total", &[("tier", "ram")]),
        99.0
    );
    assert_eq!(
        metric(&m, "den_evictions_total", &[("reason", "explicit")]),
        2.0
    );

    // The router saw the hits.
    let rm = router.metrics().await;
    assert_eq!(
        metric(&rm, "den_requests_total", &[("outcome", "completed")]),
        3.0
    );
    assert_eq!(metric(&rm, "den_cached_tokens_total", &[]), 198.0);
    assert_eq!(
        metric(&rm, "den_completed_by_tier_total", &[("tier", "gpu")]),
        1.0
    );
    assert_eq!(
        metric(&rm, "den_completed_by_tier_total", &[("tier", "ram")]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_client_disconnect_cancels_and_frees_exactly_the_reserved_pages() {
    let router = start_router(None, &[]);
    let w = start_worker(
        &router,
        "w-a",
        false,
        &[
            "--decode-ms-per-token",
            "100",
            "--prefill-ms-per-token",
            "0.1",
        ],
    );
    router.wait_workers(&["w-a"]).await;
    let before = w.status().await;
    assert_eq!(before["pool"]["reserved"], 0);
    assert_eq!(before["routes"], 0);
    let free_before = before["pool"]["free"].as_u64().unwrap();

    // 40 prompt tokens + 200 new ones: 15 pages of 16 tokens are reserved at acceptance.
    let mut s = router.stream(body("c1", &prompt(2, 41), 200)).await;
    let first = s.next_line().await.unwrap();
    assert_eq!(first["type"], "delta");
    let during = w.status().await;
    let held = free_before - during["pool"]["free"].as_u64().unwrap();
    assert_eq!(held, 15, "{during}");
    assert_eq!(during["assignments"], 1);

    drop(s); // the client goes away mid-stream

    wait_for(
        "the worker to release the assignment",
        Duration::from_secs(10),
        || async {
            let s = w.status().await;
            (s["assignments"] == 0).then_some(())
        },
    )
    .await;
    let after = w.status().await;
    assert_eq!(
        after["pool"]["free"].as_u64().unwrap(),
        free_before,
        "{after}"
    );
    assert_eq!(after["pool"]["reserved"], 0);
    assert_eq!(after["pool"]["resident"], 0);
    assert_eq!(after["routes"], 0, "the partial route was dropped");
    let record = router.record("c1").await;
    assert_eq!(record["outcome"]["kind"], "cancelled", "{record}");
    let m = w.metrics_text().await;
    assert_eq!(
        metric(&m, "den_assignments_total", &[("outcome", "cancelled")]),
        1.0
    );
    let rm = router.metrics().await;
    assert_eq!(
        metric(&rm, "den_requests_total", &[("outcome", "cancelled")]),
        1.0
    );

    // An explicit cancel (POST /v1/requests/{id}/cancel) ends the stream with one
    // `cancelled` line and frees the pages the same way.
    let mut s = router.stream(body("c2", &prompt(3, 41), 200)).await;
    assert_eq!(s.next_line().await.unwrap()["type"], "delta");
    let resp = router.post("/v1/requests/c2/cancel").await;
    assert_eq!(resp.status(), 202);
    while s.next_line().await.is_some() {}
    let g = s.finish();
    assert_eq!(g.kind(), "cancelled", "{:?}", g.terminal);
    wait_for(
        "the worker to release c2",
        Duration::from_secs(10),
        || async {
            let s = w.status().await;
            (s["assignments"] == 0).then_some(())
        },
    )
    .await;
    let after = w.status().await;
    assert_eq!(
        after["pool"]["free"].as_u64().unwrap(),
        free_before,
        "{after}"
    );
    assert_eq!(router.post("/v1/requests/nope/cancel").await.status(), 404);
}

/// A worker without a storage tier releases a completed route at once, so the router must
/// not guess its prefix resident there: the same prompt sent again right away (before a
/// heartbeat) is offered once, as a miss, never declined as a stale GPU hit. (Those
/// guesses declined 80 % of `den-agent-bench`'s offers and held it to ~1,000 requests/s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_no_speculative_prefix_on_a_worker_without_tiers() {
    let router = start_router(
        None,
        &["--heartbeat-interval", "5s", "--heartbeat-timeout", "15s"],
    );
    let _w = start_worker(&router, "w-bare", false, &["--ram-bytes", "0"]);
    router.wait_workers(&["w-bare"]).await;
    let tokens = prompt(7, 64);
    for i in 0..5 {
        let g = router
            .generate(body(&format!("bare-{i}"), &tokens, 2))
            .await;
        assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
        assert_eq!(g.tier(), "none", "{:?}", g.terminal);
        let attempts = g.terminal["attempts"].as_array().map_or(0, Vec::len);
        assert_eq!(attempts, 1, "one offer, no decline: {:?}", g.terminal);
    }
    let m = router.metrics().await;
    assert_eq!(
        metric(
            &m,
            "den_router_attempts_ended_total",
            &[
                ("outcome", "declined"),
                ("reason", "resident-prefix-unavailable")
            ]
        ),
        0.0,
        "{m}"
    );
}

/// Spec §7 K-3 on den's synthetic engine: concurrent requests on one worker all complete
/// with every delta and the engine's own tokens, and their decode rows share steps (the
/// synthetic engine runs on the same batching scheduler as a real model, and publishes
/// its declared costs as the plan the router replays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_synthetic_engine_batches_concurrent_decodes() {
    let router = start_router(None, &[]);
    let costs = [
        "--prefill-ms-per-token",
        "0.1",
        "--first-token-ms",
        "4",
        "--decode-ms-per-token",
        "20",
    ];
    let w = start_worker(&router, "w-s", false, &costs);
    router.wait_workers(&["w-s"]).await;
    let alone = router.generate(body("alone", &prompt(7, 40), 12)).await;
    assert_eq!(alone.kind(), "completed", "{:?}", alone.terminal);
    let before = w.metrics_text().await;
    let together = futures_util::future::join_all((0..8).map(|i| {
        let router = &router;
        async move {
            router
                .generate(body(&format!("together-{i}"), &prompt(100 + i, 40), 12))
                .await
        }
    }))
    .await;
    for g in &together {
        assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
        assert_eq!(g.deltas.len(), 12);
    }
    // The same prompt alone and in a batch: the same tokens.
    let again = router.generate(body("again", &prompt(7, 40), 12)).await;
    assert_eq!(again.tokens(), alone.tokens());
    let after = w.metrics_text().await;
    let delta = |name: &str, labels: &[(&str, &str)]| {
        metric(&after, name, labels) - metric(&before, name, labels)
    };
    let rows = delta("den_model_step_rows_total", &[("kind", "decode")]);
    let steps = delta("den_model_decode_steps_total", &[]);
    assert!(rows >= 8.0 * 12.0, "{rows} decode rows");
    assert!(
        rows >= 2.0 * steps,
        "decodes shared steps: {rows} decode rows in {steps} steps; TTFTs {:?}",
        together.iter().map(|g| g.ttft).collect::<Vec<_>>()
    );
    let observed = router.observation("w-s").await.expect("an observation");
    let engine = &observed["engine"];
    assert_eq!(engine["costs"]["kind"], "synthetic", "{engine}");
    assert_eq!(engine["costs"]["decode_us_per_step"], 20_000.0, "{engine}");
    assert_eq!(engine["first_token_step"], true, "{engine}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_resident_head_forked_and_only_the_tail_restored() {
    // One worker, 16-token chunks. A 100-token prompt is served and checkpointed into
    // RAM, then evicted from the pool. Its first 33 tokens come back as a short request
    // (2 chunks restored from RAM; its route stays resident). The full prompt again: the
    // router offers the resident head (32 tokens) forked plus the 5 chunks after it from
    // RAM (the last one partial), cheaper than restoring all 7 — the worker restores 67
    // tokens, not 99, and answers as the first time.
    let router = start_router(Some("s3cret"), &[]);
    let worker = start_worker(&router, "w-a", true, COSTS);
    router.wait_workers(&["w-a"]).await;
    let tokens = prompt(1, 100);
    let first = router.generate(body("r1", &tokens, 4)).await;
    assert_eq!(first.kind(), "completed", "{:?}", first.terminal);
    evict_resident(&router, &worker, "w-a").await;
    let head = router.generate(body("r-head", &tokens[..33], 4)).await;
    assert_eq!(head.kind(), "completed", "{:?}", head.terminal);
    assert_eq!((head.tier(), head.cached_tokens()), ("ram".to_owned(), 32));
    worker.wait_idle().await;
    wait_for(
        "the head to be advertised",
        Duration::from_secs(10),
        || async {
            let obs = router.observation("w-a").await?;
            let listed = obs["gpu_prefixes"].as_array()?;
            listed
                .iter()
                .any(|p| p["token_count"].as_u64() == Some(32))
                .then_some(())
        },
    )
    .await;
    let m = worker.metrics_text().await;
    let before = metric(&m, "den_restored_tokens_total", &[("tier", "ram")]);
    assert_eq!(before, 32.0);

    let again = router.generate(body("r2", &tokens, 4)).await;
    assert_eq!(again.kind(), "completed", "{:?}", again.terminal);
    assert_eq!(again.tier(), "ram");
    assert_eq!(again.cached_tokens(), 99, "the head and the restored tail");
    assert_eq!(again.tokens(), first.tokens(), "same prompt, same output");
    let m = worker.metrics_text().await;
    assert_eq!(
        metric(&m, "den_restored_tokens_total", &[("tier", "ram")]) - before,
        67.0,
        "only the tail after the resident head is restored"
    );
    let status = worker.status().await;
    assert_eq!(status["restore_mismatch"], 0.0, "{status}");
    // The decision record names the head the served attempt forked.
    let record = router.record("r2").await;
    let attempts = record["attempts"].as_array().cloned().unwrap_or_default();
    assert!(
        attempts
            .iter()
            .any(|a| a["tier"] == "ram" && a["resident_tokens"] == 32),
        "{record}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_a_restore_fetches_its_chunks_together_while_decodes_go_on() {
    // One worker, 16-token chunks, a RAM tier. A 100-token prompt is served and
    // checkpointed (99 processed tokens: 6 full chunks and a partial one), then evicted from the pool, and every chunk fetch of a
    // restore is made 300 ms slower (a remote store's latency). A decode of 400 tokens at
    // 5 ms each streams; while it runs the prompt comes again and is restored from RAM.
    // The restore's fetches are in flight together (off the device thread, a window at a
    // time), and the decode keeps streaming while the restore waits for its bytes: before,
    // the device thread read each chunk itself and no step ran until the restore was done.
    // Heartbeats every 100 ms: the restore's bytes still to fetch show in them as the RAM
    // link's backlog, which the router prices a new RAM load behind.
    let costs = [
        "--prefill-ms-per-token",
        "4",
        "--first-token-ms",
        "2",
        "--decode-ms-per-token",
        "5",
    ];
    let router = start_router(
        Some("s3cret"),
        &["--heartbeat-interval", "100ms", "--heartbeat-timeout", "2s"],
    );
    let worker = start_worker(&router, "w-a", true, &costs);
    router.wait_workers(&["w-a"]).await;
    let tokens = prompt(1, 100);
    let first = router.generate(body("r1", &tokens, 4)).await;
    assert_eq!(first.kind(), "completed", "{:?}", first.terminal);
    evict_resident(&router, &worker, "w-a").await;
    worker.fault("/fault/fetch-delay?ms=300").await;

    let mut decode = router.stream(body("d", &prompt(7, 8), 400)).await;
    loop {
        let line = decode.next_line().await.expect("the decode's stream");
        if line["type"] == "delta" {
            break;
        }
    }
    let sent = std::time::Instant::now();
    let restore = async {
        let g = router.generate(body("r2", &tokens, 4)).await;
        (g, sent.elapsed())
    };
    // Each of the decode's deltas with when it arrived, until its stream ends.
    let deltas = async {
        let mut at = Vec::new();
        while let Some(line) = decode.next_line().await {
            if line["type"] == "delta" {
                at.push(sent.elapsed());
            }
        }
        at
    };
    // The largest RAM link backlog the router hears of while the restore runs.
    let backlog = async {
        let mut most = 0f64;
        while sent.elapsed() < Duration::from_secs(3) && most == 0.0 {
            if let Some(obs) = router.observation("w-a").await {
                most = most.max(obs["link_backlog_ms"]["ram"].as_f64().unwrap_or(0.0));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        most
    };
    let ((again, done), decoded, backlog) = tokio::join!(restore, deltas, backlog);
    assert!(
        backlog > 0.0,
        "no heartbeat during the restore reported the RAM link's backlog"
    );
    assert_eq!(again.kind(), "completed", "{:?}", again.terminal);
    assert_eq!(again.tier(), "ram");
    assert_eq!(again.cached_tokens(), 99, "seven chunks restored");
    assert_eq!(again.tokens(), first.tokens(), "same prompt, same output");
    let first_token = again.ttft.expect("the restored request's first token");
    assert!(first_token <= done);
    let during = decoded.iter().filter(|t| **t < first_token).count();
    assert!(
        during >= 10,
        "only {during} decode tokens arrived while the restore fetched ({first_token:?}); the restore held the device"
    );
    assert_eq!(decoded.len(), 399, "the decode's other tokens");
    let m = worker.metrics_text().await;
    assert_eq!(
        metric(&m, "den_restored_tokens_total", &[("tier", "ram")]),
        99.0
    );
    assert_eq!(
        metric(&m, "den_restore_fetches_in_flight_peak", &[]),
        7.0,
        "the seven fetches were in flight together"
    );
    assert_eq!(metric(&m, "den_restore_fetches_in_flight", &[]), 0.0);
    wait_for(
        "the RAM link's backlog to clear",
        Duration::from_secs(5),
        || async {
            let obs = router.observation("w-a").await?;
            obs.get("link_backlog_ms").is_none().then_some(())
        },
    )
    .await;
    // What the restore's arrivals showed of the link: every fetch waited 300 ms before
    // its bytes, so the heartbeat reports that latency for the RAM tier, which the router
    // charges once per window of a restore instead of folding it into every chunk's rate.
    let fixed = wait_for(
        "the RAM tier's measured latency in a heartbeat",
        Duration::from_secs(5),
        || async {
            let obs = router.observation("w-a").await?;
            obs["tier_fixed_ms"]["ram"].as_f64()
        },
    )
    .await;
    assert!((250.0..2000.0).contains(&fixed), "RAM latency {fixed} ms");
}

/// Once `worker` is idle, evicts its resident routes and waits until the router no longer
/// lists any of its GPU prefixes.
async fn evict_resident(router: &Router, worker: &Worker, id: &str) {
    worker.wait_idle().await;
    let evicted = worker.fault("/fault/evict-resident").await;
    assert!(evicted["pages_freed"].as_u64().unwrap() > 0, "{evicted}");
    wait_for(
        "the eviction to be advertised",
        Duration::from_secs(10),
        || async {
            let obs = router.observation(id).await?;
            obs["gpu_prefixes"].as_array()?.is_empty().then_some(())
        },
    )
    .await;
}

/// One worker of 256 pages × 16 tokens with slow (20 ms) decode steps; "hog", a
/// `hog_prompt`-token prompt generating `hog_new` tokens, holds most of its pages, and
/// "held" (600 tokens, 38 pages) is sent once a heartbeat shows fewer than that free.
/// Returns both streams (the router answers "held" at once and streams it when it is
/// served) and held's record once the router holds it waiting.
async fn hog_then_held(
    router: &Router,
    hog_prompt: usize,
    hog_new: u32,
) -> (GenerationStream, GenerationStream, serde_json::Value) {
    let mut hog = router
        .stream(body("hog", &prompt(5, hog_prompt), hog_new))
        .await;
    assert_eq!(hog.next_line().await.unwrap()["type"], "delta");
    wait_for(
        "the hog's pages to show",
        Duration::from_secs(10),
        || async {
            let obs = router.observation("w-a").await?;
            (obs["free_pages"].as_u64()? < 38).then_some(())
        },
    )
    .await;
    let held = router.stream(body("held", &prompt(6, 600), 8)).await;
    let record = wait_for("held to wait", Duration::from_secs(10), || async {
        let r = router.record("held").await;
        (r["request"] == "held").then_some(r)
    })
    .await;
    (hog, held, record)
}

/// How `stream` ends (its terminal line), within `within`.
async fn terminal(mut stream: GenerationStream, within: Duration) -> serde_json::Value {
    tokio::time::timeout(within, async {
        while stream.next_line().await.is_some() {}
        stream.finish().terminal
    })
    .await
    .expect("the stream ends")
}

/// A request no worker has the KV pages for right now waits in the router, and while it
/// waits it is a request like any other: its decision record is there (no attempt yet),
/// the waiting metrics count it, and a cancel ends it at once (it was a 404 before the
/// router kept records of waiting requests). The hog decodes for ~10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_a_request_waiting_for_pages_has_a_record_and_can_be_cancelled() {
    let router = start_router(None, &[]);
    let _w = start_worker(&router, "w-a", false, &["--decode-ms-per-token", "20"]);
    router.wait_workers(&["w-a"]).await;
    let (mut hog, held, record) = hog_then_held(&router, 3000, 500).await;

    assert_eq!(
        record["attempts"].as_array().map(Vec::len),
        Some(0),
        "{record}"
    );
    assert!(record.get("outcome").is_none(), "still waiting: {record}");
    let candidate = &record["candidates"][0];
    assert_eq!(
        candidate["estimate"]["infeasible"], "insufficient-pages",
        "{record}"
    );
    wait_for("the waiting gauge", Duration::from_secs(10), || async {
        let m = router.metrics().await;
        (metric(&m, "den_router_requests", &[("phase", "waiting")]) == 1.0).then_some(())
    })
    .await;
    assert_eq!(
        metric(&router.metrics().await, "den_router_waited_total", &[]),
        1.0
    );

    let resp = router.post("/v1/requests/held/cancel").await;
    assert_eq!(resp.status(), 202);
    let last = terminal(held, Duration::from_secs(10)).await;
    assert_eq!(last["type"], "cancelled", "{last}");
    let record = router.record("held").await;
    assert_eq!(record["outcome"]["kind"], "cancelled", "{record}");
    assert_eq!(
        record["attempts"].as_array().map(Vec::len),
        Some(0),
        "{record}"
    );
    assert!(record["waited_ms"].as_u64().unwrap_or(0) > 0, "{record}");

    assert_eq!(router.post("/v1/requests/hog/cancel").await.status(), 202);
    while hog.next_line().await.is_some() {}
    assert_eq!(hog.finish().kind(), "cancelled");
}

/// A router that drains (SIGTERM) counts a request waiting for KV pages as accepted work:
/// it keeps running until the pages free and the request is served, then exits. (It used
/// to stop once nothing was offered or running, and the waiting request's stream ended
/// with "the router ended the stream".) The hog decodes for ~2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_a_draining_router_serves_a_request_waiting_for_pages() {
    let mut router = start_router(None, &["--drain-timeout", "30s"]);
    let _w = start_worker(&router, "w-a", false, &["--decode-ms-per-token", "20"]);
    router.wait_workers(&["w-a"]).await;
    let (mut hog, held, record) = hog_then_held(&router, 3500, 100).await;
    assert_eq!(
        record["attempts"].as_array().map(Vec::len),
        Some(0),
        "{record}"
    );

    router.proc.signal("TERM");
    while hog.next_line().await.is_some() {}
    assert_eq!(hog.finish().kind(), "completed");
    let last = terminal(held, Duration::from_secs(20)).await;
    assert_eq!(last["type"], "completed", "{last}");
    assert_eq!(router.proc.wait_exit(Duration::from_secs(15)), Some(0));
}
