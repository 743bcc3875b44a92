//! `POST /v1/generate`: den's native generation endpoint, below the OpenAI ingress.
//!
//! Request body (JSON):
//! ```json
//! {"model": "den-synthetic", "prompt": "hello den", "max_new_tokens": 16}
//! {"model": "den-synthetic", "tokens": [1, 2, 3], "max_new_tokens": 4, "id": "my-req-1"}
//! ```
//! `model` (a public id or a fingerprint) may be left out when the cluster serves exactly
//! one model; `prompt` is tokenized with the model's tokenizer (the synthetic engine's for
//! a synthetic model); optional `id`, `deadline_ms`, `continuation_id`, `stream` (default
//! true) and the sampling fields `temperature`, `top_p`, `top_k`, `seed`, `stop`,
//! `stop_token_ids`, `ignore_eos` (applied by real models). Token ids work without a
//! tokenizer; `text` fields are left out then.
//!
//! Response: `application/x-ndjson`, one JSON object per line —
//! `{"type":"delta","index":0,"token":…,"text":…}` per token (unless `"stream": false`),
//! then exactly one terminal line: `completed` (tokens, text, prompt and cached token
//! counts, the worker and tier that served it, measured TTFT, attempts), `error` (the
//! router's error and a one-line message) or `cancelled`. A client that disconnects before
//! the terminal line cancels the request.

use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use den_protocol::decision::DecisionRecord;
use den_protocol::ids::{ModelFingerprint, RequestId, RouteId};
use den_protocol::request::{GenerationRequest, Sampling};
use den_protocol::router::{Delivery, DeliveryKind};

use crate::ingress::parse::Prompt;
use crate::ingress::{OutputText, TextModel};
use crate::router::RouterHandle;
use crate::router::http::error;
use crate::serving::{DeliveryStream, SubmitError, Submitter};

/// A `/v1/generate` body, or the one-line reason it is not one.
pub fn decode_body(bytes: &[u8]) -> Result<GenerateBody, String> {
    serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "invalid body: {}; send {{\"prompt\": \"…\" or \"tokens\": […], \"max_new_tokens\": N}}",
            den_protocol::text::one_line(&e.to_string())
        )
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateBody {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    prompt: Option<String>,
    max_new_tokens: u32,
    #[serde(default)]
    deadline_ms: Option<u64>,
    #[serde(default)]
    continuation_id: Option<String>,
    #[serde(default = "yes")]
    stream: bool,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    top_k: Option<u32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Vec<String>,
    #[serde(default)]
    stop_token_ids: Vec<u32>,
    #[serde(default)]
    ignore_eos: bool,
}

fn yes() -> bool {
    true
}

pub async fn generate(
    State(handle): State<RouterHandle>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    use crate::router::http::{MAX_BODY_BYTES, body_status};
    let body = match crate::ingress::body::read_limited(&headers, body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => return error(body_status(&e), &e.to_string()),
    };
    let body = match decode_body(&body) {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let served = handle.models();
    let model = match &body.model {
        Some(m) => served
            .iter()
            .find(|s| s.fingerprint.as_str() == m || s.id == *m)
            .map_or_else(
                || ModelFingerprint::new(m.clone()),
                |s| s.fingerprint.clone(),
            ),
        None => match served.as_slice() {
            [one] => one.fingerprint.clone(),
            [] => {
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "no worker serves any model yet: start a worker, or name the model",
                );
            }
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "several models are served: name one with \"model\"",
                );
            }
        },
    };
    let text = handle.shared.opts.text_models.get(&model);
    let tokens = match (body.tokens, body.prompt) {
        (Some(t), None) => t,
        (None, Some(p)) => match text.as_ref().map(|t| t.prompt_tokens(&Prompt::Text(p))) {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return error(e.status, &e.message),
            Err(e) => return error(e.status, &e.message),
        },
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give exactly one of \"prompt\" (text) and \"tokens\" (token ids)",
            );
        }
    };
    let id = body
        .id
        .map(RequestId::new)
        .unwrap_or_else(|| handle.next_request_id());
    let prompt_tokens = tokens.len();
    let mut request = match GenerationRequest::new(id.clone(), model, tokens, body.max_new_tokens) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    if let Some(c) = body.continuation_id {
        request = request.with_continuation_id(RouteId::new(c));
    }
    request.sampling = Sampling {
        temperature: body.temperature,
        top_p: body.top_p,
        top_k: body.top_k,
        stop: body.stop,
        stop_token_ids: body.stop_token_ids,
        ignore_eos: body.ignore_eos,
        seed: body.seed,
    };
    let text = text.ok();
    let output = |t: &TextModel| t.output(&request.sampling, &id, request.max_new_tokens);
    let (streamed, whole) = (text.as_ref().map(output), text.as_ref().map(output));
    let deadline = body.deadline_ms.map(std::time::Duration::from_millis);
    let rx = match handle.submit_with_deadline(request, deadline) {
        Ok(rx) => rx,
        Err(e @ SubmitError::DuplicateId(_)) => return error(StatusCode::CONFLICT, &e.to_string()),
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    };
    let state = StreamState {
        rx,
        guard: CancelGuard {
            handle: handle.clone(),
            id,
            done: false,
        },
        stream: body.stream,
        prompt_tokens,
        streamed,
        whole,
    };
    let lines = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if s.guard.done {
                return None;
            }
            let Some(d) = s.rx.recv().await else {
                // The router dropped the stream (it cancelled a client that fell behind).
                s.guard.done = true;
                let line = json!({"type": "error", "id": s.guard.id, "message": "the router ended the stream"});
                return Some((Ok::<_, std::convert::Infallible>(ndjson(&line)), s));
            };
            if let Some(line) = s.line(d).await {
                return Some((Ok(ndjson(&line)), s));
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|_| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "could not build the response",
            )
        })
}

