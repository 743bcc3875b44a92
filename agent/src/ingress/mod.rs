//! The OpenAI-compatible ingress (spec §9, extended): an axum sub-router the router
//! runtime mounts with one line, `app.merge(ingress::routes(submitter, config))`.
//!
//! Serve it with `TCP_NODELAY` on accepted connections
//! (`axum::serve(listener.tap_io(|s| { let _ = s.set_nodelay(true); }), app)`): SSE frames
//! are small writes, and with Nagle's algorithm each one after the first waits for the
//! client's delayed ACK (~40 ms per stream; the bench shows 11× fewer streamed req/s).
//!
//! Endpoints:
//! - `GET /v1/models`, `GET /v1/models/{id}`: the models live workers advertise
//!   ([`Submitter::models`](crate::serving::Submitter::models)), `owned_by: "den"`;
//! - `POST /v1/chat/completions`: messages rendered with the model's chat template and
//!   tokenized by its tokenizer ([`text_model`]: a real model's from its GGUF file, the
//!   synthetic engine's ChatML-like template and word/byte tokenizer otherwise);
//! - `POST /v1/completions`: a prompt string or token ids; one prompt per request
//!   (an array of several prompts is refused with a clear error, not silently cut);
//! - `POST /tokenize`, `POST /detokenize`: vLLM's shapes, with the model's own tokenizer
//!   and chat template ([`tokenize`]);
//! - any other `/v1/…` path: 404, and a wrong method: 405, both in the error envelope.
//!
//! Both generation endpoints answer streamed (`text/event-stream`: chunks, an optional
//! usage chunk for `stream_options.include_usage`, then `data: [DONE]`) or as one JSON
//! object. `usage.prompt_tokens_details.cached_tokens` is the worker's actual reused
//! prefix from the terminal result, not an estimate.
//!
//! Decisions where the spec is silent:
//! - `max_completion_tokens` wins over `max_tokens`; without either, a real model may
//!   generate to the end of its context (it stops on its own), and the synthetic engine
//!   gets the default (256) lowered to what still fits. A given limit that does not fit
//!   (`prompt + max_tokens > max_context`) is 400 `context_length_exceeded`. A model
//!   advertising `max_context == 0` is treated as unbounded.
//! - Errors before the first token of a streamed request are answered with an HTTP error
//!   status (the client raises its usual typed exception); after it, an error frame in
//!   the envelope shape and then `data: [DONE]`.
//! - A request the router cancels on its own (shutdown, operator) answers 500
//!   `request_cancelled` (spec §9: cancelled → 500); a client that disconnected gets no
//!   answer, and its request is cancelled once.
//! - Sampling fields (`temperature`, `top_p`, vLLM's `top_k`, `stop_token_ids`,
//!   `ignore_eos`, `seed`, `stop`) are applied by real models; without `seed`, the seed
//!   comes from the request id. The synthetic engine ignores them.
//! - A non-streamed answer for a model placed through den's management API names the
//!   instance that served it (`served_by`); `?den_instance=ID` pins a request to that
//!   instance (the placement probe uses it), and no other worker may serve it.
//!
//! Error mapping (every body is `{"error":{"message","type","param","code"}}`):
//!
//! | cause | status | type | code |
//! |---|---|---|---|
//! | invalid JSON, empty body | 400 | invalid_request_error | `invalid_json` |
//! | `Content-Type` not `application/json` | 400 | invalid_request_error | `invalid_content_type` |
//! | field of the wrong type | 400 | invalid_request_error | `invalid_type` |
//! | field missing | 400 | invalid_request_error | `missing_required_parameter` |
//! | value out of range, empty `messages`/`prompt` | 400 | invalid_request_error | `invalid_value` |
//! | `n` ≠ 1, batch prompt, non-text part | 400 | invalid_request_error | `unsupported_value` |
//! | `logprobs`, `echo`, `tools`, JSON mode … | 400 | invalid_request_error | `unsupported_parameter` |
//! | prompt + max tokens > context | 400 | invalid_request_error | `context_length_exceeded` |
//! | missing/wrong bearer token | 401 | invalid_request_error | `invalid_api_key` |
//! | unknown model | 404 | invalid_request_error | `model_not_found` |
//! | unknown path / wrong method | 404 / 405 | invalid_request_error | `unknown_url` / `method_not_allowed` |
//! | body over the limit (4 MiB) | 413 | invalid_request_error | `request_too_large` |
//! | router cancelled the request | 500 | server_error | `request_cancelled` |
//! | router closed the stream without a result | 500 | server_error | `internal_error` |
//! | worker failed / unavailable after streaming | 502 | server_error | `worker_failed` / `worker_unavailable` |
//! | no feasible worker | 503 | server_error | `no_feasible_worker` |
//! | router overloaded / shutting down | 503 | server_error | `overloaded` / `shutting_down` |
//! | deadline exceeded | 504 | server_error | `deadline_exceeded` |
//!
//! Metrics (in [`IngressConfig::metrics`]): `den_ingress_requests_total{endpoint,outcome}`,
//! `den_ingress_ttft_ms{endpoint}` and `den_ingress_inter_token_ms{endpoint}` histograms,
//! measured where the ingress receives the deliveries.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde_json::json;

