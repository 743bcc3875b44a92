//! One worker connection on the router side (`GET /v1/agents`, already authenticated).
//!
//! Handshake: the first frame must be `hello` with this build's protocol version; the
//! answer is `welcome` (heartbeat interval and timeout) or `refused` with a reason and a
//! one-line detail, after which the connection is closed. After the handshake every frame
//! is decoded with the frame-size limit and handed to the actor; a malformed, oversized,
//! wrong-version or out-of-place frame gets a `refused` frame and the connection is
//! closed (the worker is detached like on any disconnect). Other connections are never
//! affected.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use den_protocol::discovery::ConnectionId;
use den_protocol::wire::{
    CodecError, PROTOCOL_VERSION, RefusalReason, Refused, RouterHandshake, ToRouter, Welcome,
    decode_for_router, encode_text,
};

use crate::metrics::Metrics;
use crate::router::RouterHandle;
use crate::router::actor::{Command, Outbound};
use crate::router::identity::Admission;

/// Frames buffered towards one worker; a full queue is a send failure (detach).
pub const OUTBOUND_QUEUE: usize = 4096;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// WebSocket close code 1008: policy violation.
const POLICY: u16 = 1008;

/// Serve one upgraded worker socket until it ends.
pub async fn serve(socket: WebSocket, handle: RouterHandle) {
    let _open = handle.shared().sockets.token();
    let conn = ConnectionId(handle.next_connection());
    let max_frame = handle.options().max_frame;
    let (mut sink, mut stream) = socket.split();

    // --- handshake ---------------------------------------------------------------------
    let first = match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.next()).await {
        Ok(Some(Ok(msg))) => msg,
        Ok(Some(Err(e))) => {
            tracing::debug!(conn = conn.0, "worker socket failed before hello: {e}");
            return;
        }
        Ok(None) => return,
        Err(_) => {
            refuse(
                &handle,
                &mut sink,
                RefusalReason::Malformed,
                "no hello within 10 s".into(),
            )
            .await;
            return;
        }
    };
    let hello = match frame_bytes(&first).map(|b| decode_for_router(b, max_frame)) {
        Some(Ok(ToRouter::Hello(h))) => h,
        Some(Ok(other)) => {
            let detail = format!("the first frame must be hello, not {}", other.kind());
            refuse(&handle, &mut sink, RefusalReason::Malformed, detail).await;
            return;
        }
        Some(Err(e)) => {
            refuse(&handle, &mut sink, reason_of(&e), e.to_string()).await;
            return;
        }
        None => {
            let detail = "the first frame must be a text frame holding hello".to_owned();
            refuse(&handle, &mut sink, RefusalReason::Malformed, detail).await;
            return;
        }
    };
    match handle.admit_identity(&hello.worker_id, hello.credential.as_deref()) {
        Admission::Pinned | Admission::Known => {}
        Admission::Unproven => tracing::warn!(
            worker = %hello.worker_id,
            conn = conn.0,
            "worker sent no credential (an older den-agent): admitted, but its name is not protected"
        ),
        Admission::Refused(detail) => {
            tracing::warn!(worker = %hello.worker_id, conn = conn.0, "refused: {detail}");
            refuse(&handle, &mut sink, RefusalReason::Unauthorized, detail).await;
            return;
        }
    }
    // Past the drain the actor is gone and cannot say why (it told the workers it had);
    // a worker that connects in the moment before the listener stops is told here.
    if *handle.shared().closing.borrow() {
        let detail = "the router is shutting down".to_owned();
        refuse(&handle, &mut sink, RefusalReason::Shutdown, detail).await;
        return;
    }
    let o = handle.options();
    let welcome = RouterHandshake::Welcome(Welcome {
        protocol_version: PROTOCOL_VERSION,
        heartbeat_interval_ms: o.heartbeat_interval.as_millis().max(1) as u64,
        heartbeat_timeout_ms: o.heartbeat_timeout.as_millis().max(1) as u64,
    });
    if send_frame(&mut sink, &welcome).await.is_err() {
        return;
    }
    let (outbound, mut rx) = mpsc::channel::<Outbound>(OUTBOUND_QUEUE);
    handle
        .send(Command::Connected {
            conn,
            worker: hello.worker_id.clone(),
            node: hello.node.clone(),
            outbound: outbound.clone(),
        })
        .await;

    // --- writer --------------------------------------------------------------------------
    let metrics = Arc::clone(handle.metrics());
    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            let refusal = match out {
                Outbound::Frame(text) => {
                    // A refusal queued behind frames goes after them.
                    let mut refusal = None;
                    let more = || match rx.try_recv() {
                        Ok(Outbound::Frame(t)) => Some(Message::text(t)),
                        Ok(Outbound::Refuse { reason, detail }) => {
                            refusal = Some((reason, detail));
                            None
                        }
                        Err(_) => None,
                    };
                    if crate::ws::send_batch(&mut sink, Message::text(text), more)
                        .await
                        .is_err()
                    {
                        return;
                    }
                    refusal
                }
                Outbound::Refuse { reason, detail } => Some((reason, detail)),
            };
            if let Some((reason, detail)) = refusal {
                send_refusal(&metrics, &mut sink, reason, detail).await;
                return;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    });

    // --- reader --------------------------------------------------------------------------
    // A worker sends its first heartbeat well inside the timeout it was just told; a
    // connection that says hello and then nothing is dead or hostile, and holding it open
    // would only spend a descriptor. After that first frame, silence is discovery's
    // business: a paused worker is detached but keeps its socket, so its late frames
    // still arrive on it and are fenced there.
    // Once the router's actor stops (shutdown), nothing would take this connection's
    // frames any more: stop reading, so the writer sends the `refused` the actor queued
    // last and the connection closes.
    let silence = o.heartbeat_timeout.max(Duration::from_millis(1));
    let mut closing = handle.shared().closing.subscribe();
    let mut heard = false;
    let mut unknown_logged = false;
    loop {
        let next = tokio::select! {
            biased;
            _ = closing.wait_for(|closed| *closed) => break,
            next = async {
                if heard {
                    Ok(stream.next().await)
                } else {
                    tokio::time::timeout(silence, stream.next()).await
                }
            } => next,
        };
        let next = match next {
            Ok(next) => next,
            Err(_) => {
                tracing::warn!(
                    worker = %hello.worker_id,
                    conn = conn.0,
                    "closing the connection: no frame after hello within the heartbeat timeout ({} ms)",
                    silence.as_millis()
                );
                handle.metrics().counter_add(
                    "den_router_silent_closed_total",
                    "Worker connections closed because no frame followed hello within the heartbeat timeout.",
                    &[],
                    1.0,
                );
                break;
            }
        };
        let msg = match next {
            None => break,
            Some(Err(e)) => {
                tracing::warn!(worker = %hello.worker_id, conn = conn.0, "worker socket error: {e}");
                break;
            }
            Some(Ok(m)) => m,
        };
        if let Message::Close(_) = msg {
            break;
        }
        let Some(bytes) = frame_bytes(&msg) else {
            continue; // ping / pong
        };
        heard = true;
        match decode_for_router(bytes, max_frame) {
            Ok(ToRouter::Hello(_)) => {
                let _ = outbound.try_send(Outbound::Refuse {
                    reason: RefusalReason::Malformed,
                    detail: "hello may be sent only once per connection".into(),
                });
                break;
            }
            Ok(frame) => {
                if matches!(frame, ToRouter::Result(_)) {
                    crate::hops::mark(crate::hops::Hop::ResultRead);
                }
                handle.send(Command::Frame { conn, frame }).await
            }
            // A message type this router does not know (a newer peer's) passes: it is
            // not a protocol violation of the frames both know (spec: unrelated messages
            // pass unchanged). Logged once per connection, counted every time.
            Err(CodecError::UnknownType { ty }) => {
                if !unknown_logged {
                    unknown_logged = true;
                    tracing::debug!(worker = %hello.worker_id, conn = conn.0, "ignoring frames of unknown type {ty:?}");
                }
                handle.metrics().counter_add(
                    "den_router_unknown_frames_total",
                    "Frames of a message type this router does not know, passed over.",
                    &[],
                    1.0,
                );
            }
            Err(e) => {
                tracing::warn!(worker = %hello.worker_id, conn = conn.0, "closing the connection: {e}");
                let _ = outbound.try_send(Outbound::Refuse {
                    reason: reason_of(&e),
                    detail: e.to_string(),
                });
                break;
            }
        }
    }
    handle.send(Command::Disconnected { conn }).await;
    drop(outbound);
    // The writer sends what is left (a `refused` saying why, or the close).
    crate::ws::goodbye(writer, &mut stream, |m| matches!(m, Message::Close(_))).await;
}

