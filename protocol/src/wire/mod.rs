//! The control channel between router and workers (spec §5.1, §5.2).
//!
//! Every frame is one JSON object with a `type` tag:
//!
//! | type | direction | payload |
//! |---|---|---|
//! | `offer` | router → worker | `to`, assignment, worker epoch, full request, candidate, estimate |
//! | `cancel` | router → worker | `to`, assignment |
//! | `welcome` / `refused` | router → worker | handshake answer |
//! | `hello` | worker → router | protocol version, worker id, node, epoch |
//! | `offer-result` | worker → router | assignment, worker's current epoch, accepted, reason |
//! | `token` | worker → router | assignment, token, index |
//! | `result` | worker → router | assignment, terminal [`WorkerResult`] |
//! | `heartbeat` | worker → router | [`Observation`] |
//! | `publish` | worker → router | chunks made durable (after their storage receipts) |
//! | `retract` | worker → router | replicas a tier no longer holds (evicted, corrupt) |
//! | `drain` | router → worker | `to`, draining on/off (operator command) |
//! | `place-runner` | router → worker | `to`, instance, runner, artifact, source ([`manage`]) |
//! | `remove-runner` | router → worker | `to`, instance, runner ([`manage`]) |
//!
//! **Handshake.** A worker opens the WebSocket with the cluster's shared token in the
//! upgrade request's `Authorization: Bearer …` header — the token never travels inside a
//! frame, so frames can be logged and recorded without leaking it. Its first frame is
//! `hello`; the router answers `welcome` or `refused` (a version mismatch is reported by
//! [`decode_for_router`] as [`CodecError::UnsupportedVersion`], which the router turns
//! into `refused`).
//!
//! **Local effects cannot be sent.** Only types implementing the sealed [`WireMessage`]
//! trait can be encoded, and only frames are given that trait. Timers, deliveries to the
//! ingress, device operations and reservation releases are separate enum types
//! ([`crate::router::LocalRouterEffect`], [`crate::worker::LocalWorkerEffect`]) that do
//! not implement it, so sending one is a compile error:
//!
//! ```compile_fail
//! use den_protocol::ids::AssignmentId;
//! use den_protocol::router::LocalRouterEffect;
//! let timer = LocalRouterEffect::CancelOfferTimer { assignment: AssignmentId::new("r", 1) };
//! let _ = den_protocol::wire::encode(&timer); // error: LocalRouterEffect is not a WireMessage
//! ```
//!
//! Local effects still implement `serde::Serialize`, because traces, recordings and the
//! console feed are JSON too — but those are not the control channel.

mod codec;
mod hot;
pub mod manage;

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::candidate::{Candidate, Estimate, Tier};
use crate::capacity::DeclineReason;
use crate::chunk::PrefixHash;
use crate::chunk_catalog::ChunkEntry;
use crate::ids::{AssignmentId, Epoch, ModelFingerprint, NodeId, WorkerId};
use crate::observation::Observation;
use crate::request::{GenerationRequest, Token};

pub use codec::{
    CodecError, Direction, MAX_NAME_BYTES, WorkerInbound, decode_for_router, decode_for_worker,
    encode, encode_text,
};
pub use manage::{ArtifactFile, ArtifactFormat, ModelArtifact, PlaceRunner, RemoveRunner};

/// The control-channel protocol version spoken by this build. Bumped on any incompatible
/// frame change; `hello` and `welcome` carry it.
pub const PROTOCOL_VERSION: u32 = 1;

/// Default largest frame a peer accepts (16 MiB: a 1M-token prompt as JSON fits).
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024 * 1024;

/// A type that may be encoded onto the control channel. Sealed: only the frame types of
/// this module implement it.
pub trait WireMessage: Serialize + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! wire_message {
    ($($t:ty),*) => {
        $(impl sealed::Sealed for $t {}
          impl WireMessage for $t {})*
    };
}

wire_message!(
    OutboundToWorker,
    WorkerMessage,
    ToRouter,
    RouterHandshake,
    ControlToWorker
);

// ---------------------------------------------------------------------------------------
// Router → worker
// ---------------------------------------------------------------------------------------

/// "Serve this request on your worker as `candidate` describes." The request travels in
/// full (behind an `Arc`, so fan-out costs no copies); the worker re-estimates the
/// candidate because the router's view may be stale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offer {
    pub assignment: AssignmentId,
    /// The epoch the router believes the worker is in (the candidate's epoch).
    pub worker_epoch: Epoch,
    pub request: Arc<GenerationRequest>,
    pub candidate: Candidate,
    /// The router's estimate of `candidate` (its predicted TTFT), for the worker's logs.
    pub estimate: Estimate,
}

