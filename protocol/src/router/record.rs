//! Per-request router state: the spec's request record (§2.1) plus its decision record.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;

use super::Phase;
use super::error::{LastAttempt, NoFeasible};
use crate::candidate::Infeasible;
use crate::capacity::DeclineReason;
use crate::decision::{AttemptRecord, DecisionRecord};
use crate::ids::{AssignmentId, WorkerId};
use crate::request::GenerationRequest;

/// One request as the router tracks it. The candidate snapshot lives in `record` (moved
/// there at submission, never copied); `current` indexes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Entry {
    pub(super) request: Arc<GenerationRequest>,
    pub(super) phase: Phase,
    /// Last attempt number used (0 before the first offer).
    pub(super) attempt: u64,
    /// The current (latest) assignment.
    pub(super) assignment: Option<AssignmentId>,
    /// Snapshot index of the current attempt's candidate.
    pub(super) current: Option<usize>,
    /// Candidates offered so far (= the offer-order position of the next one).
    pub(super) offered: usize,
    /// The full offer order, sorted lazily at the first fallback.
    pub(super) order: Vec<usize>,
    /// Position in `order` of the next candidate to consider.
    pub(super) cursor: usize,
    /// Workers whose remaining alternatives are skipped: they timed out, went away, or
    /// declined for a reason that holds for every alternative on them (see
    /// [`skips_worker`]).
    pub(super) excluded: BTreeSet<WorkerId>,
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
        self.record.candidates.get(i).map(|(c, _)| &c.worker_id)
    }

    /// The snapshot index of the next candidate to offer, if any is left.
    pub(super) fn next_candidate(&mut self) -> Option<usize> {
        if self.offered == 0 {
            // The best candidate is the head of the offer order (a property test holds
            // the two equal), so the first offer needs no sort.
            self.cursor = 1;
            return self.record.candidates.best();
        }
        if self.order.is_empty() {
            self.order = self.record.candidates.offer_order();
        }
        while let Some(&i) = self.order.get(self.cursor) {
            self.cursor += 1;
            let skip = self
                .record
                .candidates
                .get(i)
                .is_some_and(|(c, _)| self.excluded.contains(&c.worker_id));
            if !skip {
                return Some(i);
            }
        }
        None
    }

    /// Skip the rest of `worker`'s alternatives for this request.
    pub(super) fn exclude(&mut self, worker: WorkerId) {
        self.excluded.insert(worker);
    }

    pub(super) fn last_attempt_mut(&mut self) -> Option<&mut AttemptRecord> {
        self.record.attempts.last_mut()
    }

    /// What was tried, for [`super::RouterError::NoFeasibleWorker`].
    pub(super) fn no_feasible(&self) -> NoFeasible {
        let snapshot = &self.record.candidates;
        let infeasible = INFEASIBLE_ORDER
            .iter()
            .filter_map(|reason| {
                let n = snapshot
                    .infeasible()
                    .filter(|(_, e)| e.infeasible == Some(*reason))
                    .count();
                (n > 0).then_some((*reason, n as u32))
            })
            .collect();
        NoFeasible {
            candidates: snapshot.len() as u32,
            infeasible,
            attempts: self.attempt,
            last: self.record.attempts.last().map(|a| LastAttempt {
                worker: a.worker.clone(),
                outcome: a.outcome.clone(),
            }),
        }
    }
}

/// Whether a decline means the worker's other alternatives would be declined too. Only
/// declines about one alternative keep them: a stale GPU prefix (its SSD or RAM
/// alternative may still restore, spec §6.4), or pages and shapes the next alternative
/// prices differently. Everything else — the worker is offline, draining, in another
/// epoch, without the model, or still holds an earlier attempt of this request — holds
/// for every alternative on it, and offering them would only burn attempts.
pub(super) fn skips_worker(reason: Option<DeclineReason>) -> bool {
    !matches!(
        reason,
        Some(
            DeclineReason::InsufficientPages
                | DeclineReason::ResidentPrefixUnavailable
                | DeclineReason::ResidentPrefixMismatch
                | DeclineReason::ContextCapacityExceeded
                | DeclineReason::PrefixLongerThanRequest
                | DeclineReason::NotExact
        )
    )
}