use den_protocol::ids::RequestId;
use den_protocol::request::{GenerationRequest, Token};

use crate::auth;
use crate::metrics::Metrics;
use crate::serving::{DELIVERY_QUEUE, ServedModel, SharedSubmitter};

pub mod body;
pub mod error;
pub mod exchange;
pub mod fake;
pub mod ids;
pub mod parse;
pub mod respond;
pub mod template;
pub mod text;
pub mod text_model;
pub mod tokenize;

pub use error::ApiError;
pub use respond::Endpoint;
pub use text_model::{OutputText, TextModel, TextModels};

/// Ingress settings.
#[derive(Debug, Clone)]
pub struct IngressConfig {
    /// When set, clients must send `Authorization: Bearer <token>` (OpenAI clients do so
    /// with their `api_key`).
    pub token: Option<auth::Token>,
    /// Inference API keys, accepted besides the token ([`crate::api_keys`]).
    pub api_keys: Option<crate::api_keys::ApiKeys>,
    pub metrics: Arc<Metrics>,
    /// Largest accepted request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// `max_tokens` when the client gives none (spec §9: 256).
    pub default_max_tokens: u32,
    /// SSE frames buffered per streamed request (spec §9: 256 events).
    pub stream_queue: usize,
    /// How long a streamed request's queue may stay full before the client counts as
    /// too slow: the request is then cancelled and the response aborted.
    pub slow_client_timeout: Duration,
    /// Tokenizers and templates of the real models this router serves.
    pub text_models: Arc<TextModels>,
}

impl Default for IngressConfig {
    fn default() -> Self {
        IngressConfig {
            token: None,
            api_keys: None,
            metrics: Arc::new(Metrics::new()),
            max_body_bytes: 4 << 20,
            default_max_tokens: 256,
            stream_queue: DELIVERY_QUEUE,
            slow_client_timeout: Duration::from_secs(2),
            text_models: Arc::new(TextModels::new()),
        }
    }
}

/// The ingress routes, ready to merge into the router's HTTP app.
pub fn routes(submitter: SharedSubmitter, config: IngressConfig) -> Router {
    let state = Arc::new(Ingress { submitter, config });
    Router::new()
        .route("/v1/models", get(list_models).fallback(method_not_allowed))
        .route(
            "/v1/models/{*id}",
            get(get_model).fallback(method_not_allowed),
        )
        .route(
            "/v1/chat/completions",
            post(chat_completions).fallback(method_not_allowed),
        )
        .route(
            "/v1/completions",
            post(completions).fallback(method_not_allowed),
        )
        .route(
            "/tokenize",
            post(tokenize::tokenize).fallback(method_not_allowed),
        )
        .route(
            "/detokenize",
            post(tokenize::detokenize).fallback(method_not_allowed),
        )
        .route("/v1/{*rest}", any(not_found))
        .with_state(state)
}

pub(crate) struct Ingress {
    submitter: SharedSubmitter,
    config: IngressConfig,
}

/// A request parsed, before its prompt is tokenized (which needs the model).
enum Parsed {
    Chat(parse::ChatRequest),
    Completion(parse::CompletionRequest),
}

impl Parsed {
    fn common(&self) -> &parse::Common {
        match self {
            Parsed::Chat(r) => &r.common,
            Parsed::Completion(r) => &r.common,
        }
    }
}

/// A request ready to submit.
struct Prepared {
    common: parse::Common,
    tokens: Vec<Token>,
}

async fn chat_completions(State(ingress): State<Arc<Ingress>>, request: Request) -> Response {
    ingress.generate(Endpoint::Chat, request).await
}

async fn completions(State(ingress): State<Arc<Ingress>>, request: Request) -> Response {
    ingress.generate(Endpoint::Completions, request).await
}

