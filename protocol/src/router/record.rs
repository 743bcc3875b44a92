//! Per-request router state: the spec's request record (§2.1) plus its decision record.

use std::sync::Arc;

use serde::Serialize;

use super::Phase;
use super::error::{LastAttempt, NoFeasible};
use crate::candidate::Infeasible;
use crate::decision::{AttemptRecord, DecisionRecord};
use crate::ids::{AssignmentId, WorkerId};
use crate::request::GenerationRequest;

/// One request as the router tracks it. The candidate snapshot lives in `record` (moved
/// there at submission, never copied); `current` and `next` index its feasible list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Entry {
    pub(super) request: Arc<GenerationRequest>,
    pub(super) phase: Phase,
    /// Last attempt number used (0 before the first offer).
    pub(super) attempt: u64,
    /// The current (latest) assignment.
    pub(super) assignment: Option<AssignmentId>,
    /// Offer-order position of the current attempt's candidate.
    pub(super) current: Option<usize>,
    /// Offer-order position of the next candidate to try.
    pub(super) next: usize,
    /// Deltas delivered to the client.
    pub(super) delivered: u32,
    pub(super) record: DecisionRecord,
}

/// Infeasibility reasons in the order they are checked (candidate::estimate_shape).
const INFEASIBLE_ORDER: [Infeasible; 6] = [
    Infeasible::NotExact,
    Infeasible::WorkerOffline,
    Infeasible::ModelNotLoaded,
    Infeasible::ContextCapacityExceeded,
    Infeasible::PrefixLongerThanRequest,
    Infeasible::InsufficientPages,
];

impl Entry {
    pub(super) fn is_current(&self, assignment: &AssignmentId) -> bool {
        self.assignment.as_ref() == Some(assignment)
    }

    pub(super) fn current_worker(&self) -> Option<&WorkerId> {
        let i = self.current?;
        self.record
            .candidates
            .feasible
            .get(i)
            .map(|s| &s.candidate.worker_id)
    }

    pub(super) fn last_attempt_mut(&mut self) -> Option<&mut AttemptRecord> {
        self.record.attempts.last_mut()
    }

    /// What was tried, for [`super::RouterError::NoFeasibleWorker`].
    pub(super) fn no_feasible(&self) -> NoFeasible {
        let ranking = &self.record.candidates;
        let infeasible = INFEASIBLE_ORDER
            .iter()
            .filter_map(|reason| {
                let n = ranking
                    .infeasible
                    .iter()
                    .filter(|s| s.estimate.infeasible == Some(*reason))
                    .count();
                (n > 0).then_some((*reason, n as u32))
            })
            .collect();
        NoFeasible {
            candidates: (ranking.feasible.len() + ranking.infeasible.len()) as u32,
            infeasible,
            attempts: self.attempt,
            last: self.record.attempts.last().map(|a| LastAttempt {
                worker: a.worker.clone(),
                outcome: a.outcome.clone(),
            }),
        }
    }
}
