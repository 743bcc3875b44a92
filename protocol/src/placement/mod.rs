//! The exact-placement workflow of the integration guide, as a pure state machine.
//!
//! ```text
//! identity  GET /node_id                      recheck the management identity
//! require   GET /models/requirements          absent (404) = unknown, continue
//! preview   GET /instance/previews?model_id&node_ids…
//!           select an admitted preview whose ACTUAL nodeToRunner keys equal the wanted
//!           nodes; check card digest, context limit and backend where reported
//! baseline  GET /state                        live target check; prior download history
//! fence     PersistFence → (runtime writes it) → FencePersisted
//! submit    POST /instance {"instance": …}   4xx = refused; lost/5xx = reconcile
//! reconcile GET /state every poll interval until the deadline; instanceFailures,
//!           runner and download failures end it; an unrelated instance of the same
//!           model proves nothing
//! probe     ONE ordinary inference request once download and runner evidence agree
//!           (`?den_instance=ID`: den's router serves it on that instance)
//! outcome   Placed | Failed(reason) | Uncertain(reason)
//! ```
//!
//! A lost response is reconciled (the stored instance id is looked up in `/state`),
//! never re-posted. A fence is serialisable; `Input::Resume(fence)` after a restart goes
//! straight to reconciliation (after rechecking the management identity).
//!
//! Time: fences carry absolute [`Millis`] deadlines, so a runtime that resumes fences
//! across restarts must drive this machine with a time base that survives them (e.g.
//! milliseconds since the Unix epoch, read by the runtime and passed in).
//!
//! Credentials: every [`HttpIntent`] is meant for the one management origin. The
//! runtime keeps management credentials scoped to that origin and never forwards them
//! to another host, a proxy destination or a redirect; the probe goes through the same
//! management API.

pub mod capability;
mod outcome;
pub mod select;
mod workflow;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::evidence::EvidenceConfig;
use crate::ids::NodeId;
use crate::skulk::chat::ChatCompletionResponse;
use crate::skulk::error::ApiError;
use crate::skulk::{CreateInstanceRequest, HttpIntent, InstanceId, ModelId};
use crate::time::Millis;

pub use outcome::{FailureClass, FailureReason, Note, Outcome, UncertainReason};
pub use select::{Criteria, PreviewRejection, Rejection, select_preview};
pub use workflow::PlacementWorkflow;

/// What to place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementRequest {
    pub model_id: ModelId,
    /// The exact node set the instance must run on.
    pub nodes: BTreeSet<NodeId>,
    /// Requested per-sequence context.
    pub context_tokens: Option<u64>,
    /// The node id the management API must answer; `None` binds to its first answer.
    pub management_node: Option<NodeId>,
    /// The card digest of the approved intent; `None` takes the requirements' digest.
    pub approved_card_digest: Option<String>,
    /// The external resource's expiry: an upper bound for every deadline.
    pub hard_expiry: Option<Millis>,
    /// A compute node's own API is polled too ([`Target::Compute`]).
    pub compute: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowConfig {
    /// How long reconciliation may take after submission (download, runner, probe).
    pub reconcile_deadline_ms: u64,
    pub poll_interval_ms: u64,
    pub probe_prompt: String,
    pub probe_max_tokens: u64,
    pub evidence: EvidenceConfig,
}

impl Default for WorkflowConfig {
    fn default() -> Self {
        WorkflowConfig {
            reconcile_deadline_ms: 10 * 60_000,
            poll_interval_ms: 2_000,
            probe_prompt: "Reply with the single word: ready".to_owned(),
            probe_max_tokens: 4,
            evidence: EvidenceConfig {
                track_all_instances: false,
                ..EvidenceConfig::default()
            },
        }
    }
}

/// The submission fence: persisted before anything effectful is sent, so that a restart
/// reconciles instead of submitting again. It holds the complete instance (and with it
/// the shard cards) for later state comparisons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fence {
    pub version: u32,
    pub instance_id: InstanceId,
    pub model_id: ModelId,
    pub nodes: BTreeSet<NodeId>,
    pub management_node: Option<NodeId>,
    /// The node the compute endpoint answered as, when one was polled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_node: Option<NodeId>,
    pub context_tokens: Option<u64>,
    /// The exact `POST /instance` body.
    pub request: CreateInstanceRequest,
    pub created_at: Millis,
    pub reconcile_deadline: Millis,
    pub hard_expiry: Option<Millis>,
}

