//! The worker's HTTP endpoints.
//!
//! - Metrics (`--metrics-listen`): `GET /metrics` (Prometheus text), `GET /status` (JSON:
//!   pool pages by state, assignments, restore verification counters…), `GET /healthz`.
//! - Fault injection (`--fault-admin`, loopback only, **tests only**): `POST
//!   /fault/drop-inbound?on=true|false` (directed partition router → worker), `POST
//!   /fault/restore-delay?ms=N` (slow restores), `POST /fault/fetch-delay?ms=N` (every
//!   tier read of a restore that much slower: a remote store's latency), `POST
//!   /fault/evict-resident` (evict every
//!   evictable resident route, so the next request restores from a tier), `POST
//!   /fault/outbound?mode=none|duplicate|reorder|delay[&ms=N]` (frames to the router
//!   sent twice, in swapped pairs, or late), plus `GET
//!   /status`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;
use crate::worker::actor::AdminCommand;
use crate::worker::faults::Faults;

#[derive(Clone)]
struct AdminState {
    metrics: Arc<Metrics>,
    faults: Arc<Faults>,
    actor: mpsc::Sender<AdminCommand>,
}

/// Serve the metrics endpoint; returns the bound address.
pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    actor: mpsc::Sender<AdminCommand>,
) -> std::io::Result<SocketAddr> {
    let state = AdminState {
        metrics,
        faults: Arc::new(Faults::default()),
        actor,
    };
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/status", get(status))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state);
    serve(addr, app).await
}

/// Serve the fault-injection endpoint (the caller checked the address is loopback).
pub async fn serve_faults(
    addr: SocketAddr,
    faults: Arc<Faults>,
    actor: mpsc::Sender<AdminCommand>,
) -> std::io::Result<SocketAddr> {
    let state = AdminState {
        metrics: Arc::new(Metrics::new()),
        faults,
        actor,
    };
    let app = Router::new()
        .route("/fault/drop-inbound", post(drop_inbound))
        .route("/fault/restore-delay", post(restore_delay))
        .route("/fault/fetch-delay", post(fetch_delay))
        .route("/fault/outbound", post(outbound))
        .route("/fault/evict-resident", post(evict_resident))
        .route("/status", get(status))
        .with_state(state);
    serve(addr, app).await
}

async fn serve(addr: SocketAddr, app: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    // Bounded like the router's: a scraper that opens sockets and says nothing must not
    // exhaust the worker's descriptors.
    let listener =
        crate::listener::GuardedListener::new(listener, crate::listener::Limits::default());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("admin endpoint {bound} failed: {e}");
        }
    });
    Ok(bound)
}

async fn metrics_text(State(s): State<AdminState>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

async fn status(State(s): State<AdminState>) -> Response {
    let (tx, rx) = oneshot::channel();
    if s.actor.send(AdminCommand::Status(tx)).await.is_err() {
        return unavailable();
    }
    match rx.await {
        Ok(status) => Json(status).into_response(),
        Err(_) => unavailable(),
    }
}

async fn drop_inbound(
    State(s): State<AdminState>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let on = match q.get("on").map(String::as_str) {
        Some("true" | "1") => true,
        Some("false" | "0") => false,
        _ => return bad("give ?on=true or ?on=false"),
    };
    s.faults.set_drop_inbound(on);
    tracing::warn!(on, "fault injection: dropping frames from the router");
    Json(serde_json::json!({ "drop_inbound": on })).into_response()
}

/// The `?ms=N` of a delay fault, or the line saying what to give.
fn millis(q: &BTreeMap<String, String>, what: &str) -> Result<u64, String> {
    q.get("ms")
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| format!("give ?ms=N (milliseconds {what})"))
}

async fn restore_delay(
    State(s): State<AdminState>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let ms = match millis(&q, "per restored chunk") {
        Ok(ms) => ms,
        Err(line) => return bad(&line),
    };
    s.faults.set_restore_delay_ms(ms);
    tracing::warn!(ms, "fault injection: delaying every restored chunk");
    Json(serde_json::json!({ "restore_delay_ms": ms })).into_response()
}

async fn fetch_delay(
    State(s): State<AdminState>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let ms = match millis(&q, "added to every chunk fetch of a restore") {
        Ok(ms) => ms,
        Err(line) => return bad(&line),
    };
    s.faults.set_fetch_delay_ms(ms);
    tracing::warn!(
        ms,
        "fault injection: delaying every chunk fetch of a restore"
    );
    Json(serde_json::json!({ "fetch_delay_ms": ms })).into_response()
}

async fn outbound(
    State(s): State<AdminState>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    use crate::worker::faults::Outbound;
    let Some(mode) = q.get("mode").and_then(|m| Outbound::parse(m)) else {
        return bad("give ?mode=none|duplicate|reorder|delay (and &ms=N with delay)");
    };
    let ms = q.get("ms").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    s.faults.set_outbound(mode, ms);
    tracing::warn!(?mode, ms, "fault injection: frames to the router");
    Json(serde_json::json!({ "outbound": format!("{mode:?}"), "ms": ms })).into_response()
}

async fn evict_resident(State(s): State<AdminState>) -> Response {
    let (tx, rx) = oneshot::channel();
    if s.actor.send(AdminCommand::EvictResident(tx)).await.is_err() {
        return unavailable();
    }
    match rx.await {
        Ok(pages) => Json(serde_json::json!({ "pages_freed": pages })).into_response(),
        Err(_) => unavailable(),
    }
}

fn bad(msg: &str) -> Response {
    (StatusCode::BAD_REQUEST, format!("{msg}\n")).into_response()
}

fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the worker is shutting down\n",
    )
        .into_response()
}