async fn list_models(State(ingress): State<Arc<Ingress>>, headers: HeaderMap) -> Response {
    if let Err(e) = ingress.authorize(&headers) {
        exchange::count_request(&ingress.config.metrics, "models", "unauthorized");
        return e.into_response();
    }
    let mut models = ingress.submitter.models();
    models.sort_by(|a, b| a.id.cmp(&b.id));
    models.dedup_by(|a, b| a.id == b.id);
    let data: Vec<_> = models.iter().map(model_json).collect();
    exchange::count_request(&ingress.config.metrics, "models", "ok");
    exchange::json_response(
        StatusCode::OK,
        serde_json::to_vec(&json!({"object": "list", "data": data})).unwrap_or_default(),
    )
}

async fn get_model(
    State(ingress): State<Arc<Ingress>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = ingress.authorize(&headers) {
        exchange::count_request(&ingress.config.metrics, "models", "unauthorized");
        return e.into_response();
    }
    let models = ingress.submitter.models();
    match models.iter().find(|m| m.id == id) {
        Some(m) => {
            exchange::count_request(&ingress.config.metrics, "models", "ok");
            exchange::json_response(
                StatusCode::OK,
                serde_json::to_vec(&model_json(m)).unwrap_or_default(),
            )
        }
        None => {
            exchange::count_request(&ingress.config.metrics, "models", "model_not_found");
            ApiError::model_not_found(&id, &model_ids(&models)).into_response()
        }
    }
}

async fn not_found(method: Method, uri: Uri) -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: error::ErrorType::InvalidRequest,
        message: format!(
            "Invalid URL ({method} {}): den serves GET /v1/models, POST /v1/chat/completions and POST /v1/completions",
            uri.path()
        ),
        param: None,
        code: "unknown_url",
    }
    .into_response()
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let allowed = if uri.path().starts_with("/v1/models") {
        "GET"
    } else {
        "POST"
    };
    let mut response = ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        kind: error::ErrorType::InvalidRequest,
        message: format!("{method} is not allowed on {}: use {allowed}", uri.path()),
        param: None,
        code: "method_not_allowed",
    }
    .into_response();
    if let Ok(v) = allowed.parse() {
        response.headers_mut().insert(header::ALLOW, v);
    }
    response
}

impl Ingress {
    async fn generate(&self, endpoint: Endpoint, request: Request) -> Response {
        let started = Instant::now();
        let label = endpoint.label();
        let metrics = &self.config.metrics;
        let (parts, body) = request.into_parts();
        if let Err(e) = self.authorize(&parts.headers) {
            exchange::count_request(metrics, label, "unauthorized");
            return e.into_response();
        }
        let parsed = match body::read_json(&parts.headers, body, self.config.max_body_bytes)
            .await
            .and_then(|v| parse_request(endpoint, &v))
        {
            Ok(p) => p,
            Err(e) => {
                exchange::count_request(metrics, label, "invalid_request");
                return e.into_response();
            }
        };
        let models = self.submitter.models();
        let Some(model) = models.iter().find(|m| m.id == parsed.common().model) else {
            exchange::count_request(metrics, label, "model_not_found");
            return ApiError::model_not_found(&parsed.common().model, &model_ids(&models))
                .into_response();
        };
        let text = match self.config.text_models.get(&model.fingerprint) {
            Ok(t) => t,
            Err(e) => {
                exchange::count_request(metrics, label, "refused");
                return e.into_response();
            }
        };
        let prepared = match tokenize(&text, parsed) {
            Ok(p) => p,
            Err(e) => {
                exchange::count_request(metrics, label, "invalid_request");
                return e.into_response();
            }
        };
        let limit = match self.max_new_tokens(endpoint, &prepared, model, &text) {
            Ok(n) => n,
            Err(e) => {
                exchange::count_request(metrics, label, "invalid_request");
                return e.into_response();
            }
        };

        let id = ids::next(endpoint.id_prefix());
        let prompt_tokens = u32::try_from(prepared.tokens.len()).unwrap_or(u32::MAX);
        let stream = prepared.common.stream;
        let include_usage = prepared.common.include_usage;
        let request = match GenerationRequest::new(
            id.as_str(),
            model.fingerprint.clone(),
            prepared.tokens,
            limit,
        ) {
            Ok(r) => GenerationRequest {
                sampling: prepared.common.sampling.clone(),
                ..r
            },
            Err(e) => {
                // Unreachable by construction (non-empty prompt, limit ≥ 1, fresh id),
                // but answered rather than assumed.
                exchange::count_request(metrics, label, "invalid_request");
                return ApiError::bad_request("invalid_value", e.to_string()).into_response();
            }
        };
        // den's placement probe pins itself to the instance it checks.
        let pin = parts.uri.query().and_then(|q| {
            crate::router::manage::http::parse_query(q)
                .into_iter()
                .find(|(k, v)| k == "den_instance" && !v.is_empty())
                .map(|(_, v)| v)
        });
        let request_sampling = request.sampling.clone();
        let rx = match self.submitter.submit_pinned(request, pin.as_deref()) {
            Ok(rx) => rx,
            Err(e) => {
                exchange::count_request(metrics, label, "refused");
                return ApiError::from_submit(&e).into_response();
            }
        };
        let tracker = exchange::Tracker::new(
            RequestId::new(id.clone()),
            self.submitter.clone(),
            metrics.clone(),
            label,
        );
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let output = text.output(&request_sampling, &RequestId::new(id.clone()), limit);
        let exchange = exchange::Exchange {
            output,
            metrics: metrics.clone(),
            shape: respond::Shape::new(
                endpoint,
                id,
                created,
                prepared.common.model,
                model.fingerprint.to_string(),
                include_usage,
            ),
            limit,
            prompt_tokens,
            started,
            stream_queue: self.config.stream_queue,
            slow_client_timeout: self.config.slow_client_timeout,
        };
        if stream {
            exchange.stream(tracker, rx).await
        } else {
            exchange.collect(tracker, rx).await
        }
    }

