//! Decision records: why the router sent a request where it did, and what happened.
//!
//! The router keeps one [`DecisionRecord`] per request from submission until the record
//! is garbage-collected, and emits a small [`DecisionEvent`] at every change so that
//! runtimes can stream decisions to the console and recordings without copying the whole
//! record each time. The record holds the full candidate snapshot (feasible candidates in
//! offer order, infeasible ones with their reason), every attempt with its outcome and
//! reason, and the measured outcome next to the prediction.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::candidate::{Ranking, Tier};
use crate::capacity::DeclineReason;
use crate::ids::{Epoch, ModelFingerprint, RequestId, WorkerId};
use crate::router::RouterError;
use crate::time::Millis;
use crate::wire::{Failure, WorkerTimings};

/// Everything the router decided and observed about one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub request: RequestId,
    pub model: ModelFingerprint,
    pub processed_tokens: u32,
    pub max_new_tokens: u32,
    pub submitted_at: Millis,
    pub deadline: Millis,
    /// The candidate snapshot taken at submission: feasible candidates in offer order and
    /// infeasible ones with their reason, each with its estimate (predicted TTFT).
    pub candidates: Ranking,
    pub attempts: Vec<AttemptRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_delta_at: Option<Millis>,
    pub delivered_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<TerminalOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Millis>,
    /// First delta − submission, or completion − submission when nothing was streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_ttft_ms: Option<u64>,
    /// The prefix tokens the worker actually reused (from its result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_cached_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_timings: Option<WorkerTimings>,
}

impl DecisionRecord {
    /// The attempt that is current or ended the request (the last one made).
    pub fn last_attempt(&self) -> Option<&AttemptRecord> {
        self.attempts.last()
    }

    /// The attempt that completed the request, if it completed.
    pub fn chosen(&self) -> Option<&AttemptRecord> {
        self.attempts
            .iter()
            .rev()
            .find(|a| a.outcome == AttemptOutcome::Completed)
    }

    /// Decline reasons in attempt order (`None` for a decline that gave no reason).
    pub fn decline_reasons(&self) -> Vec<Option<DeclineReason>> {
        self.attempts
            .iter()
            .filter_map(|a| match a.outcome {
                AttemptOutcome::Declined { reason, .. } => Some(reason),
                _ => None,
            })
            .collect()
    }

    pub fn is_terminal(&self) -> bool {
        self.outcome.is_some()
    }
}

/// One offer of the request to one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempt: u64,
    pub worker: WorkerId,
    pub tier: Tier,
    pub cached_tokens: u32,
    pub predicted_ttft_ms: f64,
    /// Position of the candidate in the offer order (0 = best).
    pub rank: usize,
    pub offered_at: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_at: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Millis>,
    pub outcome: AttemptOutcome,
}

/// How an attempt ended (or where it stands).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AttemptOutcome {
    /// Offered; no answer yet.
    Pending,
    /// Accepted; executing.
    Running,
    Completed,
    /// The worker declined; `worker_epoch` is the epoch it reported.
    Declined {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<DeclineReason>,
        worker_epoch: Epoch,
    },
    TimedOut,
    WorkerUnavailable,
    Failed {
        reason: Failure,
    },
    /// The client cancelled the request while this attempt was current.
    Cancelled,
    /// The request ended for another reason (its deadline) while this attempt was current.
    Superseded,
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptOutcome::Pending => f.write_str("pending"),
            AttemptOutcome::Running => f.write_str("running"),
            AttemptOutcome::Completed => f.write_str("completed"),
            AttemptOutcome::Declined {
                reason: Some(r), ..
            } => write!(f, "declined ({r})"),
            AttemptOutcome::Declined { reason: None, .. } => f.write_str("declined"),
            AttemptOutcome::TimedOut => f.write_str("timed out"),
            AttemptOutcome::WorkerUnavailable => f.write_str("became unavailable"),
            AttemptOutcome::Failed { reason } => write!(f, "failed ({reason})"),
            AttemptOutcome::Cancelled => f.write_str("cancelled"),
            AttemptOutcome::Superseded => f.write_str("superseded"),
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TerminalOutcome {
    Completed,
    Failed { error: RouterError },
    Cancelled,
}

impl fmt::Display for TerminalOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TerminalOutcome::Completed => f.write_str("completed"),
            TerminalOutcome::Failed { error } => write!(f, "failed: {error}"),
            TerminalOutcome::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// A small notice of one change to a decision record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionEvent {
    pub request: RequestId,
    pub at: Millis,
    #[serde(flatten)]
    pub kind: DecisionEventKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum DecisionEventKind {
    Submitted {
        feasible: u32,
        infeasible: u32,
        deadline: Millis,
    },
    Offered {
        attempt: u64,
        worker: WorkerId,
        tier: Tier,
        cached_tokens: u32,
        predicted_ttft_ms: f64,
    },
    Accepted {
        attempt: u64,
    },
    AttemptEnded {
        attempt: u64,
        outcome: AttemptOutcome,
    },
    FirstDelta {
        ttft_ms: u64,
    },
    Finished {
        outcome: TerminalOutcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        measured_ttft_ms: Option<u64>,
    },
    /// The record was garbage-collected after its retention period.
    Collected,
}
