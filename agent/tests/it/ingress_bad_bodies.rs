//! Malformed, oversized and otherwise bad HTTP bodies: each gets a clear 4xx in the
//! OpenAI envelope naming the problem, nothing is submitted, and a concurrent good
//! request is not disturbed.
//!
//! The submitter is `FakeSubmitter`, an in-process stand-in for the router runtime.

use crate::ingress_common;

use std::time::Duration;

use serde_json::{Value, json};

use den_agent::ingress::IngressConfig;
use den_agent::ingress::fake::{Behaviour, FakeModel};
use den_agent::ingress::parse::{Message, Role};
use den_agent::ingress::template;

use ingress_common::*;

struct Case {
    name: &'static str,
    path: &'static str,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
    /// Must appear in the message (the field or problem it names).
    names: &'static str,
}

fn case(name: &'static str, body: Value, code: &'static str, names: &'static str) -> Case {
    Case {
        name,
        path: "/v1/chat/completions",
        content_type: Some("application/json"),
        body: body.to_string().into_bytes(),
        status: 400,
        code,
        names,
    }
}

fn cases() -> Vec<Case> {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let mut big = json!({"model": "den-test", "messages": [{"role": "user", "content": "x".repeat(5 << 20)}]})
        .to_string()
        .into_bytes();
    big.shrink_to_fit();
    vec![
        Case {
            name: "invalid JSON",
            body: b"{\"model\": \"den-test\", \"messages\": [".to_vec(),
            ..case("", json!(null), "invalid_json", "not valid JSON")
        },
        Case {
            name: "empty body",
            body: Vec::new(),
            ..case("", json!(null), "invalid_json", "empty")
        },
        Case {
            name: "not UTF-8",
            body: vec![b'{', 0xFF, 0xFE, b'}'],
            ..case("", json!(null), "invalid_json", "not valid JSON")
        },
        case(
            "body is an array",
            json!([1, 2]),
            "invalid_type",
            "JSON object",
        ),
        case(
            "missing model",
            json!({"messages": msgs}),
            "missing_required_parameter",
            "model",
        ),
        case(
            "model of the wrong type",
            json!({"model": ["den-test"], "messages": msgs}),
            "invalid_type",
            "model",
        ),
        case(
            "messages of the wrong type",
            json!({"model": "den-test", "messages": "hi"}),
            "invalid_type",
            "messages",
        ),
        case(
            "empty messages",
            json!({"model": "den-test", "messages": []}),
            "invalid_value",
            "messages",
        ),
        case(
            "bad role",
            json!({"model": "den-test", "messages": [{"role": "robot", "content": "x"}]}),
            "invalid_value",
            "messages[0].role",
        ),
        case(
            "content of the wrong type",
            json!({"model": "den-test", "messages": [{"role": "user", "content": {"text": "x"}}]}),
            "invalid_type",
            "messages[0].content",
        ),
        case(
            "max_tokens 0",
            json!({"model": "den-test", "messages": msgs, "max_tokens": 0}),
            "invalid_value",
            "max_tokens",
        ),
        case(
            "max_tokens a string",
            json!({"model": "den-test", "messages": msgs, "max_tokens": "5"}),
            "invalid_type",
            "max_tokens",
        ),
        case(
            "n = 2",
            json!({"model": "den-test", "messages": msgs, "n": 2}),
            "unsupported_value",
            "`n`",
        ),
        case(
            "temperature out of range",
            json!({"model": "den-test", "messages": msgs, "temperature": 3}),
            "invalid_value",
            "temperature",
        ),
        case(
            "stream not a boolean",
            json!({"model": "den-test", "messages": msgs, "stream": 1}),
            "invalid_type",
            "stream",
        ),
        Case {
            path: "/v1/completions",
            ..case(
                "batch prompt",
                json!({"model": "den-test", "prompt": ["a", "b"]}),
                "unsupported_value",
                "batches",
            )
        },
        Case {
            path: "/v1/completions",
            ..case(
                "missing prompt",
                json!({"model": "den-test"}),
                "missing_required_parameter",
                "prompt",
            )
        },
        Case {
            name: "wrong content type",
            content_type: Some("text/plain"),
            ..case(
                "",
                json!({"model": "den-test", "messages": msgs}),
                "invalid_content_type",
                "Content-Type",
            )
        },
        Case {
            name: "form content type",
            content_type: Some("application/x-www-form-urlencoded"),
            ..case(
                "",
                json!({"model": "den-test", "messages": msgs}),
                "invalid_content_type",
                "application/json",
            )
        },
        Case {
            name: "missing content type",
            content_type: None,
            ..case(
                "",
                json!({"model": "den-test", "messages": msgs}),
                "invalid_content_type",
                "Content-Type is missing",
            )
        },
        Case {
            name: "oversized body",
            body: big,
            status: 413,
            ..case("", json!(null), "request_too_large", "larger than")
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_body_is_refused_clearly_and_a_good_request_is_undisturbed() {
    let slow = FakeModel::new("den-test", 4096).with(Behaviour {
        token_delay: Duration::from_millis(3),
        ..Behaviour::default()
    });
    let server = serve(vec![slow], IngressConfig::default()).await;
    let c = client();

    // A streamed good request that stays in flight while the bad ones arrive.
    let good = {
        let c = c.clone();
        let url = server.url("/v1/chat/completions");
        tokio::spawn(async move {
            let resp = c
                .post(url)
                .json(&json!({"model": "den-test", "messages": [{"role": "user", "content": "hello den"}],
                    "max_tokens": 150, "stream": true}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp.text().await.unwrap()
        })
    };
    eventually("the good request is submitted", || {
        server.fake.submitted().len() == 1
    })
    .await;

    let bad = cases().into_iter().map(|case| {
        let c = c.clone();
        let url = server.url(case.path);
        tokio::spawn(async move {
            let mut req = c.post(url).body(case.body);
            if let Some(ct) = case.content_type {
                req = req.header("content-type", ct);
            }
            let resp = req
                .send()
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert_eq!(resp.status().as_u16(), case.status, "{}", case.name);
            assert_eq!(
                resp.headers()["content-type"],
                "application/json",
                "{}",
                case.name
            );
            let v: Value = resp.json().await.unwrap();
            let e = &v["error"];
            assert_eq!(e["type"], "invalid_request_error", "{}", case.name);
            assert_eq!(e["code"], case.code, "{}: {e}", case.name);
            let msg = e["message"].as_str().unwrap();
            assert!(
                msg.contains(case.names),
                "{}: {msg:?} should name {:?}",
                case.name,
                case.names
            );
            assert!(!msg.contains('\n'), "{}: one line", case.name);
        })
    });
    for task in bad.collect::<Vec<_>>() {
        task.await.unwrap();
    }

    let body = good.await.unwrap();
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let text: String = events[1..events.len() - 2]
        .iter()
        .map(|e| {
            let c: Value = serde_json::from_str(e).unwrap();
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let prompt = template::chat_tokens(&[Message {
        role: Role::User,
        content: "hello den".into(),
    }]);
    assert_eq!(text, expected_text("den-test", &prompt, 150));
    // Only the good request reached the router; nothing was cancelled.
    assert_eq!(server.fake.submitted().len(), 1);
    assert!(server.fake.cancels().is_empty());
    let invalid = server.metrics.value(
        "den_ingress_requests_total",
        &[
            ("endpoint", "chat_completions"),
            ("outcome", "invalid_request"),
        ],
    ) + server.metrics.value(
        "den_ingress_requests_total",
        &[("endpoint", "completions"), ("outcome", "invalid_request")],
    );
    assert_eq!(invalid as usize, cases().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_limit_is_configurable_and_the_connection_recovers() {
    let config = IngressConfig {
        max_body_bytes: 1024,
        ..IngressConfig::default()
    };
    let server = serve(vec![model()], config).await;
    let c = client();
    let long = "the ".repeat(400);
    let resp = c
        .post(server.url("/v1/completions"))
        .json(&json!({"model": "den-test", "prompt": long}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1024 bytes")
    );
    // The same client (and pool) still works.
    let ok = c
        .post(server.url("/v1/completions"))
        .json(&json!({"model": "den-test", "prompt": "the", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(server.fake.submitted().len(), 1);
}
