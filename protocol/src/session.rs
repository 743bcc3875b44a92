//! Console sessions: the input events of the operator console, with their time.
//!
//! Everything the console shows is a pure function of an ordered list of [`Stamped`]
//! events: what each source said (den console feed frames, Skulk `/state` and `/node_id`
//! answers, poll failures, connection changes) and what the operator did (commands,
//! their progress and outcomes). The live console stamps each event when it receives
//! it; a recording (issue 6) stores exactly these values, one per line, and a replay
//! feeds them back through the same reducer, so that the replayed screen is the one the
//! operator saw. Keystrokes and wall-clock times are deliberately not part of it
//! (anchors §9: record semantic events and state, not keystrokes).
//!
//! Redaction is by construction: no event carries a token, a request payload or a
//! prompt. Source URLs are stored through [`redact_url`] (no user info, no query, no
//! fragment). Command texts are what the operator typed into the palette (ids and
//! model names, never prompts).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::evidence::{PollFailure, ProbeOutcome};
use crate::feed::FeedMessage;
use crate::ids::{NodeId, string_id};
use crate::skulk::{InstanceId, State};
use crate::time::Millis;

/// Version of the session event format; a recording written with another major version
/// is refused by the replayer.
pub const SESSION_VERSION: u32 = 1;

string_id!(
    /// The console's name for one source, e.g. `router` or `skulk-2`. Also the endpoint
    /// label of the source in the evidence reducer.
    SourceId
);

/// What kind of server a source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// A den router: the WebSocket console feed plus its Skulk-compatible management API.
    DenRouter,
    /// Any Skulk-compatible management API, polled over HTTP.
    Skulk,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::DenRouter => "router",
            SourceKind::Skulk => "skulk",
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The console's identifier of one operator command (1, 2, … within a session).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct CommandSeq(pub u64);

impl fmt::Display for CommandSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// How a command ended. `Uncertain` means the effect may or may not have happened (the
/// request may have reached the server and no answer came back): the operator must look
/// at the cluster before retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommandStatus {
    Ok,
    Failed,
    Uncertain,
}

impl CommandStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CommandStatus::Ok => "ok",
            CommandStatus::Failed => "failed",
            CommandStatus::Uncertain => "uncertain",
        }
    }

    /// The process exit code of a non-interactive command that ended like this.
    pub fn exit_code(self) -> u8 {
        match self {
            CommandStatus::Ok => 0,
            CommandStatus::Failed => 1,
            CommandStatus::Uncertain => 2,
        }
    }
}

impl fmt::Display for CommandStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One input of the console, stamped with the console's logical time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stamped {
    /// Milliseconds since the console session started.
    pub at: Millis,
    #[serde(flatten)]
    pub event: SessionEvent,
}

impl Stamped {
    pub fn new(at: Millis, event: SessionEvent) -> Stamped {
        Stamped { at, event }
    }
}

/// What happened. Internally tagged by `event`; every variant is plain data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum SessionEvent {
    /// A source was configured. `url` is redacted (see [`redact_url`]).
    SourceAdded {
        source: SourceId,
        kind: SourceKind,
        url: String,
    },
    /// The source answered (feed connected, or a poll succeeded after none or failures).
    Connected { source: SourceId },
    /// The source went away (feed closed or refused, polls began failing).
    Disconnected { source: SourceId, reason: String },
    /// One frame of a den router's console feed.
    Feed {
        source: SourceId,
        message: FeedMessage,
    },
    /// The source's `GET /node_id` answer.
    SkulkNodeId { source: SourceId, node: NodeId },
    /// The model ids of the source's catalog (`GET /v1/models`): what can be placed, for
    /// the palette's completion. Asked at start and once a minute.
    SkulkCatalog {
        source: SourceId,
        models: Vec<crate::skulk::ModelId>,
    },
    /// The source's `GET /state` answer and how long it took.
    SkulkState {
        source: SourceId,
        state: Box<State>,
        latency_ms: u64,
        /// This host's wall clock when the answer arrived (UNIX ms): what the state's
        /// `lastSeen` times are compared with. Recorded, so a replay shows the same ages.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        received_unix_ms: Option<u64>,
    },
    /// A poll of `endpoint` (e.g. `/state`) failed within its deadline.
    PollFailed {
        source: SourceId,
        endpoint: String,
        failure: PollFailure,
        latency_ms: u64,
    },
    /// The outcome of an ordinary inference request sent through `source`'s management
    /// API to test `instance` (a placement's readiness probe). Never the prompt.
    Probe {
        source: SourceId,
        instance: InstanceId,
        outcome: ProbeOutcome,
    },
    /// The operator issued a command (after confirmation, where one was needed).
    Command { id: CommandSeq, text: String },
    /// A step of a running command (e.g. a placement's reconciliation).
    CommandProgress { id: CommandSeq, note: String },
    /// How a command ended.
    CommandOutcome {
        id: CommandSeq,
        status: CommandStatus,
        detail: String,
    },
    /// A note of the console itself (a refused command, a theme change…).
    Note { text: String },
    /// A stored placement fence's readiness deadline, read from den's fence directory
    /// when the console starts, relative to this event's stamp: every den process shows
    /// the same deadline for an instance den placed, not one from its own first sight.
    PlacementDeadline {
        instance: crate::skulk::InstanceId,
        deadline_in_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hard_expiry_in_ms: Option<u64>,
    },
}

