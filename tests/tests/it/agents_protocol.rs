//! Protocol violations on the worker endpoint: no or wrong token, wrong protocol version,
//! malformed and oversized frames, a first frame that is not `hello`, a second `hello`.
//! Each is refused with a clear error and its connection closed — and a real worker
//! connected all along keeps heartbeating and serving.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use den_protocol::wire::PROTOCOL_VERSION;
use den_tests::agents::{Router, body, metric_sum, prompt, start_router, start_worker, wait_for};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(router: &Router, token: Option<&str>) -> Result<Ws, WsError> {
    let url = router.url.replace("http://", "ws://") + "/v1/agents";
    let mut req = url.into_client_request().unwrap();
    if let Some(t) = token {
        req.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
        );
    }
    tokio_tungstenite::connect_async(req)
        .await
        .map(|(ws, _)| ws)
}

fn hello(version: u32, name: &str) -> String {
    json!({"type": "hello", "protocol_version": version, "worker_id": name, "node": name, "epoch": 1})
        .to_string()
}

/// The next text frame as JSON (`None` when the connection closed first).
async fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .ok()??
        {
            Ok(Message::Text(t)) => return serde_json::from_str(t.as_str()).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// After a refusal the router closes the connection.
async fn assert_closed(ws: &mut Ws) {
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(
        end.is_ok(),
        "the router kept the connection open after refusing it"
    );
}

async fn expect_refused(ws: &mut Ws, reason: &str, detail_has: &str) {
    let frame = next_json(ws).await.expect("a refused frame");
    assert_eq!(frame["type"], "refused", "{frame}");
    assert_eq!(frame["reason"], reason, "{frame}");
    let detail = frame["detail"].as_str().unwrap();
    assert!(
        detail.contains(detail_has),
        "detail {detail:?} should mention {detail_has:?}"
    );
    assert!(!detail.contains('\n'));
    assert_closed(ws).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_bad_tokens_versions_and_frames_are_refused_without_disturbing_others() {
    let router = start_router(Some("tok"), &["--max-frame", "64KiB"]);
    let w = start_worker(&router, "w-a", false, &[]);
    router.wait_workers(&["w-a"]).await;
    let seq_before = router.observation("w-a").await.unwrap()["sequence"]
        .as_u64()
        .unwrap();

    // No token, wrong token: HTTP 401 before any upgrade, with a message saying why.
    for (token, says) in [
        (None, "missing Authorization"),
        (Some("nope"), "wrong token"),
    ] {
        match connect(&router, token).await {
            Err(WsError::Http(resp)) => {
                assert_eq!(resp.status(), 401);
                let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default())
                    .into_owned();
                assert!(body.contains(says), "{body}");
            }
            other => panic!("expected 401, got {:?}", other.map(|_| "a socket")),
        }
    }

    // Wrong protocol version.
    let mut ws = connect(&router, Some("tok")).await.unwrap();
    ws.send(Message::text(hello(PROTOCOL_VERSION + 1, "intruder")))
        .await
        .unwrap();
    expect_refused(&mut ws, "unsupported-version", "run matching den versions").await;

    // Not JSON as the first frame.
    let mut ws = connect(&router, Some("tok")).await.unwrap();
    ws.send(Message::text("{not json")).await.unwrap();
    expect_refused(&mut ws, "malformed", "not JSON").await;

    // A well-formed frame, but not hello, first.
    let mut ws = connect(&router, Some("tok")).await.unwrap();
    let early = json!({"type": "offer-result", "assignment": {"request": "r", "attempt": 1},
                       "worker_epoch": 1, "accepted": true});
    ws.send(Message::text(early.to_string())).await.unwrap();
    expect_refused(&mut ws, "malformed", "first frame must be hello").await;

    // A good hello, then garbage.
    let mut ws = connect(&router, Some("tok")).await.unwrap();
    ws.send(Message::text(hello(PROTOCOL_VERSION, "w-x")))
        .await
        .unwrap();
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "welcome");
    ws.send(Message::text(
        json!({"type": "token", "assignment": {"request": "r", "attempt": 0}}).to_string(),
    ))
    .await
    .unwrap();
    expect_refused(&mut ws, "malformed", "attempts start at 1").await;

    // A good hello, then a frame over the 64 KiB limit.
    let mut ws = connect(&router, Some("tok")).await.unwrap();
    ws.send(Message::text(hello(PROTOCOL_VERSION, "w-y")))
        .await
        .unwrap();
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "welcome");
    let big = json!({"type": "publish", "chunks": [], "pad": "x".repeat(100 * 1024)}).to_string();
    ws.send(Message::text(big)).await.unwrap();
    expect_refused(&mut ws, "malformed", "exceeds the 65536-byte limit").await;

    // A good hello, then a message type this router does not know (a newer peer's): it
    // passes; the connection stays up (the second hello below is answered on it).
    let mut ws = connect(&router, Some("tok")).await.unwrap();
    ws.send(Message::text(hello(PROTOCOL_VERSION, "w-u")))
        .await
        .unwrap();
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "welcome");
    ws.send(Message::text(
        json!({"type": "from-a-newer-den", "anything": [1, 2]}).to_string(),
    ))
    .await
    .unwrap();
    ws.send(Message::text(hello(PROTOCOL_VERSION, "w-u")))
        .await
        .unwrap();
    expect_refused(&mut ws, "malformed", "only once").await;
    let unknown = metric_sum(&router.metrics().await, "den_router_unknown_frames_total");
    assert_eq!(
        unknown, 1.0,
        "the unknown frame was passed over and counted"
    );

    // A second hello.
    let mut ws = connect(&router, Some("tok")).await.unwrap();
    ws.send(Message::text(hello(PROTOCOL_VERSION, "w-z")))
        .await
        .unwrap();
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "welcome");
    ws.send(Message::text(hello(PROTOCOL_VERSION, "w-z")))
        .await
        .unwrap();
    expect_refused(&mut ws, "malformed", "only once").await;

    // Meanwhile the real worker kept heartbeating on its connection and still serves.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let obs = router
        .observation("w-a")
        .await
        .expect("w-a still registered");
    assert!(obs["sequence"].as_u64().unwrap() > seq_before);
    assert_eq!(
        router.workers().await.len(),
        1,
        "no intruder was registered"
    );
    let g = router.generate(body("ok", &prompt(9, 20), 3)).await;
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(w.status().await["connected"], true);
    let rm = router.metrics().await;
    assert!(metric_sum(&rm, "den_router_refused_total") >= 6.0);
    assert!(metric_sum(&rm, "den_router_unauthorized_total") >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_management_calls_need_the_token() {
    let router = start_router(Some("tok"), &[]);
    let client = den_tests::agents::client();
    // Every route but /metrics and /healthz, with and without a wrong token: 401 and a
    // line naming DEN_TOKEN, before the handler runs (nothing is cancelled or drained).
    let guarded = [
        ("GET", "/v1/agents"),
        ("GET", "/v1/console"),
        ("POST", "/v1/generate"),
        ("GET", "/v1/requests/r1"),
        ("POST", "/v1/requests/r1/cancel"),
        ("GET", "/v1/workers"),
        ("POST", "/v1/workers/w1/drain"),
        ("POST", "/v1/workers/w1/undrain"),
    ];
    for (method, path) in guarded {
        for token in [None, Some("nope")] {
            let url = format!("{}{path}", router.url);
            let mut req = match method {
                "GET" => client.get(&url),
                _ => client.post(&url).json(&json!({})),
            };
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 401, "{method} {path} with {token:?}");
            let v: Value = resp.json().await.unwrap();
            assert!(v["error"].as_str().unwrap().contains("DEN_TOKEN"), "{v}");
        }
    }
    // Metrics and health stay open for scrapers, and count the refusals.
    let health = client
        .get(format!("{}/healthz", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let refused = metric_sum(&router.metrics().await, "den_router_unauthorized_total");
    assert!(refused >= 16.0, "{refused}");
}

/// An oversized body gets each API's JSON error shape (not axum's plain text), and the
/// client reads it (the excess is drained) instead of a reset connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_oversized_bodies_are_json_errors() {
    let router = start_router(Some("tok"), &[]);
    let client = den_tests::agents::client();
    let big = vec![b' '; 8 << 20];
    for path in ["/v1/generate", "/instance"] {
        let resp = client
            .post(format!("{}{path}", router.url))
            .bearer_auth("tok")
            .header("content-type", "application/json")
            .body(big.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 413, "{path}");
        let v: Value = resp
            .json()
            .await
            .unwrap_or_else(|e| panic!("{path}: not JSON: {e}"));
        let message = match path {
            "/instance" => v["error"]["message"].as_str().unwrap().to_owned(),
            _ => v["error"].as_str().unwrap().to_owned(),
        };
        assert!(message.contains("request body"), "{path}: {v}");
    }
}

/// `/readyz` tells a load balancer whether to send traffic: not before a worker serves a
/// model, not while the only worker drains; `/healthz` stays liveness only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_readyz_follows_workers_and_drains() {
    let router = start_router(Some("tok"), &[]);
    let client = den_tests::agents::client();
    let ready = |client: reqwest::Client, url: String| async move {
        let resp = client.get(format!("{url}/readyz")).send().await.unwrap();
        let status = resp.status().as_u16();
        let retry = resp.headers().get("retry-after").is_some();
        let body = resp.text().await.unwrap();
        (status, retry, body)
    };
    let (status, retry, body) = ready(client.clone(), router.url.clone()).await;
    assert_eq!((status, retry), (503, true), "{body}");
    assert!(body.contains("no worker"), "{body}");
    let health = client
        .get(format!("{}/healthz", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    let _worker = start_worker(&router, "w1", false, &[]);
    router.wait_workers(&["w1"]).await;
    den_tests::agents::wait_for("ready with a worker", Duration::from_secs(20), || {
        let (client, url) = (client.clone(), router.url.clone());
        async move { (ready(client, url).await.0 == 200).then_some(()) }
    })
    .await;

    assert!(
        router
            .post("/v1/workers/w1/drain")
            .await
            .status()
            .is_success()
    );
    let body =
        den_tests::agents::wait_for("not ready while draining", Duration::from_secs(20), || {
            let (client, url) = (client.clone(), router.url.clone());
            async move {
                let (status, _, body) = ready(client, url).await;
                (status == 503).then_some(body)
            }
        })
        .await;
    assert!(body.contains("draining"), "{body}");
    assert!(
        router
            .post("/v1/workers/w1/undrain")
            .await
            .status()
            .is_success()
    );
    den_tests::agents::wait_for("ready again", Duration::from_secs(20), || {
        let (client, url) = (client.clone(), router.url.clone());
        async move { (ready(client, url).await.0 == 200).then_some(()) }
    })
    .await;
}

/// A connection that says hello and then nothing is closed once the heartbeat timeout
/// passes, instead of holding a descriptor forever (a worker that heartbeated and then
/// paused keeps its socket: the fault matrix covers its late result).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_a_silent_connection_is_closed_after_the_heartbeat_timeout() {
    let router = start_router(
        Some("tok"),
        &["--heartbeat-interval", "250ms", "--heartbeat-timeout", "1s"],
    );
    let mut ws = connect(&router, Some("tok")).await.unwrap();
    ws.send(Message::text(hello(PROTOCOL_VERSION, "mute")))
        .await
        .unwrap();
    let welcome = next_json(&mut ws).await.expect("welcome");
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    let started = std::time::Instant::now();
    assert_closed(&mut ws).await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed before the timeout"
    );
    let closed = metric_sum(&router.metrics().await, "den_router_silent_closed_total");
    assert_eq!(closed, 1.0);
}