/// "Stop working on this assignment."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    pub assignment: AssignmentId,
}

/// What a router sends to one worker.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum RouterMessage {
    Offer(Box<Offer>),
    Cancel(Cancel),
}

impl RouterMessage {
    pub fn assignment(&self) -> &AssignmentId {
        match self {
            RouterMessage::Offer(o) => &o.assignment,
            RouterMessage::Cancel(c) => &c.assignment,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            RouterMessage::Offer(_) => "offer",
            RouterMessage::Cancel(_) => "cancel",
        }
    }
}

/// A router message addressed to a worker: the frame the router writes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboundToWorker {
    pub to: WorkerId,
    #[serde(flatten)]
    pub message: RouterMessage,
}

/// Operator control of one worker, outside the offer protocol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Control {
    /// Stop taking new offers (declined `draining`) and let running work finish; `false`
    /// resumes.
    Drain { draining: bool },
    /// Place one runner of a model instance (management API).
    PlaceRunner(Box<PlaceRunner>),
    /// Tear one runner down (management API).
    RemoveRunner(RemoveRunner),
}

impl Control {
    pub fn kind(&self) -> &'static str {
        match self {
            Control::Drain { .. } => "drain",
            Control::PlaceRunner(_) => "place-runner",
            Control::RemoveRunner(_) => "remove-runner",
        }
    }
}

/// A control frame addressed to a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ControlToWorker {
    pub to: WorkerId,
    #[serde(flatten)]
    pub control: Control,
}

/// The router's answer to `hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub protocol_version: u32,
    /// How often the worker should publish a heartbeat.
    pub heartbeat_interval_ms: u64,
    /// After how long without a heartbeat the router detaches the worker.
    pub heartbeat_timeout_ms: u64,
}

/// Why the router refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RefusalReason {
    UnsupportedVersion,
    Unauthorized,
    Malformed,
    Shutdown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub reason: RefusalReason,
    /// A one-line explanation for the worker's log.
    pub detail: String,
}

/// Handshake frames from router to worker (not addressed: the connection is the worker's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum RouterHandshake {
    Welcome(Welcome),
    Refused(Refused),
}

// ---------------------------------------------------------------------------------------
// Worker → router
// ---------------------------------------------------------------------------------------

/// The worker's answer to an offer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferResult {
    pub assignment: AssignmentId,
    /// The worker's *current* epoch (so a router can see that an offer was stale).
    pub worker_epoch: Epoch,
    pub accepted: bool,
    /// Present exactly when declined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<DeclineReason>,
}

/// One streamed output token (a delta). Indices start at 0 and are contiguous.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenDelta {
    pub assignment: AssignmentId,
    pub token: Token,
    pub index: u32,
}

/// The terminal result of an assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultMessage {
    pub assignment: AssignmentId,
    pub result: Box<WorkerResult>,
}

/// What the worker state machine sends to the router.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum WorkerMessage {
    OfferResult(OfferResult),
    Token(TokenDelta),
    Result(ResultMessage),
}

impl WorkerMessage {
    pub fn assignment(&self) -> &AssignmentId {
        match self {
            WorkerMessage::OfferResult(m) => &m.assignment,
            WorkerMessage::Token(m) => &m.assignment,
            WorkerMessage::Result(m) => &m.assignment,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            WorkerMessage::OfferResult(_) => "offer-result",
            WorkerMessage::Token(_) => "token",
            WorkerMessage::Result(_) => "result",
        }
    }
}

/// The first frame a worker sends on a new connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub worker_id: WorkerId,
    pub node: NodeId,
    pub epoch: Epoch,
    /// The worker's own secret (64 hex digits, kept in its data directory), which the
    /// router pins to `worker_id` on first contact: the shared token lets a process join,
    /// only this lets it be *that* worker. Absent from workers older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

/// A heartbeat: the worker's current observation (spec §5.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub observation: Observation,
}

/// A chunk the worker made durable: its bytes are in `tiers` on the worker's node (and
/// in the shared object store when `entry.object`), each acknowledged by a storage receipt
/// before this frame was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedChunk {
    pub entry: ChunkEntry,
    /// Local replica tiers (ram, ssd) that hold it on the worker's node.
    #[serde(default)]
    pub tiers: Vec<Tier>,
}

