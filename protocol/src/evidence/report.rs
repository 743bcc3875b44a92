//! What the reducer reports: per endpoint, per node and per instance.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::download::DownloadEvidence;
use super::endpoint::{Binding, Freshness};
use super::reason::Reason;
use super::verdict::Verdict;
use super::{EndpointLabel, ProbeOutcome};
use crate::ids::NodeId;
use crate::skulk::{InstanceId, ModelId, RunnerId, RunnerPhase, RunnerStatus, StateDialect};
use crate::time::Millis;

/// The whole picture at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceReport {
    pub at: Millis,
    pub endpoints: BTreeMap<EndpointLabel, EndpointReport>,
    pub nodes: BTreeMap<NodeId, NodeReport>,
    pub instances: BTreeMap<InstanceId, InstanceReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointReport {
    pub binding: Binding,
    pub freshness: Freshness,
    pub last_ok: Option<Millis>,
    /// The dialect of the latest `/state` (which newer fields it carried).
    pub dialect: Option<StateDialect>,
}

/// Two-sided membership of one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Membership {
    /// Every fresh endpoint lists the node in its topology and, where the dialect has
    /// `nodeResources`, holds a live resource observation of it.
    Member { observers: BTreeSet<EndpointLabel> },
    /// Some fresh endpoints see the node and others do not: an incomplete join or
    /// interrupted communication.
    OneSided {
        seen_by: BTreeSet<EndpointLabel>,
        reasons: Vec<Reason>,
    },
    /// No fresh endpoint sees the node.
    NotMember { reasons: Vec<Reason> },
    /// No fresh endpoint at all.
    Unknown,
}

impl Membership {
    pub fn is_member(&self) -> bool {
        matches!(self, Membership::Member { .. })
    }

    pub fn reasons(&self) -> &[Reason] {
        match self {
            Membership::OneSided { reasons, .. } | Membership::NotMember { reasons } => reasons,
            Membership::Member { .. } | Membership::Unknown => &[],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The endpoint bound to this node, if any.
    pub endpoint: Option<EndpointLabel>,
    pub membership: Membership,
    /// Every artifact with download records on the node.
    pub downloads: Vec<DownloadEvidence>,
}

/// Where the instance is seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Presence {
    Observed {
        endpoints: BTreeSet<EndpointLabel>,
    },
    NotYetObserved,
    Gone {
        last_seen: Millis,
    },
    Disputed {
        present_on: BTreeSet<EndpointLabel>,
        absent_on: BTreeSet<EndpointLabel>,
    },
    /// No fresh endpoint to look at.
    Unknown,
}

/// The runner evidence of one assigned node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunnerEvidence {
    pub runner: RunnerId,
    /// The status each fresh endpoint reports.
    pub observed: BTreeMap<EndpointLabel, RunnerStatus>,
    /// The agreed phase; `None` when missing or contradictory.
    pub phase: Option<RunnerPhase>,
    /// The `RunnerFailed` message, if any view reports one.
    pub failure: Option<String>,
}

/// One node of the instance's `shardAssignments.nodeToRunner`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssignmentReport {
    pub node: NodeId,
    pub runner: RunnerEvidence,
    /// `None` when the node's shard has no readable card.
    pub download: Option<DownloadEvidence>,
    pub membership: Membership,
    /// The backend the master resolved for the shard (`resolvedBackend`), if it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_backend: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub at: Millis,
    pub outcome: ProbeOutcome,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceReport {
    pub instance_id: InstanceId,
    pub model_id: Option<ModelId>,
    pub first_seen: Millis,
    pub presence: Presence,
    /// The admission ceiling as currently stamped (the master may recompute it).
    pub context_token_limit: Option<u64>,
    pub assignments: Vec<AssignmentReport>,
    pub probe: Option<ProbeRecord>,
    /// Terminal failure records and failed lifecycle tasks.
    pub failures: Vec<Reason>,
    /// Download, runners and membership agree; only the inference probe is missing or
    /// stale. This is when a controller sends its one probe.
    pub awaiting_probe: bool,
    pub verdict: Verdict,
}

impl InstanceReport {
    /// Reasons of the current verdict.
    pub fn reasons(&self) -> &[Reason] {
        self.verdict.reasons()
    }

    /// The first `RunnerFailed` message among the assignments.
    pub fn runner_failure(&self) -> Option<(&NodeId, &RunnerId, &str)> {
        self.assignments.iter().find_map(|a| {
            a.runner
                .failure
                .as_deref()
                .map(|m| (&a.node, &a.runner.runner, m))
        })
    }
}