/// A holder of the shared token cannot take over a live worker's name (and receive its
/// offers, prompt tokens included): the router pinned the real worker's credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_an_impostor_cannot_take_over_a_workers_name() {
    let router = start_router(Some("tok"), &[]);
    let _real = start_worker(&router, "w1", false, &[]);
    router.wait_workers(&["w1"]).await;
    for credential in [Some("f".repeat(64)), None] {
        let mut ws = connect(&router, Some("tok")).await.unwrap();
        let mut impostor = json!({"type": "hello", "protocol_version": PROTOCOL_VERSION,
                                  "worker_id": "w1", "node": "w1", "epoch": 99});
        if let Some(c) = &credential {
            impostor["credential"] = json!(c);
        }
        ws.send(Message::text(impostor.to_string())).await.unwrap();
        expect_refused(&mut ws, "unauthorized", "belongs to another process").await;
    }
    // The real worker still holds its route and serves.
    let g = router
        .generate(body("after-impostor", &prompt(7, 32), 4))
        .await;
    assert_eq!(g.kind(), "completed");
    assert_eq!(g.worker(), "w1");
    assert!(router.proc.log().contains("belongs to another process"));
}

/// Inference API keys (`--api-keys-file`): a key reaches the OpenAI ingress and
/// `/v1/generate`, gets 403 (naming the inference endpoints) on the cluster's own
/// endpoints — workers, consoles, management — which keep needing the token, and the file
/// is re-read when it changes: a revoked key is refused, a new one admitted, no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_api_keys_reach_only_inference_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("api-keys");
    std::fs::write(&keys, "# inference clients\nkey-one-aaaaaaaaaaaaaaaa\n").unwrap();
    let router = start_router(Some("tok"), &["--api-keys-file", keys.to_str().unwrap()]);
    let _w = start_worker(&router, "w-1", false, &[]);
    router.wait_workers(&["w-1"]).await;
    let client = den_tests::agents::client();
    let chat = json!({"model": "den-synthetic", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let post_chat = |key: &'static str| {
        let client = client.clone();
        let url = format!("{}/v1/chat/completions", router.url);
        let chat = chat.clone();
        async move {
            client
                .post(url)
                .bearer_auth(key)
                .json(&chat)
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(post_chat("key-one-aaaaaaaaaaaaaaaa").await.status(), 200);
    assert_eq!(
        post_chat("tok").await.status(),
        200,
        "the token reaches inference too"
    );
    assert_eq!(post_chat("key-unknown-aaaaaaaaaaaa").await.status(), 401);
    let generate = client
        .post(format!("{}/v1/generate", router.url))
        .bearer_auth("key-one-aaaaaaaaaaaaaaaa")
        .json(&json!({"id": "g1", "tokens": [1, 2, 3], "max_new_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(generate.status(), 200);
    for (method, path) in [
        ("GET", "/v1/workers"),
        ("GET", "/v1/console"),
        ("GET", "/v1/agents"),
        ("POST", "/v1/workers/w-1/drain"),
        ("GET", "/state"),
    ] {
        let url = format!("{}{path}", router.url);
        let req = match method {
            "GET" => client.get(&url),
            _ => client.post(&url).json(&json!({})),
        };
        let resp = req
            .bearer_auth("key-one-aaaaaaaaaaaaaaaa")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403, "{method} {path}");
        let text = resp.text().await.unwrap();
        assert!(text.contains("inference endpoints"), "{path}: {text}");
        assert!(
            !text.contains("key-one"),
            "{path}: the key is not echoed: {text}"
        );
    }
    // The worker is still serving: the drain was refused before its handler ran.
    assert_eq!(post_chat("key-one-aaaaaaaaaaaaaaaa").await.status(), 200);
    // Revoke one, add two: the router re-reads the file within a few seconds.
    std::fs::write(&keys, "key-two-bbbbbbbbbbbbbbbb\n").unwrap();
    wait_for(
        "the new key to be admitted",
        Duration::from_secs(10),
        || async { (post_chat("key-two-bbbbbbbbbbbbbbbb").await.status() == 200).then_some(()) },
    )
    .await;
    assert_eq!(post_chat("key-one-aaaaaaaaaaaaaaaa").await.status(), 401);
    // A broken edit keeps the keys in force.
    std::fs::write(&keys, "too-short\n").unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(post_chat("key-two-bbbbbbbbbbbbbbbb").await.status(), 200);
}

/// A worker that connects after the router's drain has ended, in the moment before its
/// listener stops, is told `refused: shutdown` rather than welcomed by a router whose
/// actor is gone. In-process (`RouterServer`), so the test can hold that moment open:
/// the actor has stopped, the listener still accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_a_worker_connecting_after_the_drain_is_refused_with_shutdown() {
    use den_agent::router::{RouterOptions, RouterServer};
    let listener = RouterServer::bind(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server = RouterServer::start(RouterOptions::default());
    let handle = server.handle();
    tokio::spawn(server.serve(listener, std::future::pending()));
    handle.shutdown(Duration::ZERO).await;

    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/agents"))
        .await
        .expect("the listener still accepts");
    ws.send(Message::text(hello(PROTOCOL_VERSION, "late")))
        .await
        .unwrap();
    let answer = next_json(&mut ws).await.expect("an answer to hello");
    assert_eq!(answer["type"], "refused", "{answer}");
    assert_eq!(answer["reason"], "shutdown", "{answer}");
    assert_closed(&mut ws).await;
}

/// A router that stops (SIGTERM) tells every worker why before it exits — `refused`
/// with reason `shutdown`, then a close — even when that frame is queued behind
/// megabytes the worker has not read yet: the exit waits (bounded) for each
/// connection's last frames instead of dropping them with the process. Here a bare
/// connection with a small receive buffer heartbeats as a roomy worker, is offered a
/// prompt of 3.5 MB and reads nothing until the drain deadline has passed; a real
/// worker, drained first, logs the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_a_stopping_router_tells_its_workers_why_before_it_exits() {
    let mut router = start_router(Some("tok"), &["--drain-timeout", "300ms"]);
    let worker = start_worker(&router, "w1", false, &[]);
    router.wait_workers(&["w1"]).await;
    let mut obs = router.observation("w1").await.expect("w1's observation");
    assert!(
        router
            .post("/v1/workers/w1/drain")
            .await
            .status()
            .is_success()
    );

    // The bare worker claims the real one's engine, with room for a very long prompt.
    let addr: std::net::SocketAddr = router.url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    let mut req = format!("ws://{addr}/v1/agents")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", HeaderValue::from_static("Bearer tok"));
    let tcp = tokio_tungstenite::MaybeTlsStream::Plain(tcp);
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
    ws.send(Message::text(hello(PROTOCOL_VERSION, "bare")))
        .await
        .unwrap();
    let welcome = next_json(&mut ws).await.expect("welcome");
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    for (k, v) in [
        ("worker_id", json!("bare")),
        ("node", json!("bare")),
        ("max_context", json!(1 << 20)),
        ("free_pages", json!(1 << 20)),
        ("kv_budget_bytes", json!(1u64 << 40)),
    ] {
        obs[k] = v;
    }
    obs["pool"]["free"] = json!(1 << 20);
    obs["pool"]["total_pages"] = json!(1 << 20);
    let (mut sink, mut stream) = ws.split();
    let heartbeats = tokio::spawn(async move {
        for sequence in 1u64.. {
            obs["sequence"] = json!(sequence);
            let frame = json!({"type": "heartbeat", "observation": obs}).to_string();
            if sink.send(Message::text(frame)).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    router.wait_workers(&["bare"]).await;
    let mut b = body("long", &prompt(7, 500_000), 4);
    b["model"] = "den-synthetic".into();
    let _stream = router.stream(b).await;

    tokio::time::sleep(Duration::from_millis(300)).await;
    router.proc.signal("TERM");
    // Past the drain deadline (the offer is cancelled) before the worker reads.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut kinds = Vec::new();
    let mut last = Value::Null;
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(msg)) = stream.next().await {
            match msg {
                Message::Text(t) => {
                    last = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                    kinds.push(last["type"].as_str().unwrap_or("?").to_owned());
                }
                Message::Close(_) => return true,
                _ => {}
            }
        }
        false
    })
    .await;
    // Hang up, as a worker told `refused` does (the router waits for that, bounded).
    heartbeats.abort();
    let _ = heartbeats.await;
    drop(stream);
    assert!(
        kinds.iter().any(|k| k == "offer"),
        "no offer came: {kinds:?} (ended: {ended:?})"
    );
    assert_eq!(ended, Ok(true), "no close frame after {kinds:?}");
    assert_eq!(last["type"], "refused", "after {kinds:?}");
    assert_eq!(last["reason"], "shutdown", "{}", last["detail"]);
    assert_eq!(router.proc.wait_exit(Duration::from_secs(15)), Some(0));
    wait_for(
        "the real worker to log why it was disconnected",
        Duration::from_secs(10),
        || async {
            let log = worker.proc.log();
            log.contains("refused by the router (Shutdown)")
                .then_some(())
        },
    )
    .await;
}