/// Answer the handshake with `refused` and close.
async fn refuse<S>(handle: &RouterHandle, sink: &mut S, reason: RefusalReason, detail: String)
where
    S: SinkExt<Message> + Unpin,
{
    tracing::warn!(?reason, "refusing a worker connection: {detail}");
    send_refusal(handle.metrics(), sink, reason, detail).await;
}

/// Counts the refusal, says `refused` and closes with a policy-violation code.
async fn send_refusal<S>(metrics: &Metrics, sink: &mut S, reason: RefusalReason, detail: String)
where
    S: SinkExt<Message> + Unpin,
{
    metrics.counter_add(
        "den_router_refused_total",
        "Worker connections refused or closed for a protocol violation, by reason.",
        &[("reason", reason_label(reason))],
        1.0,
    );
    let frame = RouterHandshake::Refused(Refused {
        reason,
        detail: detail.clone(),
    });
    let _ = send_frame(sink, &frame).await;
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code: POLICY,
            reason: close_reason(&detail).into(),
        })))
        .await;
}

async fn send_frame<S>(sink: &mut S, frame: &RouterHandshake) -> Result<(), ()>
where
    S: SinkExt<Message> + Unpin,
{
    let text = encode_text(frame).map_err(|_| ())?;
    sink.send(Message::text(text)).await.map_err(|_| ())
}

fn frame_bytes(msg: &Message) -> Option<&[u8]> {
    match msg {
        Message::Text(t) => Some(t.as_str().as_bytes()),
        Message::Binary(b) => Some(b),
        _ => None,
    }
}

fn reason_label(reason: RefusalReason) -> &'static str {
    match reason {
        RefusalReason::UnsupportedVersion => "unsupported-version",
        RefusalReason::Unauthorized => "unauthorized",
        RefusalReason::Malformed => "malformed",
        RefusalReason::Shutdown => "shutdown",
    }
}

fn reason_of(e: &CodecError) -> RefusalReason {
    match e {
        CodecError::UnsupportedVersion { .. } => RefusalReason::UnsupportedVersion,
        _ => RefusalReason::Malformed,
    }
}

/// A close frame's reason is limited to 123 bytes.
fn close_reason(detail: &str) -> String {
    let mut out = String::new();
    for c in detail.chars() {
        if out.len() + c.len_utf8() > 120 {
            break;
        }
        out.push(c);
    }
    out
}
