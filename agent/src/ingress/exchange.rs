//! One submitted request, from its delivery stream to the HTTP response.
//!
//! - [`Tracker`] knows whether the request reached its terminal delivery and cancels it
//!   at most once otherwise. A [`CancelOnDrop`] guard lives in whatever currently owns
//!   the client side (the handler future for a plain response, the SSE body once a
//!   stream started), so a client that goes away — hyper drops the future or the body —
//!   cancels the request. The terminal is marked as soon as it is received, before the
//!   last frames are written, so a normal close after the last frame is not a disconnect.
//! - Non-streamed requests are collected in the handler: it reads deliveries as they
//!   come, so the router's queue never fills on its account.
//! - Streamed requests get a pump task that drains the delivery stream, renders SSE
//!   frames, and puts them on a bounded per-request queue that the response body reads.
//!   Writes to the socket never hold a lock and never block the pump for long: when the
//!   queue stays full for the configured slow-client timeout the request is cancelled and
//!   the response is aborted (the connection is closed without `[DONE]`), so one slow
//!   client costs at most its own queue and never stalls the router or other requests.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use den_protocol::ids::RequestId;
use den_protocol::router::{Delivery, DeliveryKind};
use den_protocol::wire::WorkerResult;

use super::error::ApiError;
use super::respond::{DONE, Shape, Usage, error_frame, finish_reason};
use super::text_model::OutputText;
use crate::metrics::{LATENCY_MS_BUCKETS, Metrics};
use crate::serving::{DeliveryStream, SharedSubmitter};

/// Frames coalesced into one body chunk when several are ready at once.
const COALESCE_BYTES: usize = 64 << 10;

/// What the exchange needs besides the request itself.
pub struct Exchange {
    /// The output's text, built from the tokens as they arrive.
    pub output: OutputText,
    pub metrics: Arc<Metrics>,
    pub shape: Shape,
    /// `max_new_tokens` as submitted (for the finish reason).
    pub limit: u32,
    pub prompt_tokens: u32,
    /// When the HTTP request arrived (for TTFT).
    pub started: Instant,
    pub stream_queue: usize,
    pub slow_client_timeout: Duration,
}

/// Follows one request to its end; cancels it exactly once if the client leaves first.
pub struct Tracker {
    id: RequestId,
    submitter: SharedSubmitter,
    metrics: Arc<Metrics>,
    endpoint: &'static str,
    finished: AtomicBool,
    cancelled: AtomicBool,
    slow: AtomicBool,
    recorded: AtomicBool,
}

impl Tracker {
    pub fn new(
        id: RequestId,
        submitter: SharedSubmitter,
        metrics: Arc<Metrics>,
        endpoint: &'static str,
    ) -> Arc<Self> {
        Arc::new(Tracker {
            id,
            submitter,
            metrics,
            endpoint,
            finished: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
            slow: AtomicBool::new(false),
            recorded: AtomicBool::new(false),
        })
    }

    /// The terminal delivery arrived (or the stream ended): nothing left to cancel.
    fn finish(&self, outcome: &'static str) {
        self.finished.store(true, Ordering::SeqCst);
        self.record(outcome);
    }

    /// Cancel unless finished or already cancelled.
    fn cancel(&self, outcome: &'static str) {
        if self.finished.load(Ordering::SeqCst) || self.cancelled.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::debug!(request = %self.id, outcome, "cancelling request");
        self.submitter.cancel(&self.id);
        self.record(outcome);
    }

    fn cancel_slow(&self) {
        self.slow.store(true, Ordering::SeqCst);
        self.cancel("slow_client");
    }

    fn is_slow(&self) -> bool {
        self.slow.load(Ordering::SeqCst)
    }

    fn record(&self, outcome: &'static str) {
        if !self.recorded.swap(true, Ordering::SeqCst) {
            count_request(&self.metrics, self.endpoint, outcome);
        }
    }
}

/// Cancels the tracked request when dropped before its terminal delivery.
pub struct CancelOnDrop(pub Arc<Tracker>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel("disconnected");
    }
}

/// `den_ingress_requests_total{endpoint, outcome}`.
pub fn count_request(metrics: &Metrics, endpoint: &str, outcome: &str) {
    metrics.counter_add(
        "den_ingress_requests_total",
        "Requests through the OpenAI ingress by endpoint and outcome.",
        &[("endpoint", endpoint), ("outcome", outcome)],
        1.0,
    );
}

