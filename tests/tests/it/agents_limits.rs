//! The router's listener against a peer that only opens sockets: idle and slow-header
//! connections are closed after `--header-timeout`, connections over
//! `--max-connections-per-peer` are closed at once, and `/healthz` answers throughout
//! once the deadline reaped them (before, 373 idle sockets stopped it for good).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use den_tests::agents::{client, start_router};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_idle_and_slow_header_sockets_are_reaped_and_capped() {
    let router = start_router(
        None,
        &["--header-timeout", "1s", "--max-connections-per-peer", "16"],
    );
    let addr = router.url.trim_start_matches("http://").to_owned();
    let t0 = Instant::now();
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
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "closed after {:?}",
        t0.elapsed()
    );
    let health = client()
        .get(format!("{}/healthz", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let log = router.proc.log();
    assert!(log.contains("connection refused: over the limit"), "{log}");
}
