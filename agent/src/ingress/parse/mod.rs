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

mod chat;
mod completion;
#[cfg(test)]
mod tests;

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
    chat::refuse_unsupported(obj)?;
    let messages = chat::messages(obj)?;
    Ok(ChatRequest { common, messages })
}

/// Parse a completions body (already valid JSON).
pub fn completion(body: &Value) -> Result<CompletionRequest, ApiError> {
    let obj = object(body)?;
    let common = common(obj)?;
    completion::refuse_unsupported(obj)?;
    let prompt = completion::prompt(obj)?;
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
    // vLLM's extensions: `top_k` (-1 or 0: all), `stop_token_ids`, `ignore_eos`.
    let top_k = match get(obj, "top_k") {
        None => None,
        Some(Value::Number(n)) if n.as_i64() == Some(-1) => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|k| k <= u64::from(u32::MAX)) => {
            n.as_u64().and_then(|k| u32::try_from(k).ok())
        }
        Some(v) => return Err(wrong_type("top_k", "-1 or a non-negative integer", v)),
    };
    let stop_token_ids = match get(obj, "stop_token_ids") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(
                |(i, v)| match v.as_u64().and_then(|t| Token::try_from(t).ok()) {
                    Some(t) => Ok(t),
                    None => Err(wrong_type(&format!("stop_token_ids[{i}]"), "a token id", v)),
                },
            )
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(wrong_type("stop_token_ids", "an array of token ids", v)),
    };
    let ignore_eos = optional_bool(obj, "ignore_eos")?.unwrap_or(false);
    let seed = match get(obj, "seed") {
        None => None,
        // A negative seed keeps its bit pattern.
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
            top_k,
            stop,
            stop_token_ids,
            ignore_eos,
            seed,
        },
    })
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