impl Fence {
    pub const VERSION: u32 = 1;
}

/// Correlates a response with the effect that asked for it. Responses to anything but
/// the outstanding request are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestSeq(pub u64);

/// A request that did not produce a response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportFailure {
    /// False only when the request certainly never reached the server (e.g. connection
    /// refused). A timeout or reset after sending is `true`: it may have been read.
    pub sent: bool,
    pub detail: String,
}

/// The outcome of the probe request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeResult {
    /// The ordinary inference request completed. `served_by` names the instance when the
    /// server says (den's router does; Skulk 1.3.0 does not).
    Completed { served_by: Option<InstanceId> },
    /// An error response, or an error frame after status 200.
    Error { detail: String },
    /// No answer; whether it ran is unknown.
    Transport { detail: String },
}

impl ProbeResult {
    /// Reads a non-streaming `POST /v1/chat/completions` answer. Skulk can put an error
    /// envelope in a 200 body; that is an error too.
    pub fn from_response(status: u16, body: &str) -> ProbeResult {
        if !(200..300).contains(&status) {
            return ProbeResult::Error {
                detail: ApiError::from_response(status, body).to_string(),
            };
        }
        if let ApiError::Envelope { error, .. } = ApiError::from_response(status, body) {
            return ProbeResult::Error {
                detail: error.message,
            };
        }
        match serde_json::from_str::<ChatCompletionResponse>(body) {
            Ok(response) if !response.choices.is_empty() => {
                // den's router names the instance that served the request.
                let served_by = response
                    .extra
                    .get("served_by")
                    .and_then(serde_json::Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(InstanceId::from);
                ProbeResult::Completed { served_by }
            }
            Ok(_) => ProbeResult::Error {
                detail: "the completion has no choices".to_owned(),
            },
            Err(e) => ProbeResult::Error {
                detail: format!("unreadable completion: {e}"),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Start(PlacementRequest),
    /// After a restart: continue from a persisted fence (never re-posts).
    Resume(Box<Fence>),
    HttpResponse {
        request: RequestSeq,
        status: u16,
        body: String,
    },
    HttpFailed {
        request: RequestSeq,
        failure: TransportFailure,
    },
    FencePersisted {
        instance_id: InstanceId,
    },
    FencePersistFailed {
        instance_id: InstanceId,
        detail: String,
    },
    ProbeAnswered {
        request: RequestSeq,
        result: ProbeResult,
    },
    /// The time asked for by [`Effect::WakeAt`] has come.
    Wake,
}

#[derive(Debug, Clone, PartialEq)]
#[must_use = "an effect is a decision to carry out, not a value to drop"]
pub enum Effect {
    /// Send this request to `target` and answer with `HttpResponse` or `HttpFailed`
    /// carrying the same `request`.
    Http {
        request: RequestSeq,
        intent: HttpIntent,
        target: Target,
    },
    /// Write the fence durably, then answer `FencePersisted` (or `FencePersistFailed`).
    PersistFence(Box<Fence>),
    /// The outcome is definitive; the fence may go.
    ClearFence {
        instance_id: InstanceId,
    },
    /// Send ONE ordinary inference request through the management API and answer with
    /// `ProbeAnswered`.
    Probe {
        request: RequestSeq,
        instance_id: InstanceId,
        intent: HttpIntent,
    },
    /// Answer with `Wake` at (or after) this time.
    WakeAt(Millis),
    Finished(Outcome),
}

/// Which API an HTTP effect is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The management API the placement is submitted through.
    Management,
    /// The compute node's own API (`PlacementRequest::compute`): its `/node_id` binds it
    /// to one of the wanted nodes and its `/state` is the second side of membership and
    /// of every readiness record.
    Compute,
}

/// Where the workflow is, for display.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepKind {
    Idle,
    CheckingIdentity,
    ReadingRequirements,
    Previewing,
    ReadingBaseline,
    /// The compute node's `/node_id` or `/state`.
    CheckingCompute,
    PersistingFence,
    Submitting,
    Reconciling,
    Probing,
    Done,
}
