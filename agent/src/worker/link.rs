//! The worker's connection to the router: connect out, authenticate with the shared
//! token in the upgrade request, say `hello`, wait for `welcome`, then relay frames both
//! ways until the connection ends — and start over with exponential backoff (100 ms,
//! doubling, capped at 5 s, with a little jitter so a fleet does not reconnect in step).

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::http::header::AUTHORIZATION;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use den_protocol::ids::WorkerId;
use den_protocol::wire::{Hello, ToRouter, Welcome, WorkerInbound, decode_for_worker, encode_text};

use crate::auth::Token;
use crate::metrics::Metrics;
use crate::worker::faults::{Faults, Outbound};

/// Frames buffered towards the router before the connection counts as stuck.
pub const OUTBOUND_QUEUE: usize = 4096;

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(5);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const SHUTTING_DOWN: &str = "worker is shutting down";

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// `ws://host:port/v1/agents` (see [`agents_url`]).
    pub url: String,
    pub token: Option<Token>,
    pub hello: Hello,
    pub max_frame: usize,
}

/// What the link tells the worker actor.
#[derive(Debug)]
pub enum LinkEvent {
    /// Connected and welcomed; frames for the router go into `tx`.
    Up {
        conn: u64,
        tx: mpsc::Sender<String>,
        welcome: Welcome,
    },
    /// A frame for this worker.
    Inbound { conn: u64, message: WorkerInbound },
    /// The connection ended.
    Down { conn: u64, reason: String },
}

/// The router's worker endpoint from what an operator typed: `ws://`, `wss://`,
/// `http://` or `https://`, with or without the `/v1/agents` path.
pub fn agents_url(router: &str) -> Result<String, String> {
    let r = router.trim().trim_end_matches('/');
    let (scheme, rest) = r.split_once("://").ok_or_else(|| {
        format!("router address {router:?} has no scheme: use e.g. ws://10.0.0.1:7070 or http://10.0.0.1:7070")
    })?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "ws" | "http" => "ws",
        "wss" | "https" => "wss",
        other => {
            return Err(format!(
                "router address {router:?} has scheme {other:?}: use ws://, wss://, http:// or https://"
            ));
        }
    };
    if rest.is_empty() {
        return Err(format!("router address {router:?} has no host"));
    }
    if rest.contains('/') {
        Ok(format!("{scheme}://{rest}"))
    } else {
        Ok(format!("{scheme}://{rest}/v1/agents"))
    }
}

/// Keep a connection to the router until `stop` turns true.
pub async fn run(
    opts: LinkOptions,
    events: mpsc::Sender<LinkEvent>,
    faults: Arc<Faults>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = BACKOFF_START;
    let mut conn = 0u64;
    while !*stop.borrow() {
        conn += 1;
        match session(conn, &opts, &events, &faults, &metrics, &mut stop).await {
            Ok(reason) => {
                backoff = BACKOFF_START;
                tracing::warn!(conn, "disconnected from the router: {reason}");
                let _ = events.send(LinkEvent::Down { conn, reason }).await;
            }
            Err(e) => tracing::warn!(
                router = %opts.url,
                retry_in_ms = backoff.as_millis() as u64,
                "cannot connect to the router: {e}"
            ),
        }
        if *stop.borrow() {
            break;
        }
        metrics.counter_add(
            "den_worker_reconnects_total",
            "Connection attempts to the router after the first.",
            &[],
            1.0,
        );
        let pause = backoff + jitter(backoff / 5);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
        backoff = (backoff * 2).min(BACKOFF_CAP);
    }
}

