//! The router's built-in HTTP endpoints (see the module map in `router`).
//!
//! The shared token (`Authorization: Bearer …`) is checked **before** a WebSocket upgrade
//! and on every management call; `/metrics` and `/healthz` are open, like most
//! Prometheus targets. Errors are JSON `{"error": "…"}` with one line saying what to do.

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};

use den_protocol::ids::{RequestId, WorkerId};

use crate::auth;
use crate::router::{RouterHandle, conn, feed, generate};
use crate::serving::Submitter;

/// The built-in routes, with the handle as state: every one behind the token check but
/// `/metrics` and `/healthz`.
pub fn routes(handle: RouterHandle) -> Router {
    let guarded = Router::new()
        .route("/v1/agents", get(agents))
        .route("/v1/console", get(console))
        .route("/v1/requests/{id}", get(record))
        .route("/v1/requests/{id}/cancel", post(cancel))
        .route("/v1/workers", get(workers))
        .route("/v1/workers/{id}/drain", post(drain))
        .route("/v1/workers/{id}/undrain", post(undrain))
        .route_layer(middleware::from_fn_with_state(
            handle.clone(),
            require_token,
        ));
    // den's own inference API takes the inference API keys too.
    let inference = Router::new()
        .route("/v1/generate", post(generate::generate))
        .route_layer(middleware::from_fn_with_state(
            handle.clone(),
            require_token_or_key,
        ));
    Router::new()
        .merge(guarded)
        .merge(inference)
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(handle)
}

/// `/readyz`, for load balancers: 200 while the router takes requests and at least one
/// live worker that is not draining serves a model; otherwise 503 with the reason (and
/// `Retry-After`), so traffic goes elsewhere during a drain or before workers join.
/// `/healthz` stays liveness only. Open like `/healthz`: it says nothing secret.
async fn readyz(State(handle): State<RouterHandle>) -> Response {
    if handle.shutting_down() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the router is shutting down",
        );
    }
    let workers = handle.workers().await;
    let serving = workers
        .iter()
        .filter(|w| !w.draining && !w.models.is_empty())
        .count();
    if serving == 0 {
        let why = if workers.is_empty() {
            "not ready: no worker is connected".to_owned()
        } else {
            format!(
                "not ready: {} worker(s) connected, none serving a model (draining or empty)",
                workers.len()
            )
        };
        return error(StatusCode::SERVICE_UNAVAILABLE, &why);
    }
    Json(serde_json::json!({ "ready": true, "serving_workers": serving })).into_response()
}

/// Middleware: the 401 before any handler (and so before a WebSocket upgrade) runs.
async fn require_token(
    State(handle): State<RouterHandle>,
    request: Request,
    next: Next,
) -> Response {
    match unauthorized(&handle, request.headers()) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
}

/// Middleware of the inference endpoints: the cluster token or an API key.
async fn require_token_or_key(
    State(handle): State<RouterHandle>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let o = handle.options();
    match auth::check_inference(o.token.as_ref(), o.api_keys.as_ref(), presented) {
        Ok(()) => next.run(request).await,
        Err(e) => {
            count_refusal(&handle);
            error(StatusCode::UNAUTHORIZED, &e.to_string())
        }
    }
}

/// The 401 response when the request does not carry the shared token (403 for an
/// inference API key), else `None`.
pub fn unauthorized(handle: &RouterHandle, headers: &HeaderMap) -> Option<Response> {
    check_token(handle, headers).err().map(|e| {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::UNAUTHORIZED);
        error(status, &e.to_string())
    })
}

fn count_refusal(handle: &RouterHandle) {
    handle.metrics().counter_add(
        "den_router_unauthorized_total",
        "Requests refused for a missing or wrong token.",
        &[],
        1.0,
    );
}

/// Checks the request's bearer token against the router's (in constant time), counting
/// each refusal; every HTTP surface of the router answers its own error shape from this.
pub fn check_token(handle: &RouterHandle, headers: &HeaderMap) -> Result<(), auth::AuthError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let o = handle.options();
    auth::check(o.token.as_ref(), presented)
        .map_err(|e| {
            // A valid inference key on a cluster endpoint: the right door is elsewhere.
            let key = presented
                .and_then(auth::bearer)
                .is_some_and(|p| o.api_keys.as_ref().is_some_and(|k| k.contains(p)));
            if e == auth::AuthError::Wrong && key {
                auth::AuthError::InferenceKeyOnly
            } else {
                e
            }
        })
        .inspect_err(|_| count_refusal(handle))
}

