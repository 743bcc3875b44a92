//! The console's derived rows, one type per panel. They are plain, serialisable data:
//! the TUI draws them and `den status --json` prints them, so both show the same thing.
//!
//! Rows hold absolute times ([`Millis`] of the console session), never ages: how old a
//! value is depends on the `now` a frame is drawn at, so a replay of the same events
//! draws the same frames. `None` means "not reported" and is drawn as `—`, distinct
//! from zero; contradictions are carried as text and drawn flagged.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use den_protocol::candidate::Tier;
use den_protocol::decision::DecisionRecord;
use den_protocol::ids::{NodeId, RequestId, WorkerId};
use den_protocol::observation::{PoolStats, TierUsage};
use den_protocol::session::{SourceId, SourceKind};
use den_protocol::time::Millis;

/// How healthy something is, for colour and for the problem counts of the panel tabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    Good,
    Info,
    /// Not there yet, or one-sided.
    Warn,
    Bad,
    /// Missing evidence or contradicting observations: never shown as good.
    Unknown,
}

impl Level {
    pub fn is_problem(self) -> bool {
        matches!(self, Level::Warn | Level::Bad | Level::Unknown)
    }
}

/// One piece of evidence: ✓ ✗ … ? or ! (contradiction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mark {
    Ok,
    Bad,
    Pending,
    Unknown,
    Contradiction,
}

impl Mark {
    /// The worse of two marks (bad > contradiction > unknown > pending > ok).
    pub fn worse(self, other: Mark) -> Mark {
        let rank = |m: Mark| match m {
            Mark::Ok => 0,
            Mark::Pending => 1,
            Mark::Unknown => 2,
            Mark::Contradiction => 3,
            Mark::Bad => 4,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Mark::Ok => "✓",
            Mark::Bad => "✗",
            Mark::Pending => "…",
            Mark::Unknown => "?",
            Mark::Contradiction => "!",
        }
    }

    pub fn level(self) -> Level {
        match self {
            Mark::Ok => Level::Good,
            Mark::Bad => Level::Bad,
            Mark::Pending => Level::Warn,
            Mark::Unknown | Mark::Contradiction => Level::Unknown,
        }
    }
}

/// A mark with the reason behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evidence {
    pub mark: Mark,
    pub note: String,
}

impl Evidence {
    pub fn new(mark: Mark, note: impl Into<String>) -> Evidence {
        Evidence {
            mark,
            note: note.into(),
        }
    }
}

/// A source's connection as the console sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Health {
    /// Configured; nothing heard yet.
    Connecting,
    Connected,
    /// Polls or the feed fail since `since`.
    Disconnected {
        since: Millis,
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceRow {
    pub source: SourceId,
    pub kind: SourceKind,
    pub url: String,
    /// The console feed (den routers only).
    pub feed: Option<Health>,
    /// Polling of the management API.
    pub api: Health,
    /// Latency of the last poll (successful or not).
    pub latency_ms: Option<u64>,
    /// When the source last answered successfully.
    pub last_ok: Option<Millis>,
    /// The node id its `/node_id` answers.
    pub node: Option<NodeId>,
    /// A den router's id (from the feed's `hello`).
    pub router: Option<NodeId>,
}

impl SourceRow {
    /// The worse of feed and API health.
    pub fn health(&self) -> &Health {
        match (&self.feed, &self.api) {
            (Some(feed @ Health::Disconnected { .. }), _) => feed,
            (_, api @ Health::Disconnected { .. }) => api,
            (Some(Health::Connecting), _) => &Health::Connecting,
            (_, api) => api,
        }
    }
}

/// How a node's identity is established.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Identity {
    /// A source's `/node_id` answers this node.
    Bound { source: SourceId },
    /// A source answered another node than the one bound to it.
    Conflict {
        source: SourceId,
        expected: NodeId,
        observed: NodeId,
    },
    /// Only seen in topologies or feeds; no endpoint of ours is this node.
    NotBound,
}

/// Two-sided membership, from the evidence reducer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum MembershipView {
    Member {
        observers: usize,
    },
    OneSided {
        seen_by: Vec<SourceId>,
    },
    NotMember,
    /// No fresh source to tell.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeRow {
    pub node: NodeId,
    pub name: Option<String>,
    pub identity: Identity,
    pub membership: MembershipView,
    pub membership_reasons: Vec<String>,
    /// The latest time any source reported the node (topology or heartbeat).
    pub observed_at: Option<Millis>,
    /// When the node was last seen by the source itself (Skulk's `lastSeen`), on this
    /// session's clock; `None` where no source sends one.
    pub source_seen_at: Option<Millis>,
    pub ram_available: Option<u64>,
    pub ram_total: Option<u64>,
    pub gpu_usage: Option<f64>,
    pub accelerator: Option<String>,
    /// Page pools of the den workers on this node (summed).
    pub pool: Option<PoolStats>,
    pub workers: Vec<WorkerId>,
    pub draining: bool,
    /// `nodeHealth[node].level` alone (`ok`, `warn`, `error`).
    pub health_level: Option<String>,
    /// Each health reason as `message — remediation` (the code where no message).
    pub health_reasons: Vec<String>,
    /// OS, build, chip and machine model from `nodeIdentities`, where reported.
    pub system: Option<String>,
    /// The Skulk version and commit the node reports.
    pub version: Option<String>,
    pub disk_available: Option<u64>,
    pub disk_total: Option<u64>,
    pub level: Level,
}

