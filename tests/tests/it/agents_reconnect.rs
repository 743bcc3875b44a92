//! Worker ↔ router connection lifecycle with real processes: a worker reconnects (with
//! backoff) to a router that was killed and restarted, republishes its chunks so the new
//! router can route to its cache, and a restarted worker process comes back with a larger
//! epoch. Also the console feed: hello, snapshot, then route changes.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use den_tests::agents::{
    body, metric, prompt, start_router, start_router_at, start_worker, wait_for,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_worker_reconnects_to_a_restarted_router_and_restarts_with_a_new_epoch() {
    let router1 = start_router(None, &[]);
    let mut w = start_worker(&router1, "w-a", false, &["--prefill-ms-per-token", "4"]);
    router1.wait_workers(&["w-a"]).await;
    let tokens = prompt(21, 60);
    let first = router1.generate(body("q1", &tokens, 3)).await;
    assert_eq!(first.kind(), "completed");
    w.wait_idle().await;
    let before = router1.observation("w-a").await.unwrap();
    assert_eq!(before["epoch"], 1);

    router1.proc.signal("KILL");
    let addr = router1.url.trim_start_matches("http://").to_owned();
    // Give the worker a moment to notice and start backing off.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let router2 = start_router_at(&addr, None, &[]);
    wait_for("w-a to reconnect", Duration::from_secs(20), || async {
        router2.observation("w-a").await.map(|_| ())
    })
    .await;
    let again = router2.observation("w-a").await.unwrap();
    assert_eq!(again["epoch"], 1, "same process, same epoch");
    assert!(again["sequence"].as_u64().unwrap() > before["sequence"].as_u64().unwrap());
    // The worker republished its chunks: the new router routes the prefix to its cache.
    wait_for(
        "the catalog to be republished",
        Duration::from_secs(10),
        || async {
            (metric(&router2.metrics().await, "den_catalog_chunks", &[]) > 0.0).then_some(())
        },
    )
    .await;
    let second = router2.generate(body("q2", &tokens, 3)).await;
    assert_eq!(second.kind(), "completed", "{:?}", second.terminal);
    assert_eq!(second.cached_tokens(), 59);
    assert_eq!(second.tokens(), first.tokens());
    assert!(metric(&w.metrics_text().await, "den_worker_reconnects_total", &[]) >= 1.0);

    // A new process of the same worker (same data directory) has the next epoch.
    w.proc.signal("KILL");
    w.proc.wait_exit(Duration::from_secs(10));
    let w2 = start_worker(&router1, "w-a", false, &[]);
    wait_for(
        "the restarted worker to register",
        Duration::from_secs(20),
        || async {
            let obs = router2.observation("w-a").await?;
            (obs["epoch"] == 2).then_some(())
        },
    )
    .await;
    let third = router2.generate(body("q3", &prompt(22, 20), 2)).await;
    assert_eq!(third.kind(), "completed", "{:?}", third.terminal);
    let _ = w2;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_console_feed_sends_snapshot_then_route_changes() {
    let router = start_router(Some("tok"), &[]);
    let _w = start_worker(&router, "w-a", false, &[]);
    router.wait_workers(&["w-a"]).await;
    let url = router.url.replace("http://", "ws://") + "/v1/console";
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", "Bearer tok".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let mut next = async || -> Value {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .expect("a feed frame")
                .expect("open feed")
                .expect("feed frame");
            if let Message::Text(t) = m {
                return serde_json::from_str(t.as_str()).unwrap();
            }
        }
    };
    let hello = next().await;
    assert_eq!(hello["type"], "hello");
    assert_eq!(hello["feed_version"], 1);
    let snapshot = next().await;
    assert_eq!(snapshot["type"], "snapshot");
    assert_eq!(snapshot["workers"][0]["worker_id"], "w-a");

    let g = router.generate(body("f1", &prompt(23, 20), 2)).await;
    assert_eq!(g.kind(), "completed");
    let mut finished = false;
    for _ in 0..50 {
        let f = next().await;
        if f["type"] == "route"
            && f["record"]["request"] == "f1"
            && f["record"]["outcome"]["kind"] == "completed"
        {
            finished = true;
            break;
        }
    }
    assert!(finished, "the feed reported the finished route");
}
