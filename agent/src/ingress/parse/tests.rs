//! Parsing tests: accepted shapes and one refusal per field.

use serde_json::json;

use super::*;

fn chat_err(v: Value) -> ApiError {
    chat(&v).unwrap_err()
}

#[test]
fn parses_a_full_chat_request() {
    let r = chat(&json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "den"}]},
            {"role": "assistant", "content": null},
        ],
        "max_tokens": 7, "stream": true, "stream_options": {"include_usage": true},
        "temperature": 0.5, "top_p": 1, "stop": "x", "seed": -1, "n": 1, "user": "u",
        "top_k": 40, "stop_token_ids": [2, 7], "ignore_eos": true,
        "frequency_penalty": 0, "unknown_field": {"ignored": true},
    }))
    .unwrap();
    assert_eq!(r.common.model, "m");
    assert_eq!(r.common.max_tokens, Some(7));
    assert!(r.common.stream && r.common.include_usage);
    assert_eq!(r.common.sampling.stop, vec!["x".to_owned()]);
    assert_eq!(r.common.sampling.seed, Some(u64::MAX));
    assert_eq!(r.common.sampling.top_k, Some(40));
    assert_eq!(r.common.sampling.stop_token_ids, vec![2, 7]);
    assert!(r.common.sampling.ignore_eos);
    assert_eq!(r.messages.len(), 3);
    assert_eq!(r.messages[1].content, "hello den");
    assert_eq!(
        r.messages[2],
        Message {
            role: Role::Assistant,
            content: String::new()
        }
    );
}

#[test]
fn max_completion_tokens_wins_over_max_tokens() {
    let r = chat(
        &json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 3, "max_completion_tokens": 9}),
    )
    .unwrap();
    assert_eq!(
        (r.common.max_tokens, r.common.max_tokens_param),
        (Some(9), "max_completion_tokens")
    );
}

#[test]
fn every_refusal_names_its_field() {
    let user = json!([{"role": "user", "content": "x"}]);
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!([1]), "", "invalid_type"),
        (
            json!({"messages": user}),
            "model",
            "missing_required_parameter",
        ),
        (
            json!({"model": 3, "messages": user}),
            "model",
            "invalid_type",
        ),
        (
            json!({"model": "m"}),
            "messages",
            "missing_required_parameter",
        ),
        (
            json!({"model": "m", "messages": []}),
            "messages",
            "invalid_value",
        ),
        (
            json!({"model": "m", "messages": "hi"}),
            "messages",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role",
            "invalid_value",
        ),
        (
            json!({"model": "m", "messages": [{"content": "x"}]}),
            "messages[0].role",
            "missing_required_parameter",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user"}]}),
            "messages[0].content",
            "missing_required_parameter",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0].type",
            "unsupported_value",
        ),
        (
            json!({"model": "m", "messages": user, "max_tokens": 0}),
            "max_tokens",
            "invalid_value",
        ),
        (
            json!({"model": "m", "messages": user, "max_tokens": -4}),
            "max_tokens",
            "invalid_value",
        ),
        (
            json!({"model": "m", "messages": user, "max_tokens": 1.5}),
            "max_tokens",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": user, "max_completion_tokens": "9"}),
            "max_completion_tokens",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": user, "n": 2}),
            "n",
            "unsupported_value",
        ),
        (
            json!({"model": "m", "messages": user, "temperature": 2.5}),
            "temperature",
            "invalid_value",
        ),
        (
            json!({"model": "m", "messages": user, "top_p": 0}),
            "top_p",
            "invalid_value",
        ),
        (
            json!({"model": "m", "messages": user, "top_k": -2}),
            "top_k",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": user, "stop_token_ids": [-1]}),
            "stop_token_ids[0]",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": user, "stop": [1]}),
            "stop[0]",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": user, "stream": "yes"}),
            "stream",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": user, "stream_options": {"include_usage": 1}}),
            "stream_options.include_usage",
            "invalid_type",
        ),
        (
            json!({"model": "m", "messages": user, "tools": [{"type": "function"}]}),
            "tools",
            "unsupported_parameter",
        ),
        (
            json!({"model": "m", "messages": user, "response_format": {"type": "json_object"}}),
            "response_format",
            "unsupported_parameter",
        ),
    ];
    for (body, param, code) in cases {
        let e = chat_err(body.clone());
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(e.code, code, "{body}: {}", e.message);
        assert_eq!(e.param.as_deref().unwrap_or(""), param, "{body}");
        if !param.is_empty() {
            assert!(e.message.contains(param), "{body}: {}", e.message);
        }
        assert!(!e.message.contains('\n'));
    }
}

#[test]
fn completion_prompts_accept_text_and_token_ids_but_not_batches() {
    let p = |v: Value| completion(&json!({"model": "m", "prompt": v}));
    assert_eq!(p(json!("hi")).unwrap().prompt, Prompt::Text("hi".into()));
    assert_eq!(p(json!(["hi"])).unwrap().prompt, Prompt::Text("hi".into()));
    assert_eq!(p(json!([1, 2])).unwrap().prompt, Prompt::Tokens(vec![1, 2]));
    assert_eq!(p(json!([[3]])).unwrap().prompt, Prompt::Tokens(vec![3]));
    let batch = p(json!(["a", "b"])).unwrap_err();
    assert!(batch.message.contains("batches are not supported"));
    assert_eq!(p(json!("")).unwrap_err().code, "invalid_value");
    assert_eq!(
        p(json!([1, -2])).unwrap_err().param.as_deref(),
        Some("prompt[1]")
    );
    assert_eq!(p(json!({"a": 1})).unwrap_err().code, "invalid_type");
    let echo = completion(&json!({"model": "m", "prompt": "x", "echo": true})).unwrap_err();
    assert_eq!(echo.param.as_deref(), Some("echo"));
    assert!(
        completion(&json!({"model": "m"}))
            .unwrap_err()
            .message
            .contains("`prompt` is required")
    );
}