    pub(crate) fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let header = headers
            .get(header::AUTHORIZATION)
            .map(|v| v.to_str().unwrap_or(""));
        auth::check_inference(
            self.config.token.as_ref(),
            self.config.api_keys.as_ref(),
            header,
        )
        .map_err(|e| ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: error::ErrorType::InvalidRequest,
            message: format!("{e} (OpenAI clients send it as their api_key)"),
            param: None,
            code: "invalid_api_key",
        })
    }

    /// The generation limit: the client's (if it fits the context); without one, what is
    /// left of the context for a real model (which stops on its own), and the default
    /// lowered to what fits for the synthetic engine (which never stops early).
    fn max_new_tokens(
        &self,
        endpoint: Endpoint,
        prepared: &Prepared,
        model: &ServedModel,
        text: &TextModel,
    ) -> Result<u32, ApiError> {
        let prompt = u32::try_from(prepared.tokens.len()).unwrap_or(u32::MAX);
        let context = model.max_context;
        let room = if context == 0 {
            u32::MAX
        } else {
            context.saturating_sub(prompt)
        };
        let too_long = |asked: u32, param: &str| {
            let what = match endpoint {
                Endpoint::Chat => "messages",
                Endpoint::Completions => "prompt",
            };
            ApiError::invalid(
                param,
                "context_length_exceeded",
                format!(
                    "This model's maximum context length is {context} tokens, but {} were requested ({prompt} in the {what}, {asked} for the completion): shorten the {what} or lower `{}`",
                    u64::from(prompt) + u64::from(asked),
                    prepared.common.max_tokens_param
                ),
            )
        };
        match prepared.common.max_tokens {
            Some(asked) if asked > room => Err(too_long(asked, prepared.common.max_tokens_param)),
            Some(asked) => Ok(asked),
            None if room == 0 => Err(too_long(
                1,
                match endpoint {
                    Endpoint::Chat => "messages",
                    Endpoint::Completions => "prompt",
                },
            )),
            None if matches!(text, TextModel::Real(_)) && room != u32::MAX => Ok(room),
            None => Ok(self.config.default_max_tokens.clamp(1, room)),
        }
    }
}

fn parse_request(endpoint: Endpoint, body: &serde_json::Value) -> Result<Parsed, ApiError> {
    match endpoint {
        Endpoint::Chat => parse::chat(body).map(Parsed::Chat),
        Endpoint::Completions => parse::completion(body).map(Parsed::Completion),
    }
}

fn tokenize(text: &TextModel, parsed: Parsed) -> Result<Prepared, ApiError> {
    match parsed {
        Parsed::Chat(r) => Ok(Prepared {
            tokens: text.chat_tokens(&r.messages)?,
            common: r.common,
        }),
        Parsed::Completion(r) => Ok(Prepared {
            tokens: text.prompt_tokens(&r.prompt)?,
            common: r.common,
        }),
    }
}

fn model_json(m: &ServedModel) -> serde_json::Value {
    json!({
        "id": m.id,
        "object": "model",
        "created": 0,
        "owned_by": "den",
        "max_model_len": m.max_context,
        "den": {"fingerprint": m.fingerprint.to_string(), "workers": m.workers},
    })
}

fn model_ids(models: &[ServedModel]) -> Vec<String> {
    let mut ids: Vec<String> = models.iter().map(|m| m.id.clone()).collect();
    ids.sort();
    ids.dedup();
    ids
}