/// One connection: `Err` when it never got to `welcome`, `Ok(reason)` when an
/// established session ended.
async fn session(
    conn: u64,
    opts: &LinkOptions,
    events: &mpsc::Sender<LinkEvent>,
    faults: &Arc<Faults>,
    metrics: &Metrics,
    stop: &mut watch::Receiver<bool>,
) -> Result<String, String> {
    let mut request = opts
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| format!("invalid router URL {}: {e}", opts.url))?;
    if let Some(t) = &opts.token {
        let value = HeaderValue::from_str(&t.bearer())
            .map_err(|_| "the token contains characters not allowed in a header".to_owned())?;
        request.headers_mut().insert(AUTHORIZATION, value);
    }
    let config = WebSocketConfig::default()
        .max_message_size(Some(opts.max_frame))
        .max_frame_size(Some(opts.max_frame))
        .read_buffer_size(crate::ws::READ_BUFFER);
    let connector = crate::tls::ws_connector(opts.url.as_str())?;
    let connect =
        tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, connector);
    let (ws, _) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connect).await {
        Err(_) => return Err("timed out".into()),
        Ok(Err(WsError::Http(response))) => {
            let body = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).trim().to_owned())
                .unwrap_or_default();
            return Err(format!(
                "the router refused the connection ({}): {body}",
                response.status()
            ));
        }
        Ok(Err(e)) => return Err(crate::tls::explain_ws_error(&e)),
        Ok(Ok(ws)) => ws,
    };
    let (mut sink, mut stream) = ws.split();
    let hello = encode_text(&ToRouter::Hello(opts.hello.clone())).map_err(|e| e.to_string())?;
    sink.send(Message::text(hello))
        .await
        .map_err(|e| format!("sending hello failed: {e}"))?;
    let me = &opts.hello.worker_id;
    let welcome = match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.next()).await {
        Err(_) => return Err("no answer to hello".into()),
        Ok(None) => return Err("the router closed the connection after hello".into()),
        Ok(Some(Err(e))) => return Err(e.to_string()),
        Ok(Some(Ok(msg))) => match inbound(&msg, opts.max_frame, me) {
            Some(Ok(WorkerInbound::Welcome(w))) => w,
            Some(Ok(WorkerInbound::Refused(r))) => {
                return Err(format!(
                    "the router refused this worker ({:?}): {}",
                    r.reason, r.detail
                ));
            }
            Some(Ok(other)) => return Err(format!("expected welcome, got {other:?}")),
            Some(Err(e)) => return Err(format!("bad answer to hello: {e}")),
            None => return Err("the router closed the connection after hello".into()),
        },
    };
    tracing::info!(conn, router = %opts.url, "connected to the router");
    let (tx, rx) = mpsc::channel::<String>(OUTBOUND_QUEUE);
    let writer = tokio::spawn(write_frames(sink, rx, Arc::clone(faults)));
    if events
        .send(LinkEvent::Up { conn, tx, welcome })
        .await
        .is_err()
    {
        writer.abort();
        return Ok(SHUTTING_DOWN.into());
    }
    let mut unknown_logged = false;
    let reason = loop {
        let msg = tokio::select! {
            m = stream.next() => m,
            _ = stop.changed() => break SHUTTING_DOWN.to_owned(),
        };
        let msg = match msg {
            None => break "the router closed the connection".to_owned(),
            Some(Err(e)) => break e.to_string(),
            Some(Ok(m)) => m,
        };
        if let Message::Close(frame) = &msg {
            break match frame {
                Some(f) if !f.reason.is_empty() => format!("closed by the router: {}", f.reason),
                _ => "closed by the router".to_owned(),
            };
        }
        if faults.drop_inbound() {
            metrics.counter_add(
                "den_fault_dropped_frames_total",
                "Frames from the router dropped by fault injection (--fault-admin).",
                &[],
                1.0,
            );
            continue;
        }
        match inbound(&msg, opts.max_frame, me) {
            None => {}
            Some(Ok(WorkerInbound::Ignored { .. })) => {}
            Some(Ok(WorkerInbound::Refused(r))) => {
                break format!("refused by the router ({:?}): {}", r.reason, r.detail);
            }
            Some(Ok(message)) => {
                if matches!(&message, WorkerInbound::Router(m) if m.kind() == "offer") {
                    crate::hops::mark(crate::hops::Hop::OfferRead);
                }
                let sent = events.send(LinkEvent::Inbound { conn, message }).await;
                if sent.is_err() {
                    break SHUTTING_DOWN.to_owned();
                }
            }
            // A newer router's message type passes (spec: unrelated messages pass
            // unchanged), logged once; a broken frame of a known type is an error.
            Some(Err(den_protocol::wire::CodecError::UnknownType { ty })) if !unknown_logged => {
                unknown_logged = true;
                tracing::debug!("ignoring frames of unknown type {ty:?} from the router");
            }
            Some(Err(den_protocol::wire::CodecError::UnknownType { .. })) => {}
            Some(Err(e)) => tracing::error!("ignoring a frame from the router: {e}"),
        }
    };
    if *stop.borrow() || events.is_closed() {
        // The worker is stopping: the actor has ended and dropped its sender, so the
        // writer ends once it has sent what the actor queued last — a drained request's
        // final token and result — and the close frame. Waited for: the process exits
        // right after this, and a writer still flushing would be cut off mid-stream.
        // (Otherwise the actor still holds the sender until it hears `Down`.)
        crate::ws::goodbye(writer, &mut stream, |m| matches!(m, Message::Close(_))).await;
    } else {
        // The writer ends when the actor drops its sender (on `Down`) or the socket fails.
        drop(writer);
    }
    Ok(reason)
}

