//! Cancellation and backpressure at the ingress: a client that disconnects cancels its
//! request exactly once; a client that stops reading is cancelled and cut off while other
//! requests keep flowing; errors after the first delta end the stream with an error
//! frame and `[DONE]`.
//!
//! The submitter is `FakeSubmitter`, an in-process stand-in for the router runtime.

use crate::ingress_common;

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use den_agent::ingress::IngressConfig;
use den_agent::ingress::fake::{Behaviour, FakeModel};
use den_agent::serving::Submitter;
use den_protocol::ids::RequestId;

use ingress_common::*;

fn slow_model(id: &str, token_delay_ms: u64) -> FakeModel {
    FakeModel::new(id, 1 << 30).with(Behaviour {
        token_delay: Duration::from_millis(token_delay_ms),
        ..Behaviour::default()
    })
}

fn chat(model: &str, max_tokens: u64, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello den"}],
        "max_tokens": max_tokens, "stream": stream})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_mid_stream_cancels_exactly_once() {
    let server = serve(vec![slow_model("slow", 10)], IngressConfig::default()).await;
    let c = client();
    let mut resp = c
        .post(server.url("/v1/chat/completions"))
        .json(&chat("slow", 1000, true))
        .send()
        .await
        .unwrap();
    let first = resp.chunk().await.unwrap().unwrap();
    let first = std::str::from_utf8(&first).unwrap();
    let event: Value = serde_json::from_str(
        first
            .strip_prefix("data: ")
            .unwrap()
            .split("\n\n")
            .next()
            .unwrap(),
    )
    .unwrap();
    let id = event["id"].as_str().unwrap().to_owned();
    resp.chunk().await.unwrap().unwrap(); // at least one delta has flowed
    drop(resp);
    drop(c);
    eventually("the request is cancelled", || cancels_of(&server, &id) == 1).await;
    eventually("the generation task stopped", || server.fake.live() == 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(cancels_of(&server, &id), 1, "cancelled exactly once");
    let disconnected = server.metrics.value(
        "den_ingress_requests_total",
        &[
            ("endpoint", "chat_completions"),
            ("outcome", "disconnected"),
        ],
    );
    assert_eq!(disconnected, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_before_the_first_token_cancels_exactly_once() {
    let late = FakeModel::new("late", 4096).with(Behaviour {
        first_token_delay: Duration::from_secs(30),
        ..Behaviour::default()
    });
    let server = serve(vec![late], IngressConfig::default()).await;
    for stream in [true, false] {
        let c = client_with_timeout(Duration::from_millis(300));
        let before = server.fake.submitted().len();
        let err = c
            .post(server.url("/v1/chat/completions"))
            .json(&chat("late", 10, stream))
            .send()
            .await
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        drop(c);
        let submitted = server.fake.submitted();
        assert_eq!(submitted.len(), before + 1);
        let id = submitted[before].id.as_str().to_owned();
        eventually("the waiting request is cancelled", || {
            cancels_of(&server, &id) == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(cancels_of(&server, &id), 1, "stream={stream}");
    }
    eventually("no generation task left", || server.fake.live() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_during_a_non_streamed_generation_cancels() {
    let server = serve(vec![slow_model("slow", 10)], IngressConfig::default()).await;
    let c = client_with_timeout(Duration::from_millis(200));
    let err = c
        .post(server.url("/v1/completions"))
        .json(&json!({"model": "slow", "prompt": "the", "max_tokens": 1000}))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    drop(c);
    let id = server.fake.submitted()[0].id.as_str().to_owned();
    eventually("the request is cancelled", || cancels_of(&server, &id) == 1).await;
    eventually("the generation task stopped", || server.fake.live() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_is_cancelled_and_cut_off_while_others_keep_flowing() {
    let config = IngressConfig {
        stream_queue: 8,
        slow_client_timeout: Duration::from_millis(100),
        ..IngressConfig::default()
    };
    let firehose = FakeModel::new("firehose", u32::MAX);
    let server = serve(vec![firehose, slow_model("steady", 2)], config).await;

    // A raw client with a tiny receive window that reads the headers and then stops.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stuck = socket.connect(server.addr).await.unwrap();
    let body = chat("firehose", 50_000_000, true).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        server.addr,
        body.len()
    );
    stuck.write_all(head.as_bytes()).await.unwrap();
    stuck.write_all(body.as_bytes()).await.unwrap();
    let mut first = vec![0u8; 512];
    let n = stuck.read(&mut first).await.unwrap();
    assert!(
        std::str::from_utf8(&first[..n])
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );

    eventually("the stuck request is submitted", || {
        !server.fake.submitted().is_empty()
    })
    .await;
    let stuck_id = server.fake.submitted()[0].id.as_str().to_owned();

    // Another client keeps being served while the stuck one fills its queue.
    let c = client();
    let resp = c
        .post(server.url("/v1/chat/completions"))
        .json(&chat("steady", 50, true))
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    assert!(sse_events(&text).last().unwrap() == "[DONE]");

    eventually("the slow client's request is cancelled", || {
        cancels_of(&server, &stuck_id) == 1
    })
    .await;
    eventually("its generation stopped", || server.fake.live() == 0).await;
    let slow = server.metrics.value(
        "den_ingress_requests_total",
        &[("endpoint", "chat_completions"), ("outcome", "slow_client")],
    );
    assert_eq!(slow, 1.0);

    // When the stuck client finally reads, the stream is cut: no [DONE], no clean end of
    // the chunked body.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match stuck.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => rest.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the connection was closed");
    let rest = String::from_utf8_lossy(&rest);
    assert!(!rest.contains("[DONE]"));
    assert!(
        !rest.ends_with("\r\n0\r\n\r\n"),
        "the chunked body must not end cleanly"
    );
    assert_eq!(cancels_of(&server, &stuck_id), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_after_the_first_delta_is_an_error_frame_then_done() {
    let flaky = FakeModel::new("flaky", 4096).with(Behaviour {
        fail_after: Some(3),
        ..Behaviour::default()
    });
    let server = serve(vec![flaky], IngressConfig::default()).await;
    let c = client();
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let body = c
            .post(server.url(path))
            .json(
                &json!({"model": "flaky", "messages": [{"role": "user", "content": "x"}],
                "prompt": "x", "max_tokens": 10, "stream": true,
                "stream_options": {"include_usage": true}}),
            )
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let events = sse_events(&body);
        let n = events.len();
        assert_eq!(events[n - 1], "[DONE]", "{path}");
        let error: Value = serde_json::from_str(&events[n - 2]).unwrap();
        assert_eq!(error["error"]["code"], "worker_failed");
        assert_eq!(error["error"]["type"], "server_error");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("3 streamed token")
        );
        let content = events[..n - 2]
            .iter()
            .map(|e| serde_json::from_str::<Value>(e).unwrap())
            .filter(|c| c["choices"][0].get("finish_reason").is_some())
            .filter(|c| c["choices"][0]["delta"].get("role").is_none())
            .count();
        assert_eq!(content, 3, "{path}: three deltas before the error");
    }
    let resp = c
        .post(server.url("/v1/chat/completions"))
        .json(&chat("flaky", 10, false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "worker_failed");
    assert!(
        server.fake.cancels().is_empty(),
        "a failed request is not cancelled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_side_cancel_ends_the_stream_with_an_error_frame() {
    let server = serve(vec![slow_model("slow", 5)], IngressConfig::default()).await;
    let c = client();
    let mut resp = c
        .post(server.url("/v1/chat/completions"))
        .json(&chat("slow", 1000, true))
        .send()
        .await
        .unwrap();
    resp.chunk().await.unwrap().unwrap();
    let id = server.fake.submitted()[0].id.clone();
    // The router (operator, shutdown) cancels; the client is still connected.
    server.fake.cancel(&id);
    let mut body = String::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        body.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let events = sse_events(&body);
    let n = events.len();
    assert_eq!(events[n - 1], "[DONE]");
    let error: Value = serde_json::from_str(&events[n - 2]).unwrap();
    assert_eq!(error["error"]["code"], "request_cancelled");
    assert_eq!(
        server.fake.cancels().get(&RequestId::new(id.as_str())),
        Some(&1),
        "the ingress does not cancel again"
    );
}