/// Chunks newly durable on a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publish {
    pub chunks: Vec<PublishedChunk>,
}

/// A replica a worker's tier no longer holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetractedChunk {
    pub model: ModelFingerprint,
    pub hash: PrefixHash,
    pub tier: Tier,
}

/// Replicas gone from a worker's tiers (evicted, found corrupt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retract {
    pub chunks: Vec<RetractedChunk>,
}

/// Every frame a router can receive.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ToRouter {
    Hello(Hello),
    Heartbeat(Box<Heartbeat>),
    OfferResult(OfferResult),
    Token(TokenDelta),
    Result(ResultMessage),
    Publish(Publish),
    Retract(Retract),
}

impl ToRouter {
    /// The frame's wire `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            ToRouter::Hello(_) => "hello",
            ToRouter::Heartbeat(_) => "heartbeat",
            ToRouter::OfferResult(_) => "offer-result",
            ToRouter::Token(_) => "token",
            ToRouter::Result(_) => "result",
            ToRouter::Publish(_) => "publish",
            ToRouter::Retract(_) => "retract",
        }
    }
}

impl From<WorkerMessage> for ToRouter {
    fn from(m: WorkerMessage) -> Self {
        match m {
            WorkerMessage::OfferResult(m) => ToRouter::OfferResult(m),
            WorkerMessage::Token(m) => ToRouter::Token(m),
            WorkerMessage::Result(m) => ToRouter::Result(m),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResultStatus {
    Completed,
    Failed,
}

/// Why decoding stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopReason {
    /// `max_new_tokens` were generated.
    Length,
    /// The model emitted an end-of-sequence token, or a stop token or stop string of the
    /// request ended the output (OpenAI's `finish_reason: "stop"`).
    Eos,
    /// The route reached the decoder's maximum position.
    Capacity,
}

/// Which stage of execution failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    RestoreFailed,
    PrefillFailed,
    DecodeFailed,
    /// A failed result that named no stage (only from foreign or buggy peers).
    Unspecified,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::RestoreFailed => "restore-failed",
            FailureKind::PrefillFailed => "prefill-failed",
            FailureKind::DecodeFailed => "decode-failed",
            FailureKind::Unspecified => "unspecified-failure",
        }
    }
}

/// Why a worker failed an assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub kind: FailureKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Failure {
    pub fn new(kind: FailureKind, detail: impl Into<String>) -> Self {
        Failure {
            kind,
            detail: Some(detail.into()),
        }
    }

    pub fn unspecified() -> Self {
        Failure {
            kind: FailureKind::Unspecified,
            detail: None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.detail {
            Some(d) => write!(f, "{}: {d}", self.kind.as_str()),
            None => f.write_str(self.kind.as_str()),
        }
    }
}

/// Durations the worker measured on its own clock (milliseconds). Only durations cross
/// the wire: worker and router clocks are unrelated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorkerTimings {
    /// Restoring the cached prefix (absent when nothing was restored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_ms: Option<u64>,
    /// Prefilling the uncached suffix (absent when nothing was missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_ms: Option<u64>,
    /// Decoding, from its start to the last token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_ms: Option<u64>,
    /// Acceptance to the first streamed token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_ms: Option<u64>,
    /// Acceptance to the terminal result.
    #[serde(default)]
    pub total_ms: u64,
}

/// The terminal result of an assignment, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerResult {
    pub status: ResultStatus,
    /// Every generated token (also streamed as deltas).
    #[serde(default)]
    pub tokens: Vec<Token>,
    /// Prefix tokens actually reused (a restore may return fewer than the candidate said).
    #[serde(default)]
    pub cached_token_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopReason>,
    /// Present exactly when `status` is failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    #[serde(default)]
    pub timings: WorkerTimings,
}

impl WorkerResult {
    pub fn completed(tokens: Vec<Token>, cached_token_count: u32) -> Self {
        WorkerResult {
            status: ResultStatus::Completed,
            tokens,
            cached_token_count,
            stop: Some(StopReason::Length),
            failure: None,
            timings: WorkerTimings::default(),
        }
    }

    pub fn failed(failure: Failure) -> Self {
        WorkerResult {
            status: ResultStatus::Failed,
            tokens: Vec::new(),
            cached_token_count: 0,
            stop: None,
            failure: Some(failure),
            timings: WorkerTimings::default(),
        }
    }

    pub fn is_completed(&self) -> bool {
        self.status == ResultStatus::Completed
    }
}
