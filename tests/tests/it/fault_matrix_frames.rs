//! The fault matrix's frame rows (see fault_matrix.rs): a worker's frames to the router
//! duplicated, reordered and late, injected by its `--fault-admin` endpoint. The router
//! takes each delta once, in order, only for the current attempt; a frame that arrives
//! after its attempt was given up on is fenced.

use std::time::Duration;

use den_tests::agents::{Generation, Worker, body, metric, prompt, start_router, start_worker};
use den_tests::faults::{COSTS, assert_clean};

/// The deltas a client saw: contiguous from index 0, each once, a prefix of the
/// completed line's tokens.
fn assert_stream_consistent(g: &Generation) {
    let tokens = g.tokens();
    for (i, d) in g.deltas.iter().enumerate() {
        assert_eq!(
            d["index"].as_u64(),
            Some(i as u64),
            "deltas: {:?}",
            g.deltas
        );
        assert_eq!(
            d["token"].as_u64(),
            tokens.get(i).copied(),
            "{:?}",
            g.deltas
        );
    }
}

async fn with_fault(w: &Worker, mode: &str) {
    w.fault(&format!("/fault/outbound?{mode}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_duplicated_frames_change_nothing() {
    let router = start_router(None, &[]);
    let a = start_worker(&router, "w-a", true, COSTS);
    router.wait_workers(&["w-a"]).await;
    let tokens = prompt(12, 40);
    let control = router.generate(body("u0", &tokens, 8)).await;
    assert_eq!(control.kind(), "completed");

    with_fault(&a, "mode=duplicate").await;
    let g = router.generate(body("u1", &tokens, 8)).await;
    let fresh = router.generate(body("u2", &prompt(13, 40), 8)).await;
    with_fault(&a, "mode=none").await;
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(g.tokens(), control.tokens());
    assert_eq!(g.deltas.len(), 8, "each delta once: {:?}", g.deltas);
    assert_stream_consistent(&g);
    assert_eq!(fresh.kind(), "completed", "{:?}", fresh.terminal);
    assert_eq!(fresh.deltas.len(), 8);
    assert_stream_consistent(&fresh);
    assert_clean(&router, &["u0", "u1", "u2"], &[&a]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_reordered_frames_keep_the_output_whole_and_in_order() {
    let router = start_router(None, &[]);
    let slow = ["--prefill-ms-per-token", "4", "--decode-ms-per-token", "20"];
    let a = start_worker(&router, "w-a", true, &slow);
    router.wait_workers(&["w-a"]).await;
    let tokens = prompt(14, 40);
    let control = router.generate(body("o0", &tokens, 12)).await;
    assert_eq!(control.kind(), "completed");

    with_fault(&a, "mode=reorder").await;
    let g = router.generate(body("o1", &tokens, 12)).await;
    with_fault(&a, "mode=none").await;
    // Deltas after a swapped pair are dropped (the next index only); the completed
    // line still carries every token, in order.
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(g.tokens(), control.tokens());
    assert_stream_consistent(&g);
    assert_clean(&router, &["o0", "o1"], &[&a]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_late_frames_fall_back_and_are_fenced() {
    let router = start_router(None, &["--offer-timeout", "300ms"]);
    let a = start_worker(&router, "w-a", true, COSTS);
    let b = start_worker(&router, "w-b", true, COSTS);
    router.wait_workers(&["w-a", "w-b"]).await;
    // Everything w-a says reaches the router 800 ms late: its answer to an offer comes
    // after the offer timed out. Identical idle workers: w-a ranks first by name.
    with_fault(&a, "mode=delay&ms=800").await;
    let g = router.generate(body("l1", &prompt(15, 40), 4)).await;
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(g.worker(), "w-b");
    let record = router.record("l1").await;
    let attempts = record["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["worker"], "w-a", "{record}");
    assert_eq!(attempts[0]["outcome"]["kind"], "timed-out", "{record}");
    // w-a's late accept (and whatever followed it) is fenced, never delivered.
    den_tests::agents::wait_for(
        "w-a's late answer to be fenced",
        Duration::from_secs(10),
        || async {
            let m = router.metrics().await;
            (den_tests::agents::metric_sum(&m, "den_router_fenced_total") >= 1.0).then_some(())
        },
    )
    .await;
    with_fault(&a, "mode=none").await;
    assert!(
        metric(
            &router.metrics().await,
            "den_router_offer_timeouts_total",
            &[]
        ) >= 1.0
    );
    assert_clean(&router, &["l1"], &[&a, &b]).await;
}
