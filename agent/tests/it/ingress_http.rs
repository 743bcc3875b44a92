//! The OpenAI ingress over real HTTP: non-streamed and streamed chat and completions,
//! exact SSE framing, usage and cached tokens, models, auth, and routing errors.
//!
//! The submitter behind the ingress is `FakeSubmitter`, an in-process stand-in for the
//! router runtime (which merges separately); see `ingress_common`.

use crate::ingress_common;

use std::time::Duration;

use serde_json::{Value, json};

use den_agent::auth;
use den_agent::engine;
use den_agent::ingress::IngressConfig;
use den_agent::ingress::fake::{Behaviour, FakeModel};
use den_agent::ingress::parse::{Message, Role};
use den_agent::ingress::template;
use den_protocol::router::{NoFeasible, RouterError};

use ingress_common::*;

fn user(text: &str) -> Vec<Message> {
    vec![Message {
        role: Role::User,
        content: text.into(),
    }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_not_streamed_returns_the_engine_output_and_usage() {
    let server = serve(vec![model()], IngressConfig::default()).await;
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&json!({"model": "den-test", "messages": [{"role": "user", "content": "hello den"}], "max_tokens": 12}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let v: Value = resp.json().await.unwrap();
    let prompt = template::chat_tokens(&user("hello den"));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], "den-test");
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        expected_text("den-test", &prompt, 12)
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["usage"]["total_tokens"], prompt.len() + 12);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // What reached the router: the templated tokens, the model's fingerprint, the limit,
    // under the id the client saw.
    let submitted = server.fake.submitted();
    assert_eq!(submitted.len(), 1);
    assert_eq!(submitted[0].tokens, prompt);
    assert_eq!(submitted[0].model.as_str(), "fp-den-test");
    assert_eq!(submitted[0].max_new_tokens, 12);
    assert_eq!(submitted[0].id.as_str(), v["id"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streamed_frames_chunks_usage_and_done_exactly() {
    let server = serve(vec![model()], IngressConfig::default()).await;
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&json!({"model": "den-test", "messages": [{"role": "user", "content": "hello den"}],
            "max_completion_tokens": 20, "stream": true, "stream_options": {"include_usage": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["cache-control"], "no-cache");
    let body = resp.text().await.unwrap();
    let events = sse_events(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let id = chunks[0]["id"].as_str().unwrap().to_owned();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], id.as_str());
        assert_eq!(c["model"], "den-test");
        assert!(
            c.get("usage").is_some(),
            "include_usage: every chunk has usage"
        );
    }
    // First: the role. Then one chunk per token. Then the finish. Then usage.
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let n = chunks.len();
    let finish = &chunks[n - 2];
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[n - 1];
    assert_eq!(usage["choices"], json!([]));
    let prompt = template::chat_tokens(&user("hello den"));
    assert_eq!(usage["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(usage["usage"]["completion_tokens"], 20);
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let deltas = &chunks[1..n - 2];
    assert_eq!(deltas.len(), 20, "one chunk per (word) token");
    let text: String = deltas
        .iter()
        .map(|c| {
            assert!(c["choices"][0]["finish_reason"].is_null());
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(text, expected_text("den-test", &prompt, 20));
    assert!(
        server.fake.cancels().is_empty(),
        "a finished stream is not cancelled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_without_include_usage_has_no_usage_chunk() {
    let server = serve(vec![model()], IngressConfig::default()).await;
    let body = client()
        .post(server.url("/v1/chat/completions"))
        .json(
            &json!({"model": "den-test", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3, "stream": true}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = sse_events(&body);
    // role, 3 deltas, finish, [DONE]
    assert_eq!(events.len(), 6, "{body}");
    for e in &events[..5] {
        let c: Value = serde_json::from_str(e).unwrap();
        assert!(c.get("usage").is_none());
        assert_eq!(c["choices"].as_array().unwrap().len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_streamed_and_not_streamed_agree() {
    let server = serve(vec![model()], IngressConfig::default()).await;
    let c = client();
    let plain: Value = c
        .post(server.url("/v1/completions"))
        .json(&json!({"model": "den-test", "prompt": "the cache of the page", "max_tokens": 16}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let prompt = engine::tokenize("the cache of the page");
    let want = expected_text("den-test", &prompt, 16);
    assert_eq!(plain["object"], "text_completion");
    assert!(plain["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(plain["choices"][0]["text"], want.as_str());
    assert_eq!(plain["choices"][0]["finish_reason"], "length");
    assert_eq!(plain["usage"]["prompt_tokens"], prompt.len());

    let body = c
        .post(server.url("/v1/completions"))
        .json(
            &json!({"model": "den-test", "prompt": "the cache of the page", "max_tokens": 16,
            "stream": true, "stream_options": {"include_usage": true}}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let n = chunks.len();
    let text: String = chunks[..n - 2]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, want);
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    // The second identical prompt reuses everything but the pending last token.
    assert_eq!(
        chunks[n - 1]["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt.len() - 1
    );

    // Token-id prompts go through untokenized.
    let ids: Value = c
        .post(server.url("/v1/completions"))
        .json(&json!({"model": "den-test", "prompt": [5, 6, 7], "max_tokens": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        ids["choices"][0]["text"],
        expected_text("den-test", &[5, 6, 7], 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_tokens_are_the_workers_actual_reuse() {
    let server = serve(vec![model()], IngressConfig::default()).await;
    let c = client();
    let first = vec![
        Message {
            role: Role::System,
            content: "you answer about the cache".into(),
        },
        Message {
            role: Role::User,
            content: "what is a page".into(),
        },
    ];
    let mut second = first.clone();
    second.push(Message {
        role: Role::Assistant,
        content: "a page is a chunk".into(),
    });
    second.push(Message {
        role: Role::User,
        content: "and a route".into(),
    });
    let as_json = |m: &[Message]| -> Vec<Value> {
        m.iter()
            .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
            .collect()
    };
    let mut cached = Vec::new();
    for msgs in [&first, &second] {
        let v: Value = c
            .post(server.url("/v1/chat/completions"))
            .json(&json!({"model": "den-test", "messages": as_json(msgs), "max_tokens": 4}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        cached.push(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    // The fake reports the longest prefix shared with an earlier prompt, as a worker
    // reports what it actually restored; the ingress must surface exactly that.
    let a = template::chat_tokens(&first);
    let b = template::chat_tokens(&second);
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count() as u64;
    assert_eq!(cached, vec![0, shared]);
    assert!(shared > 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_model_is_404_and_nothing_is_submitted() {
    let server = serve(vec![model()], IngressConfig::default()).await;
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}),
        ),
        (
            "/v1/completions",
            json!({"model": "gpt-4o", "prompt": "x", "stream": true}),
        ),
    ] {
        let resp = client()
            .post(server.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("gpt-4o") && msg.contains("den-test"), "{msg}");
    }
    assert!(server.fake.submitted().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_limits_refuse_or_lower_the_default() {
    let server = serve(vec![FakeModel::new("small", 40)], IngressConfig::default()).await;
    let c = client();
    let resp = c
        .post(server.url("/v1/completions"))
        .json(&json!({"model": "small", "prompt": "the cache", "max_tokens": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "max_tokens");
    assert!(server.fake.submitted().is_empty());

    // Without max_tokens the default (256) is lowered to what fits.
    let v: Value = c
        .post(server.url("/v1/completions"))
        .json(&json!({"model": "small", "prompt": "the cache"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 38);
    assert_eq!(v["usage"]["total_tokens"], 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_listed_and_retrievable() {
    let server = serve(
        vec![model(), FakeModel::new("org/other", 128)],
        IngressConfig::default(),
    )
    .await;
    let c = client();
    let v: Value = c
        .get(server.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["den-test", "org/other"]);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["owned_by"], "den");
    let one: Value = c
        .get(server.url("/v1/models/org/other"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(one["id"], "org/other");
    assert_eq!(one["max_model_len"], 128);
    let missing = c.get(server.url("/v1/models/nope")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    let v: Value = missing.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_and_methods_get_the_envelope() {
    let server = serve(vec![model()], IngressConfig::default()).await;
    let c = client();
    let resp = c
        .post(server.url("/v1/embeddings"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "unknown_url");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/embeddings")
    );
    let resp = c
        .get(server.url("/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(resp.headers()["allow"], "POST");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "method_not_allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_token_is_required() {
    let config = IngressConfig {
        token: auth::Token::new("s3cret"),
        ..IngressConfig::default()
    };
    let server = serve(vec![model()], config).await;
    let c = client();
    let body = json!({"model": "den-test", "prompt": "x", "max_tokens": 1});
    for auth in [None, Some("Bearer wrong"), Some("s3cret")] {
        let mut req = c.post(server.url("/v1/completions")).json(&body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert!(!v["error"]["message"].as_str().unwrap().contains("s3cret"));
    }
    assert_eq!(
        c.get(server.url("/v1/models"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert!(server.fake.submitted().is_empty());
    let ok = c
        .post(server.url("/v1/completions"))
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_errors_before_the_first_token_are_http_errors() {
    let refuse = |summary_candidates| RouterError::NoFeasibleWorker {
        summary: NoFeasible {
            candidates: summary_candidates,
            infeasible: vec![],
            attempts: 2,
            last: None,
        },
    };
    let server = serve(
        vec![
            FakeModel::new("full", 4096).with(Behaviour {
                refuse: Some(refuse(3)),
                ..Behaviour::default()
            }),
            FakeModel::new("late", 4096).with(Behaviour {
                refuse: Some(RouterError::DeadlineExceeded {
                    deadline: den_protocol::time::Millis(9),
                }),
                first_token_delay: Duration::from_millis(5),
                ..Behaviour::default()
            }),
        ],
        IngressConfig::default(),
    )
    .await;
    for (model, status, code) in [
        ("full", 503, "no_feasible_worker"),
        ("late", 504, "deadline_exceeded"),
    ] {
        for stream in [false, true] {
            let resp = client()
                .post(server.url("/v1/chat/completions"))
                .json(&json!({"model": model, "messages": [{"role": "user", "content": "x"}], "stream": stream}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), status, "{model} stream={stream}");
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["code"], code);
            assert_eq!(v["error"]["type"], "server_error");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_outcomes_and_latencies() {
    let server = serve(vec![model()], IngressConfig::default()).await;
    let c = client();
    for stream in [false, true] {
        c.post(server.url("/v1/chat/completions"))
            .json(&json!({"model": "den-test", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "stream": stream}))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
    }
    c.post(server.url("/v1/chat/completions"))
        .json(&json!({"model": "den-test", "messages": []}))
        .send()
        .await
        .unwrap();
    let m = &server.metrics;
    let completed = m.value(
        "den_ingress_requests_total",
        &[("endpoint", "chat_completions"), ("outcome", "completed")],
    );
    assert_eq!(completed, 2.0);
    let invalid = m.value(
        "den_ingress_requests_total",
        &[
            ("endpoint", "chat_completions"),
            ("outcome", "invalid_request"),
        ],
    );
    assert_eq!(invalid, 1.0);
    let text = m.render();
    assert!(
        text.contains("den_ingress_ttft_ms_count{endpoint=\"chat_completions\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("den_ingress_inter_token_ms_count{endpoint=\"chat_completions\"} 8"),
        "{text}"
    );
}