/// Sends the actor's frames to the router until the actor drops its sender, then
/// closes. With `--fault-admin`, the outbound fault injector may duplicate, reorder or
/// delay them; otherwise every frame goes as is, in order.
async fn write_frames<S>(mut sink: S, mut rx: mpsc::Receiver<String>, faults: Arc<Faults>)
where
    S: futures_util::Sink<Message, Error = WsError> + Unpin,
{
    // Frames held back by the delay fault, each with the instant it is due: a constant
    // latency, not one that grows with every frame queued behind it.
    let mut late: std::collections::VecDeque<(tokio::time::Instant, String)> =
        std::collections::VecDeque::new();
    loop {
        let due = late.front().map(|(at, _)| *at);
        let next = tokio::select! {
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)),
                if due.is_some() => {
                if let Some((_, text)) = late.pop_front()
                    && sink.send(Message::text(text)).await.is_err()
                {
                    return;
                }
                continue;
            }
            next = rx.recv() => next,
        };
        let Some(text) = next else { break };
        let mode = faults.outbound();
        if mode == Outbound::Delay {
            let at =
                tokio::time::Instant::now() + Duration::from_millis(faults.outbound_delay_ms());
            late.push_back((at, text));
            continue;
        }
        // The delay fault was lifted: what it held goes first, in order.
        while let Some((_, held)) = late.pop_front() {
            if sink.send(Message::text(held)).await.is_err() {
                return;
            }
        }
        let sent = match mode {
            Outbound::AsIs | Outbound::Delay => {
                let more = || rx.try_recv().ok().map(Message::text);
                crate::ws::send_batch(&mut sink, Message::text(text), more).await
            }
            Outbound::Duplicate => match sink.send(Message::text(text.clone())).await {
                Ok(()) => sink.send(Message::text(text)).await,
                Err(e) => Err(e),
            },
            Outbound::Reorder => {
                match tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
                    Ok(Some(next)) => match sink.send(Message::text(next)).await {
                        Ok(()) => sink.send(Message::text(text)).await,
                        Err(e) => Err(e),
                    },
                    // No partner in time (or the channel closed): the frame goes alone.
                    _ => sink.send(Message::text(text)).await,
                }
            }
        };
        if sent.is_err() {
            return;
        }
    }
    let _ = sink.send(Message::Close(None)).await;
    let _ = sink.close().await;
}

/// Decode a text or binary frame; `None` for control frames.
fn inbound(
    msg: &Message,
    max_frame: usize,
    me: &WorkerId,
) -> Option<Result<WorkerInbound, den_protocol::wire::CodecError>> {
    match msg {
        Message::Text(t) => Some(decode_for_worker(t.as_bytes(), max_frame, me)),
        Message::Binary(b) => Some(decode_for_worker(b, max_frame, me)),
        _ => None,
    }
}

