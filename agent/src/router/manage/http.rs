//! The management endpoints, mounted on the router's HTTP server with
//! [`crate::router::RouterServer::with_management`].
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /node_id` | the router's node id, a bare JSON string |
//! | `GET /node/identity` | `{"nodeId", "hostname", "ipAddress"}` |
//! | `GET /state` | [`den_protocol::skulk::State`] in the newer dialect |
//! | `GET /instance/previews?model_id=…[&node_ids=…][&excluded_node_ids=…]` | `{"previews": [...]}` |
//! | `POST /instance` `{"instance": …}` | `{"message", "command_id", "instance_id", "model_card"}` |
//! | `GET /instance/{id}` | the tagged instance |
//! | `DELETE /instance/{id}` | `{"message", "command_id", "instance_id"}` |
//! | `GET /models/requirements?model_id=…[&context_tokens=…]` | [`den_protocol::skulk::ModelRequirements`] |
//! | `GET /models` | the catalog (`{"object": "list", "data": [...]}`) |
//!
//! Inference goes through the OpenAI ingress on the same port: completions of a placed
//! model carry `served_by` (the instance), and `?den_instance=ID` pins a request to one.
//!
//! Every endpoint requires the router's token when one is configured (401 otherwise).
//! Errors use Skulk's envelope `{"error": {"message", "type", "param", "code"}}` with
//! den's stable category in `error.den_code`; a missing required query parameter is
//! FastAPI's 422 `{"detail": [...]}`, as Skulk answers it.

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::json;
use tokio::sync::oneshot;

use den_protocol::ids::NodeId;
use den_protocol::skulk::api::{CreateInstanceRequest, NodeIdentityResponse};
use den_protocol::skulk::{InstanceId, ModelId};

use super::{PreviewQuery, Refusal, Request};
use crate::router::RouterHandle;
use crate::router::actor::Command;
use crate::router::http::check_token;

/// The management routes, with the router handle as state.
pub fn routes(handle: RouterHandle) -> Router {
    Router::new()
        .route("/node_id", get(node_id))
        .route("/node/identity", get(identity))
        .route("/state", get(state))
        .route("/instance/previews", get(previews))
        .route("/instance", axum::routing::post(create))
        .route("/instance/{id}", get(get_instance).delete(delete))
        .route("/models/requirements", get(requirements))
        .route("/models", get(models))
        .route_layer(middleware::from_fn_with_state(
            handle.clone(),
            require_token,
        ))
        .with_state(handle)
}

/// Middleware: every management call needs the router's token (Skulk's 401 envelope).
async fn require_token(
    State(handle): State<RouterHandle>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    match unauthorized(&handle, request.headers()) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
}

/// Skulk's error envelope.
pub fn envelope(status: StatusCode, code: &str, message: &str) -> Response {
    let body = json!({
        "error": {
            "message": message,
            "type": status.canonical_reason().unwrap_or("Error"),
            "param": null,
            "code": status.as_u16(),
            "den_code": code,
        }
    });
    let mut response = (status, Json(body)).into_response();
    crate::router::http::retry_after(&mut response);
    response
}

fn refusal(r: Refusal) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_REQUEST);
    envelope(status, r.code, &r.message)
}

/// FastAPI's 422 for a missing query parameter.
fn missing(param: &str) -> Response {
    let body = json!({
        "detail": [{"type": "missing", "loc": ["query", param], "msg": "Field required", "input": null}]
    });
    (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response()
}

/// The 401 answer when the request lacks the router's token (403 for an inference API
/// key: management needs the cluster token).
fn unauthorized(handle: &RouterHandle, headers: &HeaderMap) -> Option<Response> {
    check_token(handle, headers)
        .err()
        .map(|e| match e.status() {
            403 => envelope(StatusCode::FORBIDDEN, "forbidden", &e.to_string()),
            _ => envelope(StatusCode::UNAUTHORIZED, "unauthorized", &e.to_string()),
        })
}

/// Sends a request to the router actor and waits for its answer (`None`: the actor
/// stopped).
async fn ask<T>(
    handle: &RouterHandle,
    make: impl FnOnce(oneshot::Sender<T>) -> Request,
) -> Option<T> {
    let (reply, rx) = oneshot::channel();
    handle.send(Command::Manage(make(reply))).await;
    rx.await.ok()
}

fn stopped() -> Response {
    envelope(
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        "the router is shutting down",
    )
}

async fn node_id(State(handle): State<RouterHandle>) -> Response {
    Json(handle.options().name.clone()).into_response()
}

async fn identity(State(handle): State<RouterHandle>) -> Response {
    let host = crate::cli::hostname();
    Json(NodeIdentityResponse {
        node_id: handle.options().name.clone(),
        hostname: host.clone(),
        ip_address: host,
        extra: Default::default(),
    })
    .into_response()
}

async fn state(State(handle): State<RouterHandle>) -> Response {
    match ask(&handle, |reply| Request::State { reply }).await {
        Some(state) => Json(state).into_response(),
        None => stopped(),
    }
}

async fn previews(State(handle): State<RouterHandle>, RawQuery(query): RawQuery) -> Response {
    let pairs = parse_query(query.as_deref().unwrap_or(""));
    let Some(model) = first(&pairs, "model_id") else {
        return missing("model_id");
    };
    let query = PreviewQuery {
        model_id: ModelId::new(model),
        node_ids: all(&pairs, "node_ids").map(NodeId::new).collect(),
        excluded_node_ids: all(&pairs, "excluded_node_ids").map(NodeId::new).collect(),
    };
    match ask(&handle, |reply| Request::Previews { query, reply }).await {
        Some(p) => Json(p).into_response(),
        None => stopped(),
    }
}

async fn create(
    State(handle): State<RouterHandle>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Response {
    use crate::ingress::body::{BodyError, read_limited};
    use crate::router::http::{MAX_BODY_BYTES, body_status};
    let body = match read_limited(&headers, body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            let code = match e {
                BodyError::TooLarge { .. } => "request_too_large",
                BodyError::Unreadable(_) => "invalid_body",
            };
            return envelope(body_status(&e), code, &e.to_string());
        }
    };
    let body: CreateInstanceRequest = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return envelope(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                &format!(
                    "the body must be {{\"instance\": <tagged instance from a preview>}}: {e}"
                ),
            );
        }
    };
    let body = Box::new(body);
    match ask(&handle, |reply| Request::Create { body, reply }).await {
        Some(Ok(ack)) => Json(ack).into_response(),
        Some(Err(r)) => refusal(r),
        None => stopped(),
    }
}

async fn get_instance(State(handle): State<RouterHandle>, Path(id): Path<String>) -> Response {
    let instance = InstanceId::new(id);
    match ask(&handle, |reply| Request::Get { instance, reply }).await {
        Some(Some(i)) => Json(i).into_response(),
        Some(None) => envelope(
            StatusCode::NOT_FOUND,
            "instance_unknown",
            "Instance not found",
        ),
        None => stopped(),
    }
}

async fn delete(State(handle): State<RouterHandle>, Path(id): Path<String>) -> Response {
    let instance = InstanceId::new(id);
    match ask(&handle, |reply| Request::Delete { instance, reply }).await {
        Some(Ok(ack)) => Json(ack).into_response(),
        Some(Err(r)) => refusal(r),
        None => stopped(),
    }
}

async fn requirements(State(handle): State<RouterHandle>, RawQuery(query): RawQuery) -> Response {
    let pairs = parse_query(query.as_deref().unwrap_or(""));
    let Some(model) = first(&pairs, "model_id") else {
        return missing("model_id");
    };
    let context = match first(&pairs, "context_tokens").map(|c| c.trim().parse::<u64>()) {
        None => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => {
            return envelope(
                StatusCode::BAD_REQUEST,
                "invalid_value",
                "context_tokens must be a non-negative integer",
            );
        }
    };
    let catalog = &handle.options().catalog;
    match catalog.get(&ModelId::new(model.clone())) {
        Some(card) => Json(card.requirements(context)).into_response(),
        None => envelope(
            StatusCode::NOT_FOUND,
            "model_unknown",
            &format!(
                "model {model} is not in the catalog (it has: {})",
                catalog.ids()
            ),
        ),
    }
}

async fn models(State(handle): State<RouterHandle>) -> Response {
    Json(handle.options().catalog.model_list()).into_response()
}

/// `a=1&b=2&b=3` → pairs, percent-decoded (`+` is a space), in order.
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn first(pairs: &[(String, String)], key: &str) -> Option<String> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// Every value of a repeatable parameter. Skulk repeats the key (`node_ids=A&node_ids=B`);
/// a comma-separated list (`node_ids=A,B`) means the same here, since no node id holds a
/// comma, rather than one node named `A,B` that silently matches nothing.
fn all<'a>(pairs: &'a [(String, String)], key: &'a str) -> impl Iterator<Item = String> + 'a {
    pairs
        .iter()
        .filter(move |(k, _)| k == key)
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes.get(i) {
            Some(b'+') => out.push(b' '),
            Some(b'%') => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            Some(b) => out.push(*b),
            None => break,
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_keep_repeated_keys_and_decode() {
        let q = parse_query("model_id=den%2Ftiny+1&node_ids=a&node_ids=b&x=%zz");
        assert_eq!(first(&q, "model_id").as_deref(), Some("den/tiny 1"));
        assert_eq!(all(&q, "node_ids").collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(first(&q, "x").as_deref(), Some("%zz"));
        assert!(parse_query("").is_empty());
    }

    #[test]
    fn comma_separated_node_lists_mean_each_node() {
        let q = parse_query("model_id=m&excluded_node_ids=a,b&excluded_node_ids=c&node_ids=%2C");
        assert_eq!(
            all(&q, "excluded_node_ids").collect::<Vec<_>>(),
            vec!["a", "b", "c"]
        );
        assert_eq!(all(&q, "node_ids").count(), 0);
    }
}
