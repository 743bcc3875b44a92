//! One console feed subscriber (`GET /v1/console`, already authenticated): `hello`, a
//! full snapshot, then every change as it is broadcast. A console that falls behind the
//! broadcast buffer gets a fresh snapshot instead of the frames it missed, so it can
//! always rebuild the whole picture. A console that stops reading is dropped: a frame
//! its socket has not taken within [`SEND_TIMEOUT`] closes the feed, so a reader that
//! never reads holds one frame, not an ever-growing backlog.

use axum::extract::ws::{Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{broadcast, oneshot};

use crate::router::RouterHandle;
use crate::router::actor::Command;

/// How long one frame may wait for a console's socket before the console is dropped.
pub const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub async fn serve(socket: WebSocket, handle: RouterHandle) {
    let _open = handle.shared().sockets.token();
    let (reply, rx) = oneshot::channel();
    handle.send(Command::Subscribe { reply }).await;
    let Ok((first, mut frames)) = rx.await else {
        return;
    };
    let mut closing = handle.shared().closing.subscribe();
    let (mut sink, mut stream) = socket.split();
    for frame in first {
        if sink.send(Message::text(frame.to_string())).await.is_err() {
            return;
        }
    }
    loop {
        tokio::select! {
            _ = closing.changed() => break,
            incoming = stream.next() => match incoming {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
                Some(Ok(_)) => {} // consoles send nothing we act on
            },
            frame = frames.recv() => {
                let text = match frame {
                    Ok(f) => f.to_string(),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "console fell behind; sending a fresh snapshot");
                        let (reply, rx) = oneshot::channel();
                        handle.send(Command::Snapshot { reply }).await;
                        match rx.await {
                            Ok(s) => s.to_string(),
                            Err(_) => break,
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                };
                match tokio::time::timeout(SEND_TIMEOUT, sink.send(Message::text(text))).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break,
                    Err(_) => {
                        tracing::info!("dropping a console feed that stopped reading");
                        handle.metrics().counter_add(
                            "den_router_feed_dropped_total",
                            "Console feeds closed because the console stopped reading.",
                            &[],
                            1.0,
                        );
                        return;
                    }
                }
            }
        }
    }
    let _ = sink.send(Message::Close(None)).await;
}