/// Up to `max` of pseudo-random delay (from the clock; good enough to spread reconnects).
fn jitter(max: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let span = max.as_nanos().max(1) as u64;
    Duration::from_nanos(nanos % span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use den_protocol::ids::{AssignmentId, Epoch, NodeId};
    use den_protocol::wire::{
        Cancel, OutboundToWorker, PROTOCOL_VERSION, RouterHandshake, RouterMessage,
    };

    #[test]
    fn router_addresses_normalise_to_the_agents_endpoint() {
        assert_eq!(
            agents_url("http://127.0.0.1:7070").unwrap(),
            "ws://127.0.0.1:7070/v1/agents"
        );
        assert_eq!(agents_url("ws://h:1/").unwrap(), "ws://h:1/v1/agents");
        assert_eq!(
            agents_url("https://h/v1/agents").unwrap(),
            "wss://h/v1/agents"
        );
        assert!(
            agents_url("127.0.0.1:7070")
                .unwrap_err()
                .contains("no scheme")
        );
        assert!(agents_url("ftp://h").unwrap_err().contains("ftp"));
    }

    /// A stopping worker's last frames reach the router before its link returns: the
    /// process exits right after, and a writer still flushing would be cut off — a
    /// drained request's final token and result lost (seen once in `tests/run`, as
    /// `agents_sigterm_drains_in_flight_work_then_exits` failing). The worker side runs
    /// on its own current-thread runtime, dropped as soon as the link returns as a
    /// process exit drops it; the router side is slow to read at first, so the frames
    /// (more than the socket buffers hold) cannot all be out before the link stops. The
    /// router side also sends cancels the worker never takes (its actor is gone), so the
    /// link stops with unread bytes: unless it reads them off before it closes, the
    /// close is a reset, and the reset discards its last frames on the router's side.
    #[test]
    fn a_stopping_link_sends_what_the_actor_queued_last_and_closes() {
        const FRAMES: usize = 160;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let router = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let (stream, _) = listener.accept().await.unwrap();
                let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
                let _hello = ws.next().await;
                let welcome = encode_text(&RouterHandshake::Welcome(Welcome {
                    protocol_version: PROTOCOL_VERSION,
                    heartbeat_interval_ms: 1000,
                    heartbeat_timeout_ms: 5000,
                }))
                .unwrap();
                ws.send(Message::text(welcome)).await.unwrap();
                // Cancels the worker has not read when it stops (its actor, which takes
                // them, is gone): closing over unread bytes would reset the connection,
                // and the reset would discard the worker's last frames still unread here.
                let cancel = encode_text(&OutboundToWorker {
                    to: WorkerId::new("w"),
                    message: RouterMessage::Cancel(Cancel {
                        assignment: AssignmentId::new("r", 1),
                    }),
                })
                .unwrap();
                let (mut sink, mut stream) = ws.split();
                let cancels = tokio::spawn(async move {
                    for _ in 0..4_000 {
                        if sink.send(Message::text(cancel.clone())).await.is_err() {
                            break;
                        }
                    }
                    sink
                });
                tokio::time::sleep(Duration::from_millis(300)).await;
                let (mut frames, mut closed) = (0, false);
                while let Some(Ok(m)) = stream.next().await {
                    match m {
                        Message::Text(_) => frames += 1,
                        Message::Close(_) => {
                            closed = true;
                            break;
                        }
                        _ => {}
                    }
                }
                drop(cancels.await);
                (frames, closed)
            })
        });
        let worker = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        worker.block_on(async {
            let opts = LinkOptions {
                url: format!("ws://{addr}/v1/agents"),
                token: None,
                hello: Hello {
                    protocol_version: PROTOCOL_VERSION,
                    worker_id: WorkerId::new("w"),
                    node: NodeId::new("n"),
                    epoch: Epoch(1),
                    credential: None,
                },
                max_frame: 1 << 20,
            };
            let (events_tx, mut events) = mpsc::channel(16);
            let (stop_tx, mut stop_rx) = watch::channel(false);
            let link = tokio::spawn(async move {
                let (faults, metrics) = (Arc::new(Faults::default()), Metrics::new());
                session(1, &opts, &events_tx, &faults, &metrics, &mut stop_rx).await
            });
            let Some(LinkEvent::Up { tx, .. }) = events.recv().await else {
                panic!("the link did not come up");
            };
            let big = "x".repeat(64 * 1024);
            for i in 0..FRAMES {
                tx.try_send(format!("{{\"type\":\"pad\",\"i\":{i},\"x\":\"{big}\"}}"))
                    .unwrap();
            }
            // What the actor does as it stops: its sender and its inbox go, then the
            // link is told.
            drop(tx);
            drop(events);
            stop_tx.send(true).unwrap();
            assert_eq!(link.await.unwrap().unwrap(), SHUTTING_DOWN);
        });
        drop(worker);
        let (frames, closed) = router.join().unwrap();
        assert_eq!(frames, FRAMES, "frames queued before the stop went missing");
        assert!(closed, "the link ended without a close frame");
    }
}
