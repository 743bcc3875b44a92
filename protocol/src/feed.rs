//! The console feed: what a den router streams to consoles over `GET /v1/console`
//! (a WebSocket, authenticated with the shared token like worker connections).
//!
//! On connect the router sends `hello`, then a full `snapshot`, then changes as they
//! happen; it repeats the snapshot periodically so that a console (and a recording of
//! it) can always rebuild the whole picture from the latest snapshot plus what followed.
//! Management state (instances, downloads, runners) is not in the feed: consoles poll the
//! router's Skulk-compatible `GET /state` like any other management API.

use serde::{Deserialize, Serialize};

use crate::decision::DecisionRecord;
use crate::ids::{NodeId, RequestId, WorkerId};
use crate::observation::Observation;
use crate::time::Millis;

/// Version of the feed format; a console refuses a feed with another major version.
pub const FEED_VERSION: u32 = 1;

/// Largest feed frame a console accepts (a snapshot of 5 000 routes fits).
pub const MAX_FEED_FRAME: usize = 64 * 1024 * 1024;

/// One feed frame. `at` is the router's logical time (ms since the router started).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum FeedMessage {
    Hello {
        feed_version: u32,
        router: NodeId,
        /// Wall-clock start of the router, for display only.
        started_at_unix_ms: u64,
    },
    /// Everything the router knows right now: live workers and held decision records.
    Snapshot {
        at: Millis,
        workers: Vec<Observation>,
        routes: Vec<DecisionRecord>,
    },
    /// An accepted heartbeat.
    Worker {
        at: Millis,
        observation: Box<Observation>,
    },
    /// A worker was detached (heartbeat expired, disconnected, send failed).
    WorkerGone {
        at: Millis,
        worker: WorkerId,
        reason: String,
    },
    /// A decision record changed (submitted, offered, declined, first token, finished…).
    Route {
        at: Millis,
        record: Box<DecisionRecord>,
    },
    /// A terminal record was garbage-collected.
    RouteGone { at: Millis, request: RequestId },
}

impl FeedMessage {
    /// The router time of the frame (0 for `hello`).
    pub fn at(&self) -> Millis {
        match self {
            FeedMessage::Hello { .. } => Millis::ZERO,
            FeedMessage::Snapshot { at, .. }
            | FeedMessage::Worker { at, .. }
            | FeedMessage::WorkerGone { at, .. }
            | FeedMessage::Route { at, .. }
            | FeedMessage::RouteGone { at, .. } => *at,
        }
    }
}

/// A feed frame that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    #[error("feed frame of {len} bytes exceeds the {limit}-byte limit")]
    TooLarge { len: usize, limit: usize },
    #[error("malformed feed frame: {0}")]
    Malformed(String),
    #[error(
        "router speaks feed version {got}, this console speaks {supported}: upgrade the older side"
    )]
    UnsupportedVersion { got: u32, supported: u32 },
}

/// Decode one frame, enforcing the size limit and the feed version.
pub fn decode(bytes: &[u8], max_frame: usize) -> Result<FeedMessage, FeedError> {
    if bytes.len() > max_frame {
        return Err(FeedError::TooLarge {
            len: bytes.len(),
            limit: max_frame,
        });
    }
    let msg: FeedMessage = serde_json::from_slice(bytes)
        .map_err(|e| FeedError::Malformed(crate::text::one_line(&e.to_string())))?;
    if let FeedMessage::Hello { feed_version, .. } = &msg
        && *feed_version != FEED_VERSION
    {
        return Err(FeedError::UnsupportedVersion {
            got: *feed_version,
            supported: FEED_VERSION,
        });
    }
    Ok(msg)
}

/// Encode one frame.
pub fn encode(msg: &FeedMessage) -> String {
    // Serialising these plain data types cannot fail (no maps with non-string keys reach
    // JSON here: tier maps serialise their keys as strings).
    serde_json::to_string(msg)
        .unwrap_or_else(|e| format!("{{\"type\":\"error\",\"detail\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_versions_are_checked() {
        let hello = FeedMessage::Hello {
            feed_version: FEED_VERSION,
            router: "r".into(),
            started_at_unix_ms: 1,
        };
        assert_eq!(
            decode(encode(&hello).as_bytes(), MAX_FEED_FRAME).unwrap(),
            hello
        );
        let worker = FeedMessage::Worker {
            at: Millis(5),
            observation: Box::new(Observation::new("w", "n")),
        };
        assert_eq!(
            decode(encode(&worker).as_bytes(), MAX_FEED_FRAME).unwrap(),
            worker
        );
        let future = encode(&FeedMessage::Hello {
            feed_version: 99,
            router: "r".into(),
            started_at_unix_ms: 1,
        });
        assert!(matches!(
            decode(future.as_bytes(), MAX_FEED_FRAME),
            Err(FeedError::UnsupportedVersion { got: 99, .. })
        ));
        assert!(matches!(
            decode(b"{", MAX_FEED_FRAME),
            Err(FeedError::Malformed(_))
        ));
        assert!(matches!(
            decode(&[b' '; 10], 5),
            Err(FeedError::TooLarge { len: 10, limit: 5 })
        ));
    }
}
