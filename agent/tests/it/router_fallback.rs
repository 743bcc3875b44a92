//! The router runtime in-process against scripted workers on a real loopback WebSocket:
//! an offer to a worker that lost its connection fails over at once (no offer timer),
//! that worker's remaining alternatives are skipped, and the next worker's accept, token
//! and result reach the submitter.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use den_agent::router::{RouterOptions, RouterServer};
use den_agent::serving::Submitter;
use den_protocol::capacity::DeclineReason;
use den_protocol::chunk::plan_chunks;
use den_protocol::ids::{AssignmentId, Epoch};
use den_protocol::observation::{GpuPrefix, Observation};
use den_protocol::request::GenerationRequest;
use den_protocol::router::DeliveryKind;
use den_protocol::wire::{
    Heartbeat, Hello, OfferResult, PROTOCOL_VERSION, ResultMessage, ToRouter, TokenDelta,
    WorkerResult, encode,
};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const MODEL: &str = "den-synthetic";

async fn send(ws: &mut Ws, frame: &ToRouter) {
    let text = String::from_utf8(encode(frame).unwrap()).unwrap();
    ws.send(Message::text(text)).await.unwrap();
}

async fn next(ws: &mut Ws) -> Value {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("a frame within 5 s (an offer timer would take 30 s)")
            .unwrap()
            .unwrap();
        if let Message::Text(t) = m {
            return serde_json::from_str(t.as_str()).unwrap();
        }
    }
}

/// A scripted worker: hello, welcome, one heartbeat.
async fn worker(addr: std::net::SocketAddr, name: &str, obs: Observation) -> Ws {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/agents"))
        .await
        .unwrap();
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        worker_id: name.into(),
        node: name.into(),
        epoch: Epoch(1),
        credential: None,
    };
    send(&mut ws, &ToRouter::Hello(hello)).await;
    assert_eq!(next(&mut ws).await["type"], "welcome");
    send(
        &mut ws,
        &ToRouter::Heartbeat(Box::new(Heartbeat { observation: obs })),
    )
    .await;
    ws
}

fn observation(name: &str) -> Observation {
    let mut o = Observation::new(name, name);
    o.epoch = Epoch(1);
    o.models.insert(MODEL.into());
    o.free_pages = 100;
    o.prefill_ms_per_token = 1.0;
    o.first_token_ms = 1.0;
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offer_to_a_worker_without_a_route_fails_over_at_once() {
    let opts = RouterOptions {
        chunk_size: 16,
        offer_timeout: Duration::from_secs(30),
        heartbeat_timeout: Duration::from_secs(30),
        ..RouterOptions::default()
    };
    let listener = RouterServer::bind(([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server = RouterServer::start(opts);
    let router = server.handle();
    tokio::spawn(server.serve(listener, std::future::pending()));

    let tokens: Vec<u32> = (300..317).collect(); // 16 processed tokens: one chunk
    let chunk = plan_chunks(&tokens[..16], 16).remove(0);
    let resident = |o: &mut Observation| {
        o.gpu_prefixes.push(GpuPrefix {
            model: MODEL.into(),
            prefix_hash: chunk.hash,
            continuation_id: "resident".into(),
            token_count: 16,
            bytes: 1024,
        })
    };
    // Both advertise the prefix; w-2 is a little busier. Offer order: w-1/gpu, w-2/gpu,
    // w-1/none, w-2/none.
    let mut o1 = observation("w-1");
    resident(&mut o1);
    let mut o2 = observation("w-2");
    o2.queue_ms = 1.0;
    resident(&mut o2);
    let mut w1 = worker(addr, "w-1", o1).await;
    let w2 = worker(addr, "w-2", o2).await;
    while router.workers().await.len() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let request = GenerationRequest::new("r-1", MODEL, tokens, 1).unwrap();
    let mut deliveries = router.submit(request).unwrap();
    let offer = next(&mut w1).await;
    assert_eq!(offer["type"], "offer");
    assert_eq!(offer["candidate"]["tier"], "gpu");
    // w-2's connection is lost while w-1 holds the first offer: its alternatives were
    // ranked at submission and it is the next in line.
    drop(w2);
    while router.workers().await.len() > 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first: AssignmentId = serde_json::from_value(offer["assignment"].clone()).unwrap();
    send(
        &mut w1,
        &ToRouter::OfferResult(OfferResult {
            assignment: first,
            worker_epoch: Epoch(1),
            accepted: false,
            reason: Some(DeclineReason::ResidentPrefixUnavailable),
        }),
    )
    .await;

    // The offer to w-2 fails at once (no route), w-2's other alternative is skipped, and
    // w-1's recompute alternative is offered long before any offer timer could fire.
    let offer = next(&mut w1).await;
    assert_eq!(offer["type"], "offer");
    assert_eq!(offer["candidate"]["worker_id"], "w-1");
    assert_eq!(offer["candidate"]["tier"], "none");
    assert_eq!(offer["assignment"]["attempt"], 3);
    let assignment: AssignmentId = serde_json::from_value(offer["assignment"].clone()).unwrap();
    send(
        &mut w1,
        &ToRouter::OfferResult(OfferResult {
            assignment: assignment.clone(),
            worker_epoch: Epoch(1),
            accepted: true,
            reason: None,
        }),
    )
    .await;
    send(
        &mut w1,
        &ToRouter::Token(TokenDelta {
            assignment: assignment.clone(),
            token: 7,
            index: 0,
        }),
    )
    .await;
    send(
        &mut w1,
        &ToRouter::Result(ResultMessage {
            assignment,
            result: Box::new(WorkerResult::completed(vec![7], 0)),
        }),
    )
    .await;
    let d = deliveries.recv().await.unwrap();
    assert!(
        matches!(d.kind, DeliveryKind::Delta { token: 7, index: 0 }),
        "{d:?}"
    );
    let d = deliveries.recv().await.unwrap();
    assert!(matches!(d.kind, DeliveryKind::Completed { .. }), "{d:?}");

    let m = router.metrics();
    assert_eq!(m.value("den_router_offers_without_route_total", &[]), 1.0);
    assert_eq!(m.value("den_router_offer_timeouts_total", &[]), 0.0);
    let record = router.record(&"r-1".into()).await.unwrap();
    let outcomes: Vec<String> = record
        .attempts
        .iter()
        .map(|a| format!("{} {}", a.worker, a.outcome))
        .collect();
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert!(outcomes[0].starts_with("w-1 declined"), "{outcomes:?}");
    assert_eq!(outcomes[1], "w-2 became unavailable");
    assert_eq!(outcomes[2], "w-1 completed");
}
