//! What the router's and the worker's ends of the control-channel WebSocket share.

use std::future::Future;
use std::time::Duration;

use futures_util::{Sink, SinkExt, Stream, StreamExt};

/// The read buffer of the router ↔ worker WebSockets. tungstenite zero-fills the free
/// part of its read buffer before every read — 128 KiB by default, most of it on the
/// frames of a single request (an offer, a result: well under 4 KiB) — so a smaller one
/// takes that memset off every frame; a larger frame still arrives whole, in more reads.
pub const READ_BUFFER: usize = 16 * 1024;

/// Frames written with one flush at most.
const WRITE_BATCH: usize = 64;

/// Sends `first` and what `more` yields — the frames already queued behind it, up to
/// `WRITE_BATCH` (64) in all — with one flush: a token and the result that follows it, or a
/// burst of offers, go as one write and one segment, not one each.
pub async fn send_batch<S, M>(
    sink: &mut S,
    first: M,
    mut more: impl FnMut() -> Option<M>,
) -> Result<(), S::Error>
where
    S: Sink<M> + Unpin,
{
    sink.feed(first).await?;
    for _ in 1..WRITE_BATCH {
        match more() {
            Some(m) => sink.feed(m).await?,
            None => break,
        }
    }
    sink.flush().await
}

/// How long a closing end may take to send its last frames and hear the peer's close; a
/// peer that does not read, or never answers, cannot hold it (or a process exit) longer.
pub const GOODBYE: Duration = Duration::from_secs(5);

/// Ends a connection without losing its last frames: waits, at most [`GOODBYE`], for
/// `writer` (which sends what is queued, then the close frame) while reading on —
/// discarding — until the peer answers the close or the stream ends. A socket closed
/// with unread bytes in it is reset, and a reset makes the peer's kernel discard what the
/// peer had not read yet: those last frames included.
pub async fn goodbye<St, M, E>(writer: impl Future, stream: &mut St, is_close: impl Fn(&M) -> bool)
where
    St: Stream<Item = Result<M, E>> + Unpin,
{
    let read_off = async {
        while let Some(Ok(msg)) = stream.next().await {
            if is_close(&msg) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(GOODBYE, futures_util::future::join(writer, read_off)).await;
}