struct StreamState {
    rx: DeliveryStream,
    guard: CancelGuard,
    stream: bool,
    prompt_tokens: usize,
    /// The deltas' text (absent without a tokenizer).
    streamed: Option<OutputText>,
    /// The completed line's text.
    whole: Option<OutputText>,
}

impl StreamState {
    /// The line for one delivery (`None` for a delta when not streaming).
    async fn line(&mut self, d: Delivery) -> Option<serde_json::Value> {
        let id = &self.guard.id;
        match d.kind {
            DeliveryKind::Delta { token, index } => {
                let text = self.streamed.as_mut().map(|o| o.push(token));
                self.stream
                    .then(|| json!({"type": "delta", "index": index, "token": token, "text": text}))
            }
            DeliveryKind::Completed { result } => {
                self.guard.done = true;
                let record = self.guard.handle.record(id).await;
                let chosen = record.as_ref().and_then(DecisionRecord::chosen);
                Some(json!({
                    "type": "completed",
                    "id": id,
                    "tokens": result.tokens,
                    "text": self.whole.take().map(|o| o.all(&result.tokens)),
                    "prompt_tokens": self.prompt_tokens,
                    "cached_tokens": result.cached_token_count,
                    "stop": result.stop,
                    "timings": result.timings,
                    "worker": chosen.map(|a| a.worker.to_string()),
                    "tier": chosen.map(|a| a.tier.as_str()),
                    "predicted_ttft_ms": chosen.map(|a| a.predicted_ttft_ms),
                    "ttft_ms": record.as_ref().and_then(|r| r.measured_ttft_ms),
                    "waited_ms": record.as_ref().map(|r| r.waited_ms),
                    "attempts": record.as_ref().map(attempts).unwrap_or_default(),
                }))
            }
            DeliveryKind::Error { error } => {
                self.guard.done = true;
                let record = self.guard.handle.record(id).await;
                Some(json!({
                    "type": "error",
                    "id": id,
                    "error": error,
                    "message": error.to_string(),
                    "attempts": record.as_ref().map(attempts).unwrap_or_default(),
                }))
            }
            DeliveryKind::Cancelled => {
                self.guard.done = true;
                Some(json!({"type": "cancelled", "id": id}))
            }
        }
    }
}

fn attempts(r: &DecisionRecord) -> Vec<serde_json::Value> {
    r.attempts
        .iter()
        .map(|a| {
            json!({
                "attempt": a.attempt,
                "worker": a.worker,
                "tier": a.tier.as_str(),
                "cached_tokens": a.cached_tokens,
                "outcome": a.outcome.to_string(),
            })
        })
        .collect()
}

fn ndjson(v: &serde_json::Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

/// Cancels the request when the response body is dropped before its terminal line
/// (the client disconnected).
struct CancelGuard {
    handle: RouterHandle,
    id: RequestId,
    done: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.done {
            tracing::info!(request = %self.id, "client went away; cancelling");
            self.handle.cancel(&self.id);
        }
    }
}