impl SessionEvent {
    /// The source the event came from, if any.
    pub fn source(&self) -> Option<&SourceId> {
        match self {
            SessionEvent::SourceAdded { source, .. }
            | SessionEvent::Connected { source }
            | SessionEvent::Disconnected { source, .. }
            | SessionEvent::Feed { source, .. }
            | SessionEvent::SkulkNodeId { source, .. }
            | SessionEvent::SkulkCatalog { source, .. }
            | SessionEvent::SkulkState { source, .. }
            | SessionEvent::PollFailed { source, .. }
            | SessionEvent::Probe { source, .. } => Some(source),
            SessionEvent::Command { .. }
            | SessionEvent::CommandProgress { .. }
            | SessionEvent::CommandOutcome { .. }
            | SessionEvent::Note { .. }
            | SessionEvent::PlacementDeadline { .. } => None,
        }
    }

    /// The event's name as serialised (`source-added`, `feed`, …).
    pub fn name(&self) -> &'static str {
        match self {
            SessionEvent::SourceAdded { .. } => "source-added",
            SessionEvent::Connected { .. } => "connected",
            SessionEvent::Disconnected { .. } => "disconnected",
            SessionEvent::Feed { .. } => "feed",
            SessionEvent::SkulkNodeId { .. } => "skulk-node-id",
            SessionEvent::SkulkCatalog { .. } => "skulk-catalog",
            SessionEvent::SkulkState { .. } => "skulk-state",
            SessionEvent::PollFailed { .. } => "poll-failed",
            SessionEvent::Probe { .. } => "probe",
            SessionEvent::Command { .. } => "command",
            SessionEvent::CommandProgress { .. } => "command-progress",
            SessionEvent::CommandOutcome { .. } => "command-outcome",
            SessionEvent::Note { .. } => "note",
            SessionEvent::PlacementDeadline { .. } => "placement-deadline",
        }
    }
}

/// A URL without credentials: user info, query and fragment are dropped, so that
/// `http://user:secret@host:1/api?token=x#y` becomes `http://host:1/api`. Pure string
/// handling; anything that does not look like `scheme://…` is returned up to its first
/// `?` or `#`.
pub fn redact_url(url: &str) -> String {
    let cut = url.find(['?', '#']).unwrap_or(url.len());
    let url = url.get(..cut).unwrap_or(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::PollFailureKind;
    use crate::observation::Observation;

    fn all_kinds() -> Vec<SessionEvent> {
        let source = SourceId::from("router");
        vec![
            SessionEvent::SourceAdded {
                source: source.clone(),
                kind: SourceKind::DenRouter,
                url: "http://127.0.0.1:7000".into(),
            },
            SessionEvent::Connected {
                source: source.clone(),
            },
            SessionEvent::Disconnected {
                source: source.clone(),
                reason: "connection refused".into(),
            },
            SessionEvent::Feed {
                source: source.clone(),
                message: FeedMessage::Worker {
                    at: Millis(4),
                    observation: Box::new(Observation::new("w1", "n1")),
                },
            },
            SessionEvent::SkulkNodeId {
                source: source.clone(),
                node: "n1".into(),
            },
            SessionEvent::SkulkState {
                source: source.clone(),
                state: Box::default(),
                latency_ms: 12,
                received_unix_ms: None,
            },
            SessionEvent::PollFailed {
                source,
                endpoint: "/state".into(),
                failure: PollFailure {
                    kind: PollFailureKind::Timeout,
                    detail: "5 s".into(),
                },
                latency_ms: 5000,
            },
            SessionEvent::Probe {
                source: "router".into(),
                instance: "i-1".into(),
                outcome: ProbeOutcome::Failed {
                    detail: "HTTP 503".into(),
                },
            },
            SessionEvent::Command {
                id: CommandSeq(1),
                text: "delete abc".into(),
            },
            SessionEvent::CommandProgress {
                id: CommandSeq(1),
                note: "sent".into(),
            },
            SessionEvent::CommandOutcome {
                id: CommandSeq(1),
                status: CommandStatus::Uncertain,
                detail: "no answer".into(),
            },
            SessionEvent::Note {
                text: "theme light".into(),
            },
        ]
    }

    #[test]
    fn every_event_round_trips_as_one_json_line_with_its_name() {
        for (i, event) in all_kinds().into_iter().enumerate() {
            let stamped = Stamped::new(Millis(i as u64 * 10), event);
            let line = serde_json::to_string(&stamped).unwrap();
            assert!(!line.contains('\n'));
            let value: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(value["event"], stamped.event.name(), "{line}");
            assert_eq!(value["at"], i as u64 * 10);
            let back: Stamped = serde_json::from_str(&line).unwrap();
            assert_eq!(back, stamped);
        }
    }

    #[test]
    fn only_source_events_name_a_source() {
        let with_source = all_kinds().iter().filter(|e| e.source().is_some()).count();
        assert_eq!(with_source, 8);
    }

    #[test]
    fn urls_lose_credentials_queries_and_fragments() {
        assert_eq!(
            redact_url("http://user:secret@host:1/api?token=x#y"),
            "http://host:1/api"
        );
        assert_eq!(redact_url("https://h"), "https://h");
        assert_eq!(redact_url("ws://a@b@h:2"), "ws://h:2");
        assert_eq!(redact_url("h:1?k=v"), "h:1");
    }

    #[test]
    fn command_status_exit_codes_are_distinct() {
        let codes = [
            CommandStatus::Ok.exit_code(),
            CommandStatus::Failed.exit_code(),
            CommandStatus::Uncertain.exit_code(),
        ];
        assert_eq!(codes, [0, 1, 2]);
    }
}
