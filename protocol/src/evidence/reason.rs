//! Why something is not (yet) ready. Every reason renders as one line, because operators
//! read them in the console.

use crate::text::short_node;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::EndpointLabel;
use crate::ids::NodeId;
use crate::skulk::common::one_line;
use crate::skulk::{AttemptId, InstanceId, Memory, ModelId, RunnerId, TaskId};
use crate::time::Millis;

/// One typed reason. [`Reason::is_contradiction`] separates "observations disagree"
/// (the verdict becomes uncertain and the evidence must be refreshed) from "not there
/// yet" or "failed".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reason {
    // ----- endpoints and identity -----
    /// The endpoint has not answered `GET /node_id` yet.
    EndpointUnbound {
        endpoint: EndpointLabel,
    },
    /// The endpoint answered a different node id than the one bound to it.
    IdentityConflict {
        endpoint: EndpointLabel,
        expected: NodeId,
        observed: NodeId,
    },
    /// The endpoint has never been polled successfully.
    NoObservation {
        endpoint: EndpointLabel,
    },
    /// The latest poll failed: cached readiness derived from this endpoint expired.
    PollFailing {
        endpoint: EndpointLabel,
        detail: String,
    },
    /// The last successful poll is too old.
    EvidenceStale {
        endpoint: EndpointLabel,
        age_ms: u64,
    },

    // ----- membership -----
    /// `observer`'s topology does not list `node`.
    NotInTopology {
        node: NodeId,
        observer: EndpointLabel,
    },
    /// `observer` reports `nodeResources` but none for `node`: a one-sided view.
    NoLiveResources {
        node: NodeId,
        observer: EndpointLabel,
    },

    // ----- the instance itself -----
    InstanceNotObserved {
        instance: InstanceId,
    },
    /// Seen before, now absent from every fresh view.
    InstanceGone {
        instance: InstanceId,
        last_seen: Millis,
    },
    /// Present in some fresh views and absent from others.
    InstancePresenceDisagrees {
        instance: InstanceId,
        present_on: Vec<EndpointLabel>,
        absent_on: Vec<EndpointLabel>,
    },
    /// Fresh views describe the instance differently (nodes, runners or shards).
    InstanceDefinitionDisagrees {
        instance: InstanceId,
    },
    /// An instance kind without readable `shardAssignments`.
    InstanceUnreadable {
        instance: InstanceId,
        tag: String,
    },
    /// A terminal failure record (`instanceFailures`) names the instance.
    InstanceFailed {
        instance: InstanceId,
        message: String,
        code: Option<String>,
    },
    /// A lifecycle task of the instance failed.
    TaskFailed {
        task: TaskId,
        kind: String,
        message: Option<String>,
    },

    // ----- runners -----
    /// `nodeToRunner` names a runner that `runnerToShard` lacks.
    RunnerBindingInvalid {
        node: NodeId,
        runner: RunnerId,
    },
    RunnerMissing {
        node: NodeId,
        runner: RunnerId,
    },
    RunnerStarting {
        node: NodeId,
        runner: RunnerId,
        status: String,
    },
    RunnerFailed {
        node: NodeId,
        runner: RunnerId,
        message: String,
    },
    RunnerStopped {
        node: NodeId,
        runner: RunnerId,
        status: String,
    },
    RunnerUnknownStatus {
        node: NodeId,
        runner: RunnerId,
        tag: String,
    },
    /// Fresh views disagree about the runner (ready on one, failed on another).
    RunnerContradiction {
        node: NodeId,
        runner: RunnerId,
        detail: String,
    },

    // ----- downloads -----
    DownloadMissing {
        node: NodeId,
        model: ModelId,
    },
    /// Records exist for the model on the node but for a different artifact (card).
    ArtifactMismatch {
        node: NodeId,
        model: ModelId,
    },
    DownloadInProgress {
        node: NodeId,
        phase: String,
        downloaded: Option<Memory>,
        total: Option<Memory>,
    },
    /// A failed download of the artifact. `current` is false when the failure was already
    /// there before the instance appeared (retained history, not attributable to it).
    DownloadFailed {
        node: NodeId,
        attempt: Option<AttemptId>,
        message: String,
        current: bool,
    },
    /// The record carries no attempt id where attempt attribution is required.
    DownloadUnattributed {
        node: NodeId,
        model: ModelId,
    },
    DownloadUnknownStatus {
        node: NodeId,
        tag: String,
    },
    /// Views or samples disagree about the download (e.g. two terminal outcomes of one
    /// attempt, or completed on one endpoint and ongoing on another).
    DownloadContradiction {
        node: NodeId,
        detail: String,
    },
    /// The runner reports ready while the download is not complete.
    RunnerAheadOfDownload {
        node: NodeId,
        runner: RunnerId,
    },

    // ----- inference -----
    /// Download and runners agree; no successful probe since they do.
    ProbeMissing,
    ProbeFailed {
        detail: String,
    },
    /// The probe was answered by another instance of the same model.
    ProbeServedByOther {
        other: InstanceId,
    },

    // ----- deadlines -----
    ReadinessDeadlineExceeded {
        deadline: Millis,
    },
    RecoveryDeadlineExceeded {
        deadline: Millis,
    },
}