impl Exchange {
    /// Wait for the terminal delivery and answer with one JSON body.
    pub async fn collect(self, tracker: Arc<Tracker>, mut rx: DeliveryStream) -> Response {
        let _guard = CancelOnDrop(tracker.clone());
        let mut timing = Timing::new(self.started);
        loop {
            let Some(delivery) = rx.recv().await else {
                tracker.finish("lost");
                return ApiError::lost().into_response();
            };
            match delivery.kind {
                DeliveryKind::Delta { .. } => {
                    timing.delta(&self.metrics, self.shape.endpoint.label())
                }
                DeliveryKind::Completed { result } => {
                    return match self.check(&result) {
                        Ok(()) => {
                            tracker.finish("completed");
                            let text = self.output.all(&result.tokens);
                            let usage = Usage::from_result(self.prompt_tokens, &result);
                            let finish = finish_reason(&result, self.limit);
                            let served_by = tracker.submitter.served_by(&tracker.id);
                            json_response(
                                StatusCode::OK,
                                self.shape.full(&text, finish, &usage, served_by.as_deref()),
                            )
                        }
                        Err(e) => {
                            tracker.finish("failed");
                            e.into_response()
                        }
                    };
                }
                DeliveryKind::Error { error } => {
                    tracker.finish("failed");
                    return ApiError::from_router(&error).into_response();
                }
                DeliveryKind::Cancelled => {
                    tracker.finish("cancelled");
                    return ApiError::cancelled_by_router().into_response();
                }
            }
        }
    }

    /// Answer with an SSE stream. Errors before the first token are answered with an
    /// HTTP error status instead, so clients raise their usual typed exceptions.
    pub async fn stream(self, tracker: Arc<Tracker>, mut rx: DeliveryStream) -> Response {
        let guard = CancelOnDrop(tracker.clone());
        let timing = Timing::new(self.started);
        let first = match rx.recv().await {
            None => {
                tracker.finish("lost");
                return ApiError::lost().into_response();
            }
            Some(Delivery {
                kind: DeliveryKind::Error { error },
                ..
            }) => {
                tracker.finish("failed");
                return ApiError::from_router(&error).into_response();
            }
            Some(Delivery {
                kind: DeliveryKind::Cancelled,
                ..
            }) => {
                tracker.finish("cancelled");
                return ApiError::cancelled_by_router().into_response();
            }
            Some(d) => d,
        };
        let (tx, frames) = mpsc::channel(self.stream_queue.max(1));
        let mut exchange = self;
        let text = std::mem::replace(
            &mut exchange.output,
            OutputText::Synthetic(super::text::TextStream::new()),
        );
        let pump = Pump {
            exchange,
            tracker,
            out: tx,
            text,
            emitted: 0,
        };
        tokio::spawn(pump.run(rx, first, timing));
        let body = SseBody {
            frames,
            guard,
            aborted: false,
        };
        let mut response = Response::new(Body::from_stream(body));
        let h = response.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        response
    }

    /// A `Completed` delivery whose result is not a completion is a worker failure.
    fn check(&self, result: &WorkerResult) -> Result<(), ApiError> {
        if result.is_completed() {
            return Ok(());
        }
        let detail = result
            .failure
            .as_ref()
            .map(|f| f.to_string())
            .unwrap_or_else(|| "no detail".into());
        Err(ApiError::server(
            StatusCode::BAD_GATEWAY,
            "worker_failed",
            format!("the worker reported a failed result ({detail}): resubmit the request"),
        ))
    }
}

/// Drains one request's deliveries into SSE frames.
struct Pump {
    exchange: Exchange,
    tracker: Arc<Tracker>,
    out: mpsc::Sender<Bytes>,
    text: OutputText,
    /// Output tokens turned into frames so far (the next expected delta index).
    emitted: u32,
}

impl Pump {
    async fn run(mut self, mut rx: DeliveryStream, first: Delivery, mut timing: Timing) {
        if let Some(role) = self.exchange.shape.role_chunk()
            && !self.send(role).await
        {
            return;
        }
        let mut next = Some(first);
        let endpoint = self.exchange.shape.endpoint.label();
        loop {
            let delivery = match next.take() {
                Some(d) => d,
                None => tokio::select! {
                    biased;
                    _ = self.out.closed() => {
                        // The body was dropped: the client went away.
                        self.tracker.cancel("disconnected");
                        return;
                    }
                    d = rx.recv() => match d {
                        Some(d) => d,
                        None => {
                            self.tracker.finish("lost");
                            self.fail(&ApiError::lost()).await;
                            return;
                        }
                    },
                },
            };
            match delivery.kind {
                DeliveryKind::Delta { token, index } => {
                    timing.delta(&self.exchange.metrics, endpoint);
                    if index < self.emitted {
                        continue; // a duplicate delivery
                    }
                    self.emitted = index.saturating_add(1);
                    let piece = self.text.push(token);
                    if !piece.is_empty()
                        && !self.send(self.exchange.shape.content_chunk(&piece)).await
                    {
                        return;
                    }
                }
                DeliveryKind::Completed { result } => {
                    if let Err(e) = self.exchange.check(&result) {
                        self.tracker.finish("failed");
                        self.fail(&e).await;
                    } else {
                        self.tracker.finish("completed");
                        self.complete(&result).await;
                    }
                    return;
                }
                DeliveryKind::Error { error } => {
                    self.tracker.finish("failed");
                    self.fail(&ApiError::from_router(&error)).await;
                    return;
                }
                DeliveryKind::Cancelled => {
                    self.tracker.finish("cancelled");
                    self.fail(&ApiError::cancelled_by_router()).await;
                    return;
                }
            }
        }
    }

