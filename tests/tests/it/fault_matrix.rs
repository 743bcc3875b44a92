//! The fault matrix, one named suite (`cargo test fault_matrix`): real processes on
//! loopback, one fault per row, and every row ends with the same checks
//! ([`den_tests::faults::assert_clean`]): each request has exactly one terminal outcome
//! (none lost, none duplicated), every client got a terminal answer, and every surviving
//! worker is idle with its pages fully accounted.
//!
//! | row | fault | expected |
//! |---|---|---|
//! | kill during restore | SIGKILL while chunks are being placed | completes on the other worker (restored from objects) |
//! | pause during restore | SIGSTOP past the heartbeat timeout, then SIGCONT | moved to the other worker; the late result is fenced |
//! | kill during prefill | SIGKILL before the first delta | completes on the other worker |
//! | kill during decode | SIGKILL after the first delta | one clean error, no retry (output was visible) |
//! | directed partition | frames router → worker dropped | offer times out, is cancelled, falls back |
//! | router restart mid-stream | router SIGKILLed and started again on its port | the client's stream ends in an error; workers reconnect, drop the orphaned work, serve again |
//! | duplicated frames | every worker frame sent twice | same tokens as without the fault, each delta once |
//! | reordered frames | worker frames in swapped pairs | same tokens, deltas in order, none twice |
//! | late frames | worker frames held past the offer timeout | falls back; the late worker's answers are fenced |
//! | corrupt chunk | a byte flipped in every SSD chunk | recomputed, identical output, never wrong KV |
//! | disk full | the SSD tier on a 1 MiB tmpfs | requests complete; failed writes leave nothing behind |
//! | object store down | the object store's directory replaced by a file | restore fails, recomputed, identical output |
//!
//! The frame rows live in fault_matrix_frames.rs, the storage rows in
//! fault_matrix_storage.rs; the workers' `--fault-admin` endpoint injects the faults
//! that signals cannot.

use std::time::Duration;

use den_tests::agents::{
    body, metric, metric_sum, prompt, start_router, start_router_at, start_worker, wait_for,
};
use den_tests::faults::{COSTS, assert_clean, kill_the_serving, restore_setup, wait_accepted};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_kill_during_restore_completes_on_the_other_worker() {
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
    assert_clean(&router, &["warm", "k1"], &[&b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_pause_during_restore_moves_it_and_fences_the_late_result() {
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
    assert_clean(&router, &["warm", "p1"], &[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_kill_during_decode_gives_one_clean_error_and_no_retry() {
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
    let other = kill_the_serving(&serving, &mut a, &mut b);

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
    assert_clean(&router, &["d1"], &[other]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_directed_partition_times_out_the_offer_and_falls_back() {
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
    assert_clean(&router, &["n1", "n2"], &[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_kill_during_prefill_completes_on_the_other_worker() {
    let router = start_router(None, &[]);
    // 30 ms per prompt token: a 100-token prefill takes 3 s, long enough to kill it.
    let slow = ["--prefill-ms-per-token", "30"];
    let mut a = start_worker(&router, "w-a", false, &slow);
    let mut b = start_worker(&router, "w-b", false, &slow);
    router.wait_workers(&["w-a", "w-b"]).await;

    let mut s = router.stream(body("f1", &prompt(9, 100), 4)).await;
    let serving = wait_for(
        "an attempt to be accepted",
        Duration::from_secs(10),
        || async {
            let record = router.record("f1").await;
            let a0 = &record["attempts"][0];
            (a0["outcome"]["kind"] == "running")
                .then(|| a0["worker"].as_str().map(str::to_owned))?
        },
    )
    .await;
    let other = kill_the_serving(&serving, &mut a, &mut b);

    while s.next_line().await.is_some() {}
    let g = s.finish();
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(g.worker(), other.name);
    assert_eq!(
        g.deltas.len(),
        4,
        "the client saw only the second attempt's output"
    );
    let attempts = g.terminal["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["outcome"], "became unavailable", "{attempts:?}");
    assert_clean(&router, &["f1"], &[other]).await;
}

/// The router dies mid-stream: the client's stream ends without a completion (its
/// transport fails, a terminal answer it can act on), the router comes back on its
/// port, the workers reconnect, cancel what they held for the dead router, and serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_router_restart_mid_stream_ends_the_stream_and_the_cluster_recovers() {
    let mut router = start_router(None, &["--heartbeat-timeout", "2s"]);
    let slow = ["--decode-ms-per-token", "100"];
    let w = start_worker(&router, "w-a", false, &slow);
    router.wait_workers(&["w-a"]).await;

    let mut s = router.stream(body("m1", &prompt(10, 20), 200)).await;
    let first = s.next_line().await.unwrap();
    assert_eq!(first["type"], "delta");
    let listen = router.url.trim_start_matches("http://").to_owned();
    router.proc.signal("KILL");
    router.proc.wait_exit(Duration::from_secs(10));
    // The stream ends: no completed line, however long the client waits.
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(_)) = s.try_next_line().await {}
    })
    .await;
    assert!(ended.is_ok(), "the client's stream outlived its router");
    assert!(
        s.lines.iter().all(|l| l["type"] == "delta"),
        "{:?}",
        s.lines
    );

    let router = start_router_at(&listen, None, &["--heartbeat-timeout", "2s"]);
    router.wait_workers(&["w-a"]).await;
    // The worker dropped the dead router's assignment and freed its pages.
    w.wait_idle().await;
    let g = router.generate(body("m2", &prompt(11, 20), 4)).await;
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_clean(&router, &["m2"], &[&w]).await;
}
