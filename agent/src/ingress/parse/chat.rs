//! `messages` for chat completions.

use serde_json::{Map, Value};

use super::{ApiError, Message, Role, get, truthy, unsupported, wrong_type};

pub(super) fn messages(obj: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
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
pub(super) fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
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