    async fn complete(&mut self, result: &WorkerResult) {
        let shape = &self.exchange.shape;
        // Tokens in the result that no delta carried (a router that batches deltas).
        let mut rest = String::new();
        for t in result.tokens.iter().skip(self.emitted as usize) {
            rest.push_str(&self.text.push(*t));
        }
        rest.push_str(&self.text.finish());
        let mut frames = Vec::with_capacity(4);
        if !rest.is_empty() {
            frames.push(shape.content_chunk(&rest));
        }
        frames.push(shape.finish_chunk(finish_reason(result, self.exchange.limit)));
        if shape.include_usage {
            let usage = Usage::from_result(self.exchange.prompt_tokens, result);
            frames.push(shape.usage_chunk(&usage));
        }
        frames.push(Bytes::from_static(DONE));
        for f in frames {
            if !self.send(f).await {
                return;
            }
        }
    }

    /// An error after the stream started: flush held-back text, the error frame, `[DONE]`.
    async fn fail(&mut self, error: &ApiError) {
        let rest = self.text.finish();
        if !rest.is_empty() && !self.send(self.exchange.shape.content_chunk(&rest)).await {
            return;
        }
        if self.send(error_frame(error)).await {
            self.send(Bytes::from_static(DONE)).await;
        }
    }

    /// Queue a frame; false when the client is gone or too slow (the request is then
    /// cancelled and the pump stops).
    async fn send(&self, frame: Bytes) -> bool {
        let frame = match self.out.try_send(frame) {
            Ok(()) => return true,
            Err(TrySendError::Closed(_)) => {
                self.tracker.cancel("disconnected");
                return false;
            }
            Err(TrySendError::Full(frame)) => frame,
        };
        match tokio::time::timeout(self.exchange.slow_client_timeout, self.out.send(frame)).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) => {
                self.tracker.cancel("disconnected");
                false
            }
            Err(_) => {
                tracing::info!(
                    request = %self.tracker.id,
                    timeout_ms = self.exchange.slow_client_timeout.as_millis() as u64,
                    "client too slow: its stream queue stayed full; cancelling the request"
                );
                self.tracker.cancel_slow();
                false
            }
        }
    }
}

/// The SSE response body: frames from the pump, coalesced when several are ready.
/// Dropping it before the terminal cancels the request (via the guard).
struct SseBody {
    frames: mpsc::Receiver<Bytes>,
    guard: CancelOnDrop,
    aborted: bool,
}

impl Stream for SseBody {
    type Item = Result<Bytes, io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.aborted {
            return Poll::Ready(None);
        }
        if this.guard.0.is_slow() {
            // An error makes hyper abort the response: the client sees the stream cut
            // without `[DONE]`, not a clean end.
            this.aborted = true;
            return Poll::Ready(Some(Err(io::Error::other(
                "client too slow: the request was cancelled",
            ))));
        }
        match this.frames.poll_recv(cx) {
            Poll::Ready(Some(first)) => {
                let mut buf: Option<BytesMut> = None;
                while buf.as_ref().map_or(first.len(), BytesMut::len) < COALESCE_BYTES {
                    match this.frames.try_recv() {
                        Ok(more) => buf
                            .get_or_insert_with(|| {
                                let mut b = BytesMut::with_capacity(first.len() * 8);
                                b.extend_from_slice(&first);
                                b
                            })
                            .extend_from_slice(&more),
                        Err(_) => break,
                    }
                }
                Poll::Ready(Some(Ok(buf.map_or(first, BytesMut::freeze))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// TTFT and inter-token latency as seen at the ingress.
struct Timing {
    started: Instant,
    last: Option<Instant>,
}

impl Timing {
    fn new(started: Instant) -> Self {
        Timing {
            started,
            last: None,
        }
    }

    fn delta(&mut self, metrics: &Metrics, endpoint: &str) {
        let now = Instant::now();
        match self.last {
            None => metrics.histogram_observe(
                "den_ingress_ttft_ms",
                "Time to first token at the ingress (request received to first delta), ms.",
                LATENCY_MS_BUCKETS,
                &[("endpoint", endpoint)],
                ms(now - self.started),
            ),
            Some(last) => metrics.histogram_observe(
                "den_ingress_inter_token_ms",
                "Time between consecutive deltas at the ingress, ms.",
                LATENCY_MS_BUCKETS,
                &[("endpoint", endpoint)],
                ms(now - last),
            ),
        }
        self.last = Some(now);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A JSON response with the given status.
pub fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
