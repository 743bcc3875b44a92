//! Request bodies parsed at the edge into typed values.
//!
//! Parsing goes field by field over the JSON object rather than through a serde derive,
//! so every refusal names the field at fault (`messages[1].content[0].type`) and says what
//! was expected, in one line. Unknown fields are ignored (clients send many optional
//! fields); known fields that would change the answer but are not implemented (`n > 1`,
//! `echo`, `logprobs`, `tools`, non-text `response_format`) are refused rather than
//! silently dropped. A JSON `null` counts as "not given" for every optional field.

use serde_json::{Map, Value};

use den_protocol::request::{Sampling, Token};

use super::error::ApiError;

/// A parsed `POST /v1/chat/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub common: Common,
    /// Non-empty.
    pub messages: Vec<Message>,
}

/// A parsed `POST /v1/completions` body.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub common: Common,
    pub prompt: Prompt,
}

/// Fields both endpoints share.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// The public model id, not yet resolved.
    pub model: String,
    /// `max_completion_tokens`, else `max_tokens`; `None` when neither was given.
    pub max_tokens: Option<u32>,
    /// Which of the two names was given, for error messages.
    pub max_tokens_param: &'static str,
    pub stream: bool,
    /// `stream_options.include_usage` (ignored when not streaming).
    pub include_usage: bool,
    /// Validated and carried, but not applied: decoding is greedy.
    pub sampling: Sampling,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    /// Text parts joined in order; `""` for an assistant message with null content.
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// A completions prompt: text to tokenize, or token ids given directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<Token>),
}

/// Parse a chat completions body (already valid JSON).
pub fn chat(body: &Value) -> Result<ChatRequest, ApiError> {
    let obj = object(body)?;
    let common = common(obj)?;
    refuse_unsupported_chat(obj)?;
    let messages = messages(obj)?;
    Ok(ChatRequest { common, messages })
}

/// Parse a completions body (already valid JSON).
pub fn completion(body: &Value) -> Result<CompletionRequest, ApiError> {
    let obj = object(body)?;
    let common = common(obj)?;
    refuse_unsupported_completion(obj)?;
    let prompt = prompt(obj)?;
    Ok(CompletionRequest { common, prompt })
}

fn object(body: &Value) -> Result<&Map<String, Value>, ApiError> {
    body.as_object().ok_or_else(|| {
        ApiError::bad_request(
            "invalid_type",
            format!(
                "the request body must be a JSON object, got {}",
                type_name(body)
            ),
        )
    })
}

fn common(obj: &Map<String, Value>) -> Result<Common, ApiError> {
    let model = match get(obj, "model") {
        None => {
            return Err(ApiError::invalid(
                "model",
                "missing_required_parameter",
                "`model` is required: name one of the models listed by GET /v1/models",
            ));
        }
        Some(Value::String(s)) if s.trim().is_empty() => {
            return Err(ApiError::invalid(
                "model",
                "invalid_value",
                "`model` is empty: name one of the models listed by GET /v1/models",
            ));
        }
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(wrong_type("model", "a string", v)),
    };

    let (max_tokens_param, max_tokens) = match get(obj, "max_completion_tokens") {
        Some(v) => (
            "max_completion_tokens",
            Some(positive_u32("max_completion_tokens", v)?),
        ),
        None => match get(obj, "max_tokens") {
            Some(v) => ("max_tokens", Some(positive_u32("max_tokens", v)?)),
            None => ("max_tokens", None),
        },
    };

    let stream = optional_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match get(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => match get(o, "include_usage") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(wrong_type("stream_options.include_usage", "a boolean", v)),
        },
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };

    let temperature = optional_number(obj, "temperature")?;
    if let Some(t) = temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(ApiError::invalid(
            "temperature",
            "invalid_value",
            format!("`temperature` must be between 0 and 2, got {t}"),
        ));
    }
    let top_p = optional_number(obj, "top_p")?;
    if let Some(p) = top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(ApiError::invalid(
            "top_p",
            "invalid_value",
            format!("`top_p` must be greater than 0 and at most 1, got {p}"),
        ));
    }
    let stop = stop(obj)?;
    let seed = match get(obj, "seed") {
        None => None,
        // Seeds are carried, not applied; a negative seed keeps its bit pattern.
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {
            n.as_u64().or_else(|| n.as_i64().map(|i| i as u64))
        }
        Some(v) => return Err(wrong_type("seed", "an integer", v)),
    };

    match get(obj, "n") {
        None => {}
        Some(Value::Number(n)) if n.as_u64() == Some(1) => {}
        Some(Value::Number(n)) => {
            return Err(ApiError::invalid(
                "n",
                "unsupported_value",
                format!("`n` must be 1 (one choice per request is supported), got {n}"),
            ));
        }
        Some(v) => return Err(wrong_type("n", "the integer 1", v)),
    }
    match get(obj, "user") {
        None | Some(Value::String(_)) => {}
        Some(v) => return Err(wrong_type("user", "a string", v)),
    }

    Ok(Common {
        model,
        max_tokens,
        max_tokens_param,
        stream,
        include_usage,
        sampling: Sampling {
            temperature,
            top_p,
            stop,
            seed,
        },
    })
}