/// A JSON error body.
pub fn error(status: StatusCode, message: &str) -> Response {
    let mut response = (status, Json(serde_json::json!({ "error": message }))).into_response();
    retry_after(&mut response);
    response
}

/// A 503 says when to come back: capacity and shutdowns pass within seconds, and load
/// balancers and clients that honour the header back off instead of hammering.
pub fn retry_after(response: &mut Response) {
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
    }
}

/// Largest body the router API and the management API accept (the OpenAI ingress has
/// its own `max_body_bytes`, the same by default).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// The status of a body that could not be read.
pub fn body_status(e: &crate::ingress::body::BodyError) -> StatusCode {
    match e {
        crate::ingress::body::BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        crate::ingress::body::BodyError::Unreadable(_) => StatusCode::BAD_REQUEST,
    }
}

async fn agents(State(handle): State<RouterHandle>, ws: WebSocketUpgrade) -> Response {
    let max = handle.options().max_frame;
    // Frames up to twice the limit still reach the codec, which refuses them with a
    // clear `refused` frame; beyond that the socket layer drops the connection.
    let socket_max = max.saturating_mul(2).max(64 * 1024);
    ws.max_message_size(socket_max)
        .max_frame_size(socket_max)
        .read_buffer_size(crate::ws::READ_BUFFER)
        .on_upgrade(move |socket| conn::serve(socket, handle))
}

async fn console(State(handle): State<RouterHandle>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |socket| feed::serve(socket, handle))
}

async fn record(State(handle): State<RouterHandle>, Path(id): Path<String>) -> Response {
    match handle.record(&RequestId::new(id.clone())).await {
        Some(r) => Json(r).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            &format!("no request {id:?}: it never existed or its record was collected"),
        ),
    }
}

async fn cancel(State(handle): State<RouterHandle>, Path(id): Path<String>) -> Response {
    let id = RequestId::new(id);
    if handle.record(&id).await.is_none() {
        return error(StatusCode::NOT_FOUND, &format!("no request {id}"));
    }
    handle.cancel(&id);
    (
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "request": id, "cancel": "sent" })),
    )
        .into_response()
}

async fn workers(State(handle): State<RouterHandle>) -> Response {
    Json(handle.workers().await).into_response()
}

async fn drain(State(handle): State<RouterHandle>, Path(id): Path<String>) -> Response {
    set_drain(handle, id, true).await
}

async fn undrain(State(handle): State<RouterHandle>, Path(id): Path<String>) -> Response {
    set_drain(handle, id, false).await
}

async fn set_drain(handle: RouterHandle, id: String, draining: bool) -> Response {
    let worker = WorkerId::new(id);
    if handle.drain(&worker, draining).await {
        Json(serde_json::json!({ "worker": worker, "draining": draining })).into_response()
    } else {
        error(
            StatusCode::NOT_FOUND,
            &format!("worker {worker} is not connected: check GET /v1/workers"),
        )
    }
}

async fn metrics(State(handle): State<RouterHandle>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.metrics().render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use den_protocol::router::RouterError;

    #[test]
    fn every_503_says_retry_after_and_other_errors_do_not() {
        let busy = error(StatusCode::SERVICE_UNAVAILABLE, "no capacity");
        assert_eq!(
            busy.headers()
                .get(axum::http::header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        let bad = error(StatusCode::BAD_REQUEST, "no");
        assert!(bad.headers().get(axum::http::header::RETRY_AFTER).is_none());
        let managed = crate::router::manage::http::envelope(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "x",
        );
        assert!(
            managed
                .headers()
                .get(axum::http::header::RETRY_AFTER)
                .is_some()
        );
        let openai = crate::ingress::error::ApiError::from_router(&RouterError::NoFeasibleWorker {
            summary: den_protocol::router::NoFeasible {
                candidates: 0,
                infeasible: Vec::new(),
                attempts: 0,
                last: None,
            },
        })
        .into_response();
        assert_eq!(openai.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            openai
                .headers()
                .get(axum::http::header::RETRY_AFTER)
                .is_some()
        );
    }
}
