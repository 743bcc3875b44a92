//! `prompt` and the completions-only fields.

use serde_json::{Map, Value};

use den_protocol::request::Token;

use super::{ApiError, Prompt, get, truthy, unsupported, wrong_type};

pub(super) fn prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
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

pub(super) fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
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
