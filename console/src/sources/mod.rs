//! Sources: async tasks that turn servers into session events on a channel.
//!
//! - A Skulk-compatible API is polled: `GET /node_id` and `GET /state` every interval,
//!   each with a bounded deadline; a failure is a `PollFailed` event (its health follows
//!   from the polls).
//! - A den router is polled the same way (it serves the Skulk-compatible API) and also
//!   streams its console feed over a WebSocket, reconnecting with backoff.
//!
//! Tasks send unstamped [`SessionEvent`]s; the single consumer stamps them on receipt,
//! so stamps are monotonic and the order is the order the model applies. Nothing here
//! blocks the UI: the channel is the only meeting point.

mod feed;
mod poll;

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use den_protocol::session::{SessionEvent, SourceKind, redact_url};
use den_protocol::time::Millis;

use crate::config::SourceSpec;
use crate::http::{ManagementClient, UrlError};

pub use feed::feed_url;

/// Milliseconds since the session started: the console's logical time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    pub fn now(&self) -> Millis {
        Millis(u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX))
    }
}

/// How sources poll.
#[derive(Debug, Clone, Copy)]
pub struct PollConfig {
    pub interval: Duration,
    pub timeout: Duration,
    /// Also read each source's model catalog (`GET /v1/models`) for the palette's
    /// completion: the interactive console only; `den status` and `den record` have no
    /// palette and should not wait for it.
    pub catalog: bool,
}

/// The `SourceAdded` event of a spec (URL redacted).
pub fn added(spec: &SourceSpec) -> SessionEvent {
    SessionEvent::SourceAdded {
        source: spec.id.clone(),
        kind: spec.kind,
        url: redact_url(&spec.url),
    }
}

/// Start the tasks of every source. They stop when the receiver is dropped.
pub fn spawn_all(
    specs: &[SourceSpec],
    token: Option<&str>,
    poll: PollConfig,
    tx: &mpsc::Sender<SessionEvent>,
) -> Result<Vec<JoinHandle<()>>, UrlError> {
    let mut tasks = Vec::new();
    for spec in specs {
        let client = ManagementClient::new(&spec.url, token.map(str::to_owned), poll.timeout)?;
        tasks.push(tokio::spawn(poll::run(
            spec.id.clone(),
            client,
            poll,
            tx.clone(),
        )));
        if spec.kind == SourceKind::DenRouter {
            let url = feed_url(&spec.url).ok_or_else(|| UrlError::Base(spec.url.clone()))?;
            tasks.push(tokio::spawn(feed::run(
                spec.id.clone(),
                url,
                token.map(str::to_owned),
                poll.timeout,
                tx.clone(),
            )));
        }
    }
    Ok(tasks)
}