fn messages(obj: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let list = match get(obj, "messages") {
        None => {
            return Err(ApiError::invalid(
                "messages",
                "missing_required_parameter",
                "`messages` is required: send a non-empty array of {role, content} objects",
            ));
        }
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("messages", "an array of message objects", v)),
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "invalid_value",
            "`messages` is empty: send at least one message",
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect()
}

fn message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let m = m
        .as_object()
        .ok_or_else(|| wrong_type(&format!("messages[{i}]"), "a message object", m))?;
    let role = match get(m, "role") {
        None => {
            return Err(ApiError::invalid(
                at("role"),
                "missing_required_parameter",
                format!(
                    "`{}` is required: one of system, developer, user, assistant",
                    at("role")
                ),
            ));
        }
        Some(Value::String(s)) => match s.as_str() {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            other => {
                return Err(ApiError::invalid(
                    at("role"),
                    "invalid_value",
                    format!(
                        "`{}` must be one of system, developer, user, assistant, got {other:?}",
                        at("role")
                    ),
                ));
            }
        },
        Some(v) => return Err(wrong_type(&at("role"), "a string", v)),
    };
    let content = match get(m, "content") {
        // An assistant turn that only carried tool calls has null content.
        None if role == Role::Assistant => String::new(),
        None => {
            return Err(ApiError::invalid(
                at("content"),
                "missing_required_parameter",
                format!(
                    "`{}` is required: a string or an array of text parts",
                    at("content")
                ),
            ));
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(&at("content"), parts)?,
        Some(v) => {
            return Err(wrong_type(
                &at("content"),
                "a string or an array of text parts",
                v,
            ));
        }
    };
    Ok(Message { role, content })
}

fn text_parts(at: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let p = part
            .as_object()
            .ok_or_else(|| wrong_type(&here, "a content part object", part))?;
        match get(p, "type") {
            Some(Value::String(t)) if t == "text" => {}
            Some(Value::String(t)) => {
                return Err(ApiError::invalid(
                    format!("{here}.type"),
                    "unsupported_value",
                    format!("`{here}.type` is {t:?}: only text content parts are supported"),
                ));
            }
            Some(v) => {
                return Err(wrong_type(
                    &format!("{here}.type"),
                    "the string \"text\"",
                    v,
                ));
            }
            None => {
                return Err(ApiError::invalid(
                    format!("{here}.type"),
                    "missing_required_parameter",
                    format!("`{here}.type` is required: \"text\""),
                ));
            }
        }
        match get(p, "text") {
            Some(Value::String(s)) => text.push_str(s),
            Some(v) => return Err(wrong_type(&format!("{here}.text"), "a string", v)),
            None => {
                return Err(ApiError::invalid(
                    format!("{here}.text"),
                    "missing_required_parameter",
                    format!("`{here}.text` is required for a text part"),
                ));
            }
        }
    }
    Ok(text)
}

/// `prompt`: a string, token ids, or a one-element array of either. Batches (several
/// prompts in one request) are refused: send one prompt per request.
fn prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let v = get(obj, "prompt").ok_or_else(|| {
        ApiError::invalid(
            "prompt",
            "missing_required_parameter",
            "`prompt` is required: a string (or an array of token ids)",
        )
    })?;
    let prompt = match v {
        Value::String(s) => Prompt::Text(s.clone()),
        Value::Array(items) => match items.as_slice() {
            [] => {
                return Err(ApiError::invalid(
                    "prompt",
                    "invalid_value",
                    "`prompt` is an empty array: send a string or at least one token id",
                ));
            }
            [Value::String(s)] => Prompt::Text(s.clone()),
            [Value::Array(ids)] => Prompt::Tokens(token_ids("prompt[0]", ids)?),
            [Value::Number(_), ..] => Prompt::Tokens(token_ids("prompt", items)?),
            [Value::String(_) | Value::Array(_), _, ..] => {
                return Err(ApiError::invalid(
                    "prompt",
                    "unsupported_value",
                    format!(
                        "`prompt` holds {} prompts: batches are not supported, send one prompt per request",
                        items.len()
                    ),
                ));
            }
            [first, ..] => return Err(wrong_type("prompt[0]", "a string or a token id", first)),
        },
        v => return Err(wrong_type("prompt", "a string or an array of token ids", v)),
    };
    let empty = match &prompt {
        Prompt::Text(s) => s.is_empty(),
        Prompt::Tokens(t) => t.is_empty(),
    };
    if empty {
        return Err(ApiError::invalid(
            "prompt",
            "invalid_value",
            "`prompt` is empty: a completion needs at least one prompt token",
        ));
    }
    Ok(prompt)
}