impl Reason {
    /// Observations that disagree: the verdict is uncertain (never ready) until refreshed.
    pub fn is_contradiction(&self) -> bool {
        matches!(
            self,
            Reason::IdentityConflict { .. }
                | Reason::InstancePresenceDisagrees { .. }
                | Reason::InstanceDefinitionDisagrees { .. }
                | Reason::RunnerContradiction { .. }
                | Reason::DownloadContradiction { .. }
                | Reason::RunnerAheadOfDownload { .. }
        )
    }

    /// Proof of failure, not a wait: Skulk 1.3.0 never retries a failed download and
    /// never restarts a failed runner, and an `instanceFailures` record is final. The
    /// verdict is failed at once instead of not ready until the deadline. A failure
    /// from before the instance (`current: false`) is history and proves nothing.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Reason::InstanceFailed { .. }
                | Reason::RunnerFailed { .. }
                | Reason::DownloadFailed { current: true, .. }
        )
    }

    /// Reasons about the inference probe only.
    pub fn is_probe(&self) -> bool {
        matches!(
            self,
            Reason::ProbeMissing | Reason::ProbeFailed { .. } | Reason::ProbeServedByOther { .. }
        )
    }
}

fn short(id: &str) -> &str {
    // UUIDs are long; their first 8 characters identify them on a console.
    id.get(..8).unwrap_or(id)
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::EndpointUnbound { endpoint } => {
                write!(f, "endpoint {endpoint}: node identity not established yet")
            }
            Reason::IdentityConflict {
                endpoint,
                expected,
                observed,
            } => {
                write!(
                    f,
                    "endpoint {endpoint}: answers as node {observed}, bound to {expected}"
                )
            }
            Reason::NoObservation { endpoint } => {
                write!(f, "endpoint {endpoint}: no successful poll yet")
            }
            Reason::PollFailing { endpoint, detail } => {
                write!(
                    f,
                    "endpoint {endpoint}: polling fails ({}); cached readiness expired",
                    one_line(detail)
                )
            }
            Reason::EvidenceStale { endpoint, age_ms } => {
                write!(f, "endpoint {endpoint}: last observation {age_ms} ms old")
            }
            Reason::NotInTopology { node, observer } => {
                write!(
                    f,
                    "node {}: missing from {observer}'s topology",
                    short_node(node.as_str())
                )
            }
            Reason::NoLiveResources { node, observer } => {
                write!(
                    f,
                    "node {}: no live resource observation from {observer} (one-sided)",
                    short_node(node.as_str())
                )
            }
            Reason::InstanceNotObserved { instance } => {
                write!(
                    f,
                    "instance {}: not observed in any state",
                    short(instance.as_str())
                )
            }
            Reason::InstanceGone {
                instance,
                last_seen,
            } => {
                write!(
                    f,
                    "instance {}: gone (last seen at {last_seen})",
                    short(instance.as_str())
                )
            }
            Reason::InstancePresenceDisagrees {
                instance,
                present_on,
                absent_on,
            } => write!(
                f,
                "instance {}: present on {} but absent on {}",
                short(instance.as_str()),
                join(present_on),
                join(absent_on)
            ),
            Reason::InstanceDefinitionDisagrees { instance } => {
                write!(
                    f,
                    "instance {}: endpoints describe different placements",
                    short(instance.as_str())
                )
            }
            Reason::InstanceUnreadable { instance, tag } => {
                write!(
                    f,
                    "instance {}: kind {tag} has no readable shard assignments",
                    short(instance.as_str())
                )
            }
            Reason::InstanceFailed {
                instance,
                message,
                code,
            } => match code {
                Some(code) => write!(
                    f,
                    "instance {} failed ({code}): {}",
                    short(instance.as_str()),
                    one_line(message)
                ),
                None => write!(
                    f,
                    "instance {} failed: {}",
                    short(instance.as_str()),
                    one_line(message)
                ),
            },
            Reason::TaskFailed {
                task,
                kind,
                message,
            } => match message {
                Some(m) => write!(
                    f,
                    "task {kind} {} failed: {}",
                    short(task.as_str()),
                    one_line(m)
                ),
                None => write!(f, "task {kind} {} failed", short(task.as_str())),
            },
            Reason::RunnerBindingInvalid { node, runner } => write!(
                f,
                "node {}: runner {} has no shard in runnerToShard",
                short_node(node.as_str()),
                short(runner.as_str())
            ),
            Reason::RunnerMissing { node, runner } => {
                write!(
                    f,
                    "runner {} on {}: no status yet",
                    short(runner.as_str()),
                    short_node(node.as_str())
                )
            }
            Reason::RunnerStarting {
                node,
                runner,
                status,
            } => {
                write!(
                    f,
                    "runner {} on {}: {status}",
                    short(runner.as_str()),
                    short_node(node.as_str())
                )
            }
            Reason::RunnerFailed {
                node,
                runner,
                message,
            } => write!(
                f,
                "runner {} on {} failed: {}",
                short(runner.as_str()),
                short_node(node.as_str()),
                one_line(message)
            ),
            Reason::RunnerStopped {
                node,
                runner,
                status,
            } => {
                write!(
                    f,
                    "runner {} on {}: {status}",
                    short(runner.as_str()),
                    short_node(node.as_str())
                )
            }
            Reason::RunnerUnknownStatus { node, runner, tag } => write!(
                f,
                "runner {} on {}: unknown status {tag}",
                short(runner.as_str()),
                short_node(node.as_str())
            ),
            Reason::RunnerContradiction {
                node,
                runner,
                detail,
            } => write!(
                f,
                "runner {} on {}: views disagree ({})",
                short(runner.as_str()),
                short_node(node.as_str()),
                one_line(detail)
            ),
            Reason::DownloadMissing { node, model } => {
                write!(
                    f,
                    "download of {model} on {}: no record",
                    short_node(node.as_str())
                )
            }
            Reason::ArtifactMismatch { node, model } => write!(
                f,
                "download of {model} on {}: records are for a different card",
                short_node(node.as_str())
            ),
            Reason::DownloadInProgress {
                node,
                phase,
                downloaded,
                total,
            } => match (downloaded, total) {
                // Skulk reports a total of 0 until it knows the size: unknown, not zero.
                (Some(d), Some(t)) => write!(
                    f,
                    "download on {}: {phase} ({} of {})",
                    short_node(node.as_str()),
                    crate::text::bytes(d.in_bytes),
                    if t.in_bytes == 0 {
                        "?".to_owned()
                    } else {
                        crate::text::bytes(t.in_bytes)
                    }
                ),
                _ => write!(f, "download on {}: {phase}", short_node(node.as_str())),
            },
            Reason::DownloadFailed {
                node,
                attempt,
                message,
                current,
            } => {
                let attempt = attempt
                    .as_ref()
                    .map(|a| format!(" attempt {}", short(a.as_str())))
                    .unwrap_or_default();
                let earlier = if *current {
                    ""
                } else {
                    " (before this instance)"
                };
                write!(
                    f,
                    "download on {}{attempt} failed{earlier}: {}",
                    short_node(node.as_str()),
                    one_line(message)
                )
            }
            Reason::DownloadUnattributed { node, model } => write!(
                f,
                "download of {model} on {}: record has no attempt id (incomplete evidence)",
                short_node(node.as_str())
            ),
            Reason::DownloadUnknownStatus { node, tag } => {
                write!(
                    f,
                    "download on {}: unknown status {tag}",
                    short_node(node.as_str())
                )
            }
            Reason::DownloadContradiction { node, detail } => {
                write!(
                    f,
                    "download on {}: observations disagree ({})",
                    short_node(node.as_str()),
                    one_line(detail)
                )
            }
            Reason::RunnerAheadOfDownload { node, runner } => write!(
                f,
                "runner {} on {} reports ready but its download is not complete",
                short(runner.as_str()),
                short_node(node.as_str())
            ),
            Reason::ProbeMissing => f.write_str("no successful inference probe yet"),
            Reason::ProbeFailed { detail } => {
                write!(f, "inference probe failed: {}", one_line(detail))
            }
            Reason::ProbeServedByOther { other } => {
                write!(
                    f,
                    "inference probe was served by another instance ({})",
                    short(other.as_str())
                )
            }
            Reason::ReadinessDeadlineExceeded { deadline } => {
                write!(f, "not ready by the readiness deadline ({deadline})")
            }
            Reason::RecoveryDeadlineExceeded { deadline } => {
                write!(f, "lost readiness not recovered by {deadline}")
            }
        }
    }
}

fn join(labels: &[EndpointLabel]) -> String {
    labels
        .iter()
        .map(EndpointLabel::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Joins reasons for a one-line summary.
pub fn summarise(reasons: &[Reason]) -> String {
    reasons
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
