//! `POST /tokenize` and `POST /detokenize`, in the shape vLLM serves them.
//!
//! - `/tokenize`: `{"model", "prompt", "add_special_tokens"?}` (default true: BOS as the
//!   model asks) or `{"model", "messages", "add_generation_prompt"?}` (the chat template,
//!   exactly the tokens `/v1/chat/completions` would submit) → `{"tokens", "count",
//!   "max_model_len"}`.
//! - `/detokenize`: `{"model", "tokens"}` → `{"prompt"}` (special tokens written out).
//!
//! Errors are the ingress's OpenAI envelope; an unknown model is 404, a token outside the
//! vocabulary 400.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use den_protocol::request::Token;

use super::error::ApiError;
use super::parse::{self, Prompt};
use super::{Ingress, TextModel, body, exchange, model_ids};
use crate::serving::ServedModel;

pub(super) async fn tokenize(State(ingress): State<Arc<Ingress>>, request: Request) -> Response {
    answer(&ingress, "tokenize", request, |text, model, obj| {
        let tokens = match tokenize_body(obj)? {
            TokenizeBody::Chat(chat) => text.chat_tokens(&chat.messages)?,
            TokenizeBody::Prompt {
                prompt,
                add_special_tokens,
            } => text.tokenize(&prompt, add_special_tokens)?,
        };
        Ok(json!({
            "tokens": tokens,
            "count": tokens.len(),
            "max_model_len": model.max_context,
        }))
    })
    .await
}

pub(super) async fn detokenize(State(ingress): State<Arc<Ingress>>, request: Request) -> Response {
    answer(&ingress, "detokenize", request, |text, _, obj| {
        let tokens = detokenize_body(obj)?;
        // Checked against the vocabulary the same way a completions prompt is.
        text.prompt_tokens(&Prompt::Tokens(tokens.clone()))?;
        Ok(json!({"prompt": text.detokenize(&tokens)}))
    })
    .await
}

/// What a `/tokenize` body asks for.
#[derive(Debug)]
pub enum TokenizeBody {
    /// `messages`: the chat template's tokens, as `/v1/chat/completions` submits them.
    Chat(parse::ChatRequest),
    Prompt {
        prompt: String,
        add_special_tokens: bool,
    },
}

/// A `/tokenize` body (the object, `model` already read) as what it asks for.
pub fn tokenize_body(obj: &Map<String, Value>) -> Result<TokenizeBody, ApiError> {
    if obj.contains_key("messages") {
        let add_generation_prompt = match obj.get("add_generation_prompt") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid("add_generation_prompt", "a boolean")),
        };
        if !add_generation_prompt {
            return Err(ApiError::invalid(
                "add_generation_prompt",
                "unsupported_value",
                "`add_generation_prompt` false is not supported: den tokenizes chats as it submits them",
            ));
        }
        return Ok(TokenizeBody::Chat(parse::chat(&Value::Object(
            obj.clone(),
        ))?));
    }
    let add_special_tokens = match obj.get("add_special_tokens") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("add_special_tokens", "a boolean")),
    };
    match obj.get("prompt") {
        Some(Value::String(s)) => Ok(TokenizeBody::Prompt {
            prompt: s.clone(),
            add_special_tokens,
        }),
        _ => Err(invalid("prompt", "a string (or give `messages`)")),
    }
}

/// A `/detokenize` body's token ids.
pub fn detokenize_body(obj: &Map<String, Value>) -> Result<Vec<Token>, ApiError> {
    match obj.get("tokens") {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .and_then(|t| Token::try_from(t).ok())
                    .ok_or_else(|| invalid(&format!("tokens[{i}]"), "a token id"))
            })
            .collect(),
        _ => Err(invalid("tokens", "an array of token ids")),
    }
}

fn invalid(param: &str, expected: &str) -> ApiError {
    ApiError::invalid(
        param,
        "invalid_type",
        format!("`{param}` must be {expected}"),
    )
}

/// Authorizes, reads the body, finds the model and its text side, and answers with what
/// `f` makes of them.
async fn answer(
    ingress: &Ingress,
    endpoint: &'static str,
    request: Request,
    f: impl FnOnce(&TextModel, &ServedModel, &Map<String, Value>) -> Result<Value, ApiError>,
) -> Response {
    let metrics = &ingress.config.metrics;
    let (parts, body) = request.into_parts();
    if let Err(e) = ingress.authorize(&parts.headers) {
        exchange::count_request(metrics, endpoint, "unauthorized");
        return e.into_response();
    }
    let result = async {
        let value = body::read_json(&parts.headers, body, ingress.config.max_body_bytes).await?;
        let Value::Object(obj) = value else {
            return Err(ApiError::bad_request(
                "invalid_type",
                "the request body must be a JSON object",
            ));
        };
        let name = match obj.get("model") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            _ => {
                return Err(ApiError::invalid(
                    "model",
                    "missing_required_parameter",
                    "`model` is required: name one of the models listed by GET /v1/models",
                ));
            }
        };
        let models = ingress.submitter.models();
        let model = models
            .iter()
            .find(|m| m.id == name)
            .ok_or_else(|| ApiError::model_not_found(&name, &model_ids(&models)))?;
        let text = ingress.config.text_models.get(&model.fingerprint)?;
        f(&text, model, &obj)
    }
    .await;
    match result {
        Ok(v) => {
            exchange::count_request(metrics, endpoint, "ok");
            exchange::json_response(StatusCode::OK, serde_json::to_vec(&v).unwrap_or_default())
        }
        Err(e) => {
            exchange::count_request(metrics, endpoint, "invalid_request");
            e.into_response()
        }
    }
}
