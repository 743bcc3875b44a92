//! The router's listener against a peer that only opens sockets: idle and slow-header
//! connections are closed after `--header-timeout`, connections over
//! `--max-connections-per-peer` are closed at once, and `/healthz` answers throughout
//! once the deadline reaped them (before, 373 idle sockets stopped it for good).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use den_tests::agents::{client, start_router};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_idle_and_slow_header_sockets_are_reaped_and_capped() {
    let router = start_router(
        None,
        &["--header-timeout", "1s", "--max-connections-per-peer", "16"],
    );
    let addr = router.url.trim_start_matches("http://").to_owned();
    let mut idle: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    // Some trickle a request line and never finish the headers.
    for s in idle.iter_mut().take(8) {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
    }
    // Every one of them is closed: at once (over the cap) or at the header deadline.
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Ok(n) => panic!("a silent socket got {n} bytes of answer"),
            Err(e) => panic!("a silent socket stayed open: {e}"),
        }
    }
    let health = client()
        .get(format!("{}/healthz", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let log = router.proc.log();
    assert!(log.contains("connection refused: over the limit"), "{log}");
}

/// The console feed's snapshot carries at most 256 decision records — every live one and
/// the most recently finished — however many the retention window holds (it used to carry
/// them all: 9 MB after ~1,900 requests, re-sent to every console).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_console_snapshots_are_bounded_to_the_recent_records() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let router = start_router(None, &[]);
    let _w = den_tests::agents::start_worker(&router, "w-feed", false, &[]);
    router.wait_workers(&["w-feed"]).await;
    let n = 300;
    for i in 0..n {
        let g = router
            .generate(den_tests::agents::body(
                &format!("feed-{i:03}"),
                &den_tests::agents::prompt(i, 8),
                1,
            ))
            .await;
        assert_eq!(g.kind(), "completed");
    }
    let url = format!("{}/v1/console", router.url.replacen("http://", "ws://", 1));
    let (mut ws, _) = tokio_tungstenite::connect_async(url.into_client_request().unwrap())
        .await
        .unwrap();
    let mut snapshot = None;
    while snapshot.is_none() {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
        if v["type"] == "snapshot" {
            snapshot = Some(v);
        }
    }
    let snapshot = snapshot.unwrap();
    let routes = snapshot["routes"].as_array().unwrap();
    assert_eq!(routes.len(), 256, "{} records", routes.len());
    let ids: Vec<&str> = routes
        .iter()
        .filter_map(|r| r["request"].as_str())
        .collect();
    assert!(ids.contains(&"feed-299"), "the newest is kept");
    assert!(!ids.contains(&"feed-000"), "the oldest is left out");
    // Still readable one at a time.
    assert_eq!(router.record("feed-000").await["request"], "feed-000");
}