/// The state of one download record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DownloadStatus {
    Pending,
    Ongoing,
    Completed,
    Failed,
    Unknown(String),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DownloadRow {
    /// `node/model/attempt`.
    pub key: String,
    /// Attempts of the same artifact on the same node share a group.
    pub group: String,
    pub node: NodeId,
    pub model: String,
    /// Signed card id, when the card has one.
    pub card: Option<String>,
    /// `None` for a legacy record without attempt id (incomplete evidence).
    pub attempt: Option<String>,
    pub status: DownloadStatus,
    pub downloaded: Option<u64>,
    pub total: Option<u64>,
    /// Bytes per second.
    pub rate: Option<f64>,
    /// Skulk's own estimate of the time left (`etaMs` of an ongoing record).
    pub eta_ms: Option<u64>,
    /// Files done of files in all (an ongoing record).
    pub files: Option<(u64, u64)>,
    pub error: Option<String>,
    /// What an operator should know that is not an error: a download no instance needs
    /// (Skulk keeps downloads after a delete), or one that has not moved for minutes.
    pub hint: Option<String>,
    pub seen_by: Vec<SourceId>,
    /// Sources disagree about this record, or the evidence reducer flags it.
    pub contradiction: Option<String>,
    /// The newest poll that reported it.
    pub observed_at: Millis,
    pub level: Level,
}

/// The verdict of an instance, flattened for display.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerdictView {
    /// `ready`, `not ready`, `uncertain`, `lost`, `failed`.
    pub kind: String,
    /// Initial deadline (not ready) or recovery deadline (lost).
    pub deadline: Option<Millis>,
    pub since: Option<Millis>,
    pub reasons: Vec<String>,
    pub level: Level,
}

/// An instance that left every fresh `/state`. Skulk never brings an instance id
/// back, so it is shown as removed (no deadline, no delete offered) and then ages out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub last_seen: Millis,
    /// `deleted through den` when this session sent its delete, else what the cluster did.
    pub cause: String,
}

/// One row of the Instances panel: an instance, or one of its assigned nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "row", rename_all = "kebab-case")]
pub enum InstanceRow {
    Instance {
        instance: String,
        model: Option<String>,
        nodes: usize,
        presence: String,
        context_limit: Option<u64>,
        verdict: VerdictView,
        /// The worst mark of each evidence kind over the assigned nodes.
        download: Mark,
        runner: Mark,
        probe: Mark,
        failures: Vec<String>,
        /// The newest poll of any source that contributed.
        observed_at: Option<Millis>,
        /// Gone from every fresh view: when it was last seen and why it went.
        removed: Option<Removed>,
        /// Skulk's lifecycle and generation tasks of the instance, one line each
        /// (`TextGeneration …3a1f Running, command 6ed67eec`), from the freshest state.
        tasks: Vec<String>,
    },
    Assignment {
        instance: String,
        node: NodeId,
        runner: String,
        download: Evidence,
        runner_status: Evidence,
        probe: Evidence,
        membership: Evidence,
        /// The backend the master resolved for this node's shard (`resolvedBackend`).
        backend: Option<String>,
        /// As of the instance's newest contributing poll.
        observed_at: Option<Millis>,
    },
}

impl InstanceRow {
    pub fn observed_at(&self) -> Option<Millis> {
        match self {
            InstanceRow::Instance { observed_at, .. }
            | InstanceRow::Assignment { observed_at, .. } => *observed_at,
        }
    }

    pub fn instance(&self) -> &str {
        match self {
            InstanceRow::Instance { instance, .. } | InstanceRow::Assignment { instance, .. } => {
                instance
            }
        }
    }
}

/// One worker's page pool (den feed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PageRow {
    pub source: SourceId,
    pub worker: WorkerId,
    pub node: NodeId,
    pub pool: PoolStats,
    /// Occupancy (`1 - free/total`) in percent of the latest heartbeats, oldest first.
    pub history: Vec<u8>,
    pub tiers: BTreeMap<Tier, TierUsage>,
    pub evictions: BTreeMap<String, u64>,
    pub draining: bool,
    pub online: bool,
    pub backend: String,
    pub queue_depth: u32,
    /// Console time of the latest heartbeat.
    pub observed_at: Millis,
    /// The router detached the worker (its reason).
    pub gone: Option<String>,
    /// The stats break their own rules (e.g. evictable > resident).
    pub inconsistent: Option<String>,
}

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoutePhase {
    /// Held by the router until a worker has the KV pages for it.
    Waiting,
    Offered,
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl RoutePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RoutePhase::Waiting => "waiting",
            RoutePhase::Offered => "offered",
            RoutePhase::Running => "running",
            RoutePhase::Completed => "completed",
            RoutePhase::Failed => "failed",
            RoutePhase::Cancelled => "cancelled",
        }
    }

    pub fn is_live(self) -> bool {
        matches!(
            self,
            RoutePhase::Waiting | RoutePhase::Offered | RoutePhase::Running
        )
    }
}

/// One request the router decided on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteRow {
    pub source: SourceId,
    pub request: RequestId,
    pub model: String,
    pub worker: Option<WorkerId>,
    pub tier: Option<Tier>,
    pub cached_tokens: Option<u32>,
    pub predicted_ttft_ms: Option<f64>,
    pub measured_ttft_ms: Option<u64>,
    pub phase: RoutePhase,
    pub attempt: u64,
    /// Every decline, timeout and failure, in attempt order (`worker: outcome`).
    pub setbacks: Vec<String>,
    /// The terminal error, for failed requests.
    pub error: Option<String>,
    /// Router time of submission.
    pub submitted_at: Millis,
    /// Console time of the latest change.
    pub updated_at: Millis,
    /// The whole record, for the detail view.
    #[serde(skip)]
    pub record: Arc<DecisionRecord>,
}

/// One line of the Events panel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLine {
    /// Position in the session's log (1, 2, …).
    pub seq: u64,
    pub at: Millis,
    pub source: Option<SourceId>,
    pub level: Level,
    pub text: String,
}
