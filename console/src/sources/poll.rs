//! Polling a Skulk-compatible management API with bounded deadlines.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use den_protocol::evidence::{PollFailure, PollFailureKind};
use den_protocol::ids::NodeId;
use den_protocol::session::{SessionEvent, SourceId};
use den_protocol::skulk::State;
use den_protocol::skulk::api::ModelList;

/// How often the catalog (`GET /v1/models`) is read, and how many ids are kept of it.
const CATALOG_EVERY: Duration = Duration::from_secs(60);
const CATALOG_MAX: usize = 4_096;

use super::PollConfig;
use crate::http::{ClientError, ManagementClient};

/// Poll `GET /node_id` and `GET /state` every interval until the receiver goes away;
/// with `poll.catalog`, the catalog too (after the first state, then once a minute).
pub async fn run(
    source: SourceId,
    client: ManagementClient,
    poll: PollConfig,
    tx: mpsc::Sender<SessionEvent>,
) {
    let mut catalog_at: Option<Instant> = None;
    loop {
        let started = Instant::now();
        // The identity is rechecked every cycle: a reachable port alone does not say
        // which node is behind it.
        if let Ok((node, _)) = client.get_json::<NodeId>("/node_id").await {
            let event = SessionEvent::SkulkNodeId {
                source: source.clone(),
                node,
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
        let asked = Instant::now();
        let event = match client.get_json::<State>("/state").await {
            Ok((state, latency)) => SessionEvent::SkulkState {
                source: source.clone(),
                state: Box::new(state),
                latency_ms: millis(latency),
                received_unix_ms: Some(crate::commands::place::clock::unix_now_ms()),
            },
            Err(e) => SessionEvent::PollFailed {
                source: source.clone(),
                endpoint: "/state".to_owned(),
                failure: failure(e),
                latency_ms: millis(asked.elapsed()),
            },
        };
        if tx.send(event).await.is_err() {
            return;
        }
        // The catalog changes rarely and is for completion only: never before the state.
        if poll.catalog && catalog_at.is_none_or(|t| t.elapsed() >= CATALOG_EVERY) {
            catalog_at = Some(started);
            if let Ok((list, _)) = client.get_json::<ModelList>("/v1/models").await {
                let models = list
                    .data
                    .into_iter()
                    .take(CATALOG_MAX)
                    .map(|m| m.id)
                    .collect();
                let event = SessionEvent::SkulkCatalog {
                    source: source.clone(),
                    models,
                };
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
        tokio::time::sleep(poll.interval.saturating_sub(started.elapsed())).await;
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A client error as the evidence reducer's typed poll failure.
pub fn failure(e: ClientError) -> PollFailure {
    match e {
        ClientError::Transport(detail) => PollFailure {
            kind: if detail.contains("timed out") {
                PollFailureKind::Timeout
            } else {
                PollFailureKind::Transport
            },
            detail,
        },
        ClientError::Api(api) => PollFailure {
            kind: PollFailureKind::Http(api.status()),
            detail: api.to_string(),
        },
        ClientError::Decode { path, detail } => PollFailure {
            kind: PollFailureKind::Decode,
            detail: format!("{path}: {detail}"),
        },
    }
}