fn token_ids(at: &str, ids: &[Value]) -> Result<Vec<Token>, ApiError> {
    ids.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|n| Token::try_from(n).ok())
                .ok_or_else(|| {
                    wrong_type(
                        &format!("{at}[{i}]"),
                        "a token id (an integer from 0 to 4294967295)",
                        v,
                    )
                })
        })
        .collect()
}

fn stop(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    match get(obj, "stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                v => Err(wrong_type(&format!("stop[{i}]"), "a string", v)),
            })
            .collect(),
        Some(v) => Err(wrong_type("stop", "a string or an array of strings", v)),
    }
}

fn refuse_unsupported_chat(obj: &Map<String, Value>) -> Result<(), ApiError> {
    if truthy(get(obj, "logprobs")) {
        return Err(unsupported(
            "logprobs",
            "log probabilities are not supported",
        ));
    }
    for field in ["tools", "functions"] {
        if let Some(Value::Array(a)) = get(obj, field)
            && !a.is_empty()
        {
            return Err(unsupported(
                field,
                "tool and function calling are not supported",
            ));
        }
    }
    if let Some(v) = get(obj, "response_format") {
        let text = v.get("type").and_then(Value::as_str) == Some("text");
        if !text {
            return Err(unsupported(
                "response_format",
                "only {\"type\": \"text\"} is supported (no JSON mode or structured output)",
            ));
        }
    }
    Ok(())
}

fn refuse_unsupported_completion(obj: &Map<String, Value>) -> Result<(), ApiError> {
    if truthy(get(obj, "logprobs")) {
        return Err(unsupported(
            "logprobs",
            "log probabilities are not supported",
        ));
    }
    if truthy(get(obj, "echo")) {
        return Err(unsupported("echo", "echoing the prompt is not supported"));
    }
    if let Some(Value::String(s)) = get(obj, "suffix")
        && !s.is_empty()
    {
        return Err(unsupported(
            "suffix",
            "suffixes (insertion) are not supported",
        ));
    }
    if let Some(v) = get(obj, "best_of")
        && v.as_u64() != Some(1)
    {
        return Err(unsupported("best_of", "`best_of` must be 1"));
    }
    Ok(())
}

fn unsupported(param: &str, why: &str) -> ApiError {
    ApiError::invalid(param, "unsupported_parameter", format!("`{param}`: {why}"))
}

/// `true`, or a non-zero number (completions' `logprobs` is an integer).
fn truthy(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        _ => false,
    }
}

fn positive_u32(param: &str, v: &Value) -> Result<u32, ApiError> {
    let n = match v {
        Value::Number(n) => n,
        v => return Err(wrong_type(param, "a positive integer", v)),
    };
    match (n.as_u64(), n.as_i64()) {
        (Some(0), _) | (None, Some(_)) => Err(ApiError::invalid(
            param,
            "invalid_value",
            format!("`{param}` must be at least 1, got {n}"),
        )),
        (Some(u), _) => u32::try_from(u).map_err(|_| {
            ApiError::invalid(
                param,
                "invalid_value",
                format!("`{param}` is {u}, more than any context can hold (at most 4294967295)"),
            )
        }),
        (None, None) => Err(wrong_type(param, "a positive integer", v)),
    }
}

fn optional_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match get(obj, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong_type(key, "a boolean", v)),
    }
}

fn optional_number(obj: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match get(obj, key) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(v) => Err(wrong_type(key, "a number", v)),
    }
}

/// A present, non-null field.
fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn wrong_type(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        param,
        "invalid_type",
        format!("`{param}` must be {expected}, got {}", type_name(got)),
    )
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(n) if n.is_i64() && n.as_i64().is_some_and(|i| i < 0) => "a negative integer",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
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
            "frequency_penalty": 0, "unknown_field": {"ignored": true},
        }))
        .unwrap();
        assert_eq!(r.common.model, "m");
        assert_eq!(r.common.max_tokens, Some(7));
        assert!(r.common.stream && r.common.include_usage);
        assert_eq!(r.common.sampling.stop, vec!["x".to_owned()]);
        assert_eq!(r.common.sampling.seed, Some(u64::MAX));
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
}
