//! One console feed subscriber (`GET /v1/console`, already authenticated): `hello`, a
//! full snapshot, then every change as it is broadcast. A console that falls behind the
//! broadcast buffer gets a fresh snapshot instead of the frames it missed, so it can
//! always rebuild the whole picture.

use axum::extract::ws::{Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{broadcast, oneshot};

use crate::router::RouterHandle;
use crate::router::actor::Command;

pub async fn serve(socket: WebSocket, handle: RouterHandle) {
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
                if sink.send(Message::text(text)).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = sink.send(Message::Close(None)).await;
}
