//! What the router's and the worker's ends of the control-channel WebSocket share.

use futures_util::{Sink, SinkExt};

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
