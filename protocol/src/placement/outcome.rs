//! How a placement ends, and why. Every reason renders as one line.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::select::PreviewRejection;
use crate::evidence::Reason;
use crate::evidence::reason::summarise;
use crate::ids::NodeId;
use crate::skulk::common::one_line;
use crate::skulk::{CommandId, InstanceId, RunnerId};
use crate::time::Millis;

/// The end of a placement workflow. Kept, never silently retried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// Download, runners and one ordinary inference request agree for this instance.
    Placed {
        instance_id: InstanceId,
        command_id: Option<CommandId>,
    },
    Failed {
        instance_id: Option<InstanceId>,
        reason: FailureReason,
    },
    /// Neither success nor a terminal failure could be established. The submission fence
    /// is kept: a later reconciliation (or an operator) decides; nothing re-posts.
    Uncertain {
        instance_id: Option<InstanceId>,
        reason: UncertainReason,
    },
}

impl Outcome {
    pub fn is_placed(&self) -> bool {
        matches!(self, Outcome::Placed { .. })
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Placed { instance_id, .. } => write!(f, "placed instance {instance_id}"),
            Outcome::Failed { reason, .. } => write!(f, "placement failed: {reason}"),
            Outcome::Uncertain { reason, .. } => write!(f, "placement uncertain: {reason}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FailureReason {
    ManagementIdentityMismatch {
        expected: NodeId,
        observed: NodeId,
    },
    IdentityUnavailable {
        detail: String,
    },
    /// The compute endpoint answers as a node the placement does not want.
    ComputeNotWanted {
        observed: NodeId,
        wanted: Vec<NodeId>,
    },
    RequirementsRefused {
        detail: String,
    },
    /// The catalog's card is not the one that was approved.
    CardChangedSinceApproval {
        approved: String,
        current: String,
    },
    /// The artifact has capabilities marked incomplete; they block admission.
    IncompleteCapabilities {
        capabilities: Vec<String>,
    },
    /// Required capabilities that no supported, exact engine/build/hardware claim proves.
    CapabilitiesUnproven {
        capabilities: Vec<String>,
    },
    PreviewsUnavailable {
        detail: String,
    },
    NoExactPreview {
        rejections: Vec<PreviewRejection>,
    },
    StateUnavailable {
        detail: String,
    },
    /// The wanted nodes are not in the management API's topology before submission.
    TargetNotInTopology {
        nodes: Vec<NodeId>,
        /// The nodes the topology does list (so the operator can pick one).
        #[serde(default)]
        known: Vec<NodeId>,
    },
    FenceNotPersisted {
        detail: String,
    },
    /// The server refused the submission (4xx): nothing was placed.
    Refused {
        status: u16,
        detail: String,
    },
    /// The request never left (connection refused before sending).
    NotSent {
        detail: String,
    },
    /// den's command status reports the command rejected.
    CommandRejected {
        message: String,
    },
    InstanceFailed {
        message: String,
    },
    RunnerFailed {
        node: NodeId,
        runner: RunnerId,
        message: String,
    },
    DownloadFailed {
        node: NodeId,
        message: String,
    },
    /// The instance was observed and then disappeared.
    InstanceRemoved {
        detail: Option<String>,
    },
    /// The stamped context limit of the accepted instance is below the requested one.
    ContextLimitTooSmall {
        limit: u64,
        requested: u64,
    },
    ReadinessTimedOut {
        deadline: Millis,
        reasons: Vec<Reason>,
    },
    ProbeFailed {
        detail: String,
    },
}

/// What kind of failure, for an operator's next step (and `den place`'s exit code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureClass {
    /// The intent cannot be met as given (or the server refused it): nothing was placed.
    /// Change the intent.
    Refused,
    /// den could not ask or could not record (management API unreadable, fence not
    /// written, request never sent): nothing was placed. Retry when it is reachable.
    NotAttempted,
    /// The instance was submitted and then failed: nothing is left to reconcile.
    FailedAfterSubmission,
}

impl FailureReason {
    pub fn class(&self) -> FailureClass {
        match self {
            FailureReason::ManagementIdentityMismatch { .. }
            | FailureReason::ComputeNotWanted { .. }
            | FailureReason::RequirementsRefused { .. }
            | FailureReason::CardChangedSinceApproval { .. }
            | FailureReason::IncompleteCapabilities { .. }
            | FailureReason::CapabilitiesUnproven { .. }
            | FailureReason::NoExactPreview { .. }
            | FailureReason::TargetNotInTopology { .. }
            | FailureReason::Refused { .. } => FailureClass::Refused,
            FailureReason::IdentityUnavailable { .. }
            | FailureReason::PreviewsUnavailable { .. }
            | FailureReason::StateUnavailable { .. }
            | FailureReason::FenceNotPersisted { .. }
            | FailureReason::NotSent { .. } => FailureClass::NotAttempted,
            FailureReason::CommandRejected { .. }
            | FailureReason::InstanceFailed { .. }
            | FailureReason::RunnerFailed { .. }
            | FailureReason::DownloadFailed { .. }
            | FailureReason::InstanceRemoved { .. }
            | FailureReason::ContextLimitTooSmall { .. }
            | FailureReason::ReadinessTimedOut { .. }
            | FailureReason::ProbeFailed { .. } => FailureClass::FailedAfterSubmission,
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureReason::ManagementIdentityMismatch { expected, observed } => {
                write!(
                    f,
                    "management API answers as node {observed}, expected {expected}"
                )
            }
            FailureReason::IdentityUnavailable { detail } => {
                write!(
                    f,
                    "management identity could not be read: {}",
                    one_line(detail)
                )
            }
            FailureReason::ComputeNotWanted { observed, wanted } => write!(
                f,
                "the compute endpoint answers as node {}, which is not among the wanted nodes ({})",
                one_line(observed.as_str()),
                wanted
                    .iter()
                    .map(|n| one_line(n.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            FailureReason::RequirementsRefused { detail } => {
                write!(f, "model requirements refused: {}", one_line(detail))
            }
            FailureReason::CardChangedSinceApproval { approved, current } => {
                write!(
                    f,
                    "model card changed since approval ({current} instead of {approved})"
                )
            }
            FailureReason::IncompleteCapabilities { capabilities } => {
                write!(
                    f,
                    "artifact capabilities marked incomplete: {}",
                    capabilities.join(", ")
                )
            }
            FailureReason::CapabilitiesUnproven { capabilities } => {
                write!(
                    f,
                    "no supported exact engine/build/hardware claim for required capabilities: {}",
                    capabilities
                        .iter()
                        .map(|c| one_line(c))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            FailureReason::PreviewsUnavailable { detail } => {
                write!(f, "no previews: {}", one_line(detail))
            }
            FailureReason::NoExactPreview { rejections } => {
                // Skulk refuses every preview of an ineligible node with the same long
                // message: one line names each distinct reason once, with the previews
                // it covers (`#0, #1 Pipeline/MlxRing, …`).
                let mut groups: Vec<(String, Vec<String>)> = Vec::new();
                for r in rejections {
                    let why = r.rejection.to_string();
                    let which = format!("#{} {}/{}", r.index, r.sharding, r.instance_meta);
                    match groups.iter_mut().find(|(w, _)| *w == why) {
                        Some((_, list)) => list.push(which),
                        None => groups.push((why, vec![which])),
                    }
                }
                if groups.is_empty() {
                    return f.write_str("no preview was returned");
                }
                let list = groups
                    .iter()
                    .map(|(why, which)| match which.as_slice() {
                        [one] => format!("{one}: {why}"),
                        many => format!("{} previews ({}): {why}", many.len(), many.join(", ")),
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                write!(f, "no preview places exactly the wanted nodes: {list}")
            }
            FailureReason::StateUnavailable { detail } => {
                write!(
                    f,
                    "cluster state could not be read before submission: {}",
                    one_line(detail)
                )
            }
            FailureReason::TargetNotInTopology { nodes, known } => {
                let list = |ids: &[NodeId]| {
                    ids.iter()
                        .map(|n| one_line(n.as_str()))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                write!(
                    f,
                    "wanted nodes missing from the cluster topology: {}",
                    list(nodes)
                )?;
                if known.is_empty() {
                    f.write_str(" (the topology lists no node)")
                } else {
                    write!(f, " (it lists {})", list(known))
                }
            }
            FailureReason::FenceNotPersisted { detail } => {
                write!(
                    f,
                    "submission fence could not be persisted (nothing sent): {}",
                    one_line(detail)
                )
            }
            FailureReason::Refused { status, detail } => {
                write!(
                    f,
                    "submission refused with HTTP {status}: {}",
                    one_line(detail)
                )
            }
            FailureReason::NotSent { detail } => {
                write!(f, "submission not sent: {}", one_line(detail))
            }
            FailureReason::CommandRejected { message } => {
                write!(f, "command rejected: {}", one_line(message))
            }
            FailureReason::InstanceFailed { message } => {
                write!(f, "instance failed: {}", one_line(message))
            }
            FailureReason::RunnerFailed {
                node,
                runner,
                message,
            } => {
                write!(f, "runner {runner} on {node} failed: {}", one_line(message))
            }
            FailureReason::DownloadFailed { node, message } => {
                write!(f, "download on {node} failed: {}", one_line(message))
            }
            FailureReason::InstanceRemoved { detail } => match detail {
                Some(d) => write!(f, "instance disappeared after acceptance ({})", one_line(d)),
                None => f.write_str("instance disappeared after acceptance"),
            },
            FailureReason::ContextLimitTooSmall { limit, requested } => {
                write!(
                    f,
                    "accepted instance holds {limit} context tokens, {requested} requested"
                )
            }
            FailureReason::ReadinessTimedOut { deadline, reasons } => {
                write!(f, "not ready by {deadline}: {}", summarise(reasons))
            }
            FailureReason::ProbeFailed { detail } => {
                write!(f, "inference probe failed: {}", one_line(detail))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum UncertainReason {
    /// Neither the instance nor a terminal failure was observed before the deadline.
    NotObservedBeforeDeadline {
        deadline: Millis,
    },
    ContradictoryEvidence {
        reasons: Vec<Reason>,
    },
    /// At the deadline the instance had been seen but current evidence could not be read.
    EvidenceUnavailable {
        reasons: Vec<Reason>,
    },
    /// The acknowledgement names a different instance than the one submitted.
    ResponseNamesOtherInstance {
        submitted: InstanceId,
        answered: InstanceId,
    },
    /// The instance in state runs on other nodes than the submitted one.
    PlacementDiffers {
        expected: Vec<NodeId>,
        observed: Vec<NodeId>,
    },
    /// The instance in state carries another model card on `node` than the one the
    /// fence stored at submission: whatever runs there is not what was approved.
    CardDiffersFromFence {
        node: NodeId,
        submitted: String,
        observed: String,
    },
    /// After a restart the management API is another node: reconciling there proves
    /// nothing about the submission.
    ManagementIdentityChanged {
        expected: NodeId,
        observed: NodeId,
    },
    /// After a restart the compute endpoint is another node than the fence bound.
    ComputeIdentityChanged {
        expected: NodeId,
        observed: NodeId,
    },
    /// The probe succeeded but other instances serve the same model and the answer does
    /// not say which one served it.
    ProbeNotAttributable {
        others: Vec<InstanceId>,
    },
    ProbeTransport {
        detail: String,
    },
    /// The probe succeeded but the evidence no longer agreed.
    ProbeNotConfirmed {
        verdict: String,
    },
}

impl fmt::Display for UncertainReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UncertainReason::NotObservedBeforeDeadline { deadline } => {
                write!(
                    f,
                    "neither the instance nor a terminal failure was observed by {deadline}"
                )
            }
            UncertainReason::ContradictoryEvidence { reasons } => {
                write!(f, "observations disagree: {}", summarise(reasons))
            }
            UncertainReason::EvidenceUnavailable { reasons } => {
                write!(
                    f,
                    "no current evidence at the deadline: {}",
                    summarise(reasons)
                )
            }
            UncertainReason::ResponseNamesOtherInstance {
                submitted,
                answered,
            } => {
                write!(
                    f,
                    "acknowledgement names instance {answered}, {submitted} was submitted"
                )
            }
            UncertainReason::CardDiffersFromFence {
                node,
                submitted,
                observed,
            } => write!(
                f,
                "instance on {node} carries card {} instead of the submitted {}",
                one_line(observed),
                one_line(submitted)
            ),
            UncertainReason::PlacementDiffers { expected, observed } => write!(
                f,
                "instance runs on {} instead of {}",
                observed
                    .iter()
                    .map(NodeId::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
                expected
                    .iter()
                    .map(NodeId::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            UncertainReason::ManagementIdentityChanged { expected, observed } => {
                write!(
                    f,
                    "management API is now node {observed}, the submission went to {expected}"
                )
            }
            UncertainReason::ComputeIdentityChanged { expected, observed } => {
                write!(
                    f,
                    "the compute endpoint is now node {observed}, the fence bound {expected}"
                )
            }
            UncertainReason::ProbeNotAttributable { others } => write!(
                f,
                "probe answered, but {} other instance(s) serve the same model",
                others.len()
            ),
            UncertainReason::ProbeTransport { detail } => {
                write!(f, "probe outcome unknown: {}", one_line(detail))
            }
            UncertainReason::ProbeNotConfirmed { verdict } => {
                write!(
                    f,
                    "probe answered but readiness not confirmed: {}",
                    one_line(verdict)
                )
            }
        }
    }
}

/// Something worth showing an operator that did not end the workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Note {
    /// `GET /models/requirements` is not served (Skulk 1.3.0): requirements unknown.
    RequirementsUnavailable { detail: String },
    /// The submission's response was lost or ambiguous; reconciling instead of re-posting.
    SubmissionOutcomeUnknown { detail: String },
    /// The acknowledgement could not be read; reconciling.
    AcknowledgementUnreadable { detail: String },
    /// A poll of `/state` during reconciliation failed.
    PollFailed { detail: String },
    /// Resumed from a persisted fence.
    Resumed { instance_id: InstanceId },
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::RequirementsUnavailable { detail } => {
                write!(
                    f,
                    "model requirements unavailable, continuing without: {}",
                    one_line(detail)
                )
            }
            Note::SubmissionOutcomeUnknown { detail } => {
                write!(
                    f,
                    "submission outcome unknown ({}); reconciling, not re-posting",
                    one_line(detail)
                )
            }
            Note::AcknowledgementUnreadable { detail } => {
                write!(
                    f,
                    "acknowledgement unreadable ({}); reconciling",
                    one_line(detail)
                )
            }
            Note::PollFailed { detail } => write!(f, "state poll failed: {}", one_line(detail)),
            Note::Resumed { instance_id } => {
                write!(f, "resumed reconciliation of {instance_id} from its fence")
            }
        }
    }
}
