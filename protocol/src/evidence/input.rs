//! What the evidence reducer takes and says: its configuration, the observations a
//! runtime feeds [`super::EvidenceReducer::handle`] (polls, probes, expectations) and the
//! notices it returns.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{EndpointLabel, Reason, Verdict};
use crate::ids::NodeId;
use crate::skulk::{InstanceId, State};
use crate::time::Millis;

/// How records without attempt ids count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptPolicy {
    /// A completed record without attempt id counts (flagged incomplete in the report)
    /// only when its `/state` carried no attempt ids at all, i.e. a Skulk 1.3.0 server
    /// that cannot attribute attempts. Where the dialect has attempt ids, an unattributed
    /// record does not count.
    LegacyDialectOnly,
    /// Only attempt-attributed completions count.
    Strict,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceConfig {
    /// An endpoint's evidence expires this long after its last successful poll.
    pub stale_after_ms: u64,
    /// Default deadline for initial readiness, from when the instance is first tracked.
    pub initial_deadline_ms: u64,
    /// How long lost readiness may take to recover before the verdict is `Failed`.
    pub recovery_deadline_ms: u64,
    pub attempt_policy: AttemptPolicy,
    /// Track every instance seen in any state (a console), or only expected ones.
    pub track_all_instances: bool,
    /// An endpoint registered without an expected node that answers as a new node id is
    /// followed (an observer watching a Skulk node restart) instead of becoming a sticky
    /// conflict (a placement, whose instance lived on the old node).
    #[serde(default)]
    pub follow_restarts: bool,
    /// Stop tracking an instance this long after it left every fresh view (an observer
    /// shows removed instances for a while, then ages them out); `None` keeps them.
    #[serde(default)]
    pub forget_gone_after_ms: Option<u64>,
}

impl Default for EvidenceConfig {
    fn default() -> Self {
        EvidenceConfig {
            stale_after_ms: 10_000,
            initial_deadline_ms: 15 * 60_000,
            recovery_deadline_ms: 2 * 60_000,
            attempt_policy: AttemptPolicy::LegacyDialectOnly,
            track_all_instances: true,
            follow_restarts: false,
            forget_gone_after_ms: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Registers an endpoint (again), optionally with the node id it must answer
    /// (the compute node bound to an external resource). Resets its binding.
    Endpoint {
        endpoint: EndpointLabel,
        expected_node: Option<NodeId>,
    },
    /// One poll of an endpoint.
    Poll(PollObservation),
    /// The outcome of an ordinary inference request sent through the management API.
    Probe {
        instance: InstanceId,
        outcome: ProbeOutcome,
    },
    /// Track an instance (e.g. one just submitted) with its deadlines.
    Expect(Expectation),
    /// Stop tracking an instance.
    Forget { instance: InstanceId },
    /// Time passed; deadlines are re-evaluated.
    Tick,
}

/// One poll cycle of an endpoint: the `GET /node_id` answer if it was asked, and the
/// outcome of `GET /state` (bounded by the runtime's request deadline).
#[derive(Debug, Clone, PartialEq)]
pub struct PollObservation {
    pub endpoint: EndpointLabel,
    pub node_id: Option<NodeId>,
    pub result: PollResult,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PollResult {
    State(Box<State>),
    Failed(PollFailure),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollFailure {
    pub kind: PollFailureKind,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PollFailureKind {
    Timeout,
    Transport,
    Http(u16),
    Decode,
}

impl fmt::Display for PollFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let detail = crate::skulk::common::one_line(&self.detail);
        match self.kind {
            PollFailureKind::Timeout => write!(f, "timed out: {detail}"),
            PollFailureKind::Transport => write!(f, "transport error: {detail}"),
            PollFailureKind::Http(status) => write!(f, "HTTP {status}: {detail}"),
            PollFailureKind::Decode => write!(f, "unreadable response: {detail}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeOutcome {
    /// The request completed. `served_by` names the instance when the server says.
    Succeeded {
        served_by: Option<InstanceId>,
    },
    Failed {
        detail: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    pub instance: InstanceId,
    /// Initial readiness deadline; defaults to first tracking + `initial_deadline_ms`.
    pub deadline: Option<Millis>,
    /// The external resource's expiry: an upper bound for every deadline.
    pub hard_expiry: Option<Millis>,
}

/// Something that happened, reported at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[must_use = "an effect is a decision to carry out, not a value to drop"]
pub enum Notice {
    VerdictChanged {
        instance: InstanceId,
        verdict: Verdict,
    },
    /// Previously ready capacity lost readiness.
    ReadinessLost {
        instance: InstanceId,
        reasons: Vec<Reason>,
        recover_by: Millis,
    },
    ReadinessRecovered {
        instance: InstanceId,
    },
    InitialDeadlineExceeded {
        instance: InstanceId,
        deadline: Millis,
    },
    RecoveryDeadlineExceeded {
        instance: InstanceId,
        deadline: Millis,
    },
    IdentityConflict {
        endpoint: EndpointLabel,
        expected: NodeId,
        observed: NodeId,
    },
    /// An unpinned endpoint now answers as a new node id (with `follow_restarts`): the
    /// previous node left with everything it said, the new one joins.
    NodeRestarted {
        endpoint: EndpointLabel,
        previous: NodeId,
        node: NodeId,
    },
}
