//! Offer admission (spec §3.2): semantic checks in order, then capacity.

use std::sync::Arc;

use super::{
    Assignment, AssignmentPhase, Finished, LocalWorkerEffect, Operation, OperationKind, Work,
    Worker, WorkerEffect,
};
use crate::candidate::{Infeasible, estimate};
use crate::capacity::{AdmitRequest, Capacity, DeclineReason};
use crate::ids::AssignmentId;
use crate::time::Millis;
use crate::wire::{Offer, OfferResult, ResultMessage, WorkerMessage, WorkerTimings};

type Out = Vec<WorkerEffect>;

impl<C: Capacity> Worker<C> {
    pub(super) fn on_offer(&mut self, now: Millis, offer: Box<Offer>, out: &mut Out) {
        // 1. Duplicate: re-acknowledge; re-send a terminal result. No state change.
        if let Some(finished) = self.finished.get(&offer.assignment) {
            out.push(self.offer_result(&offer.assignment, None));
            if let Finished::Completed { result } | Finished::Failed { result } = finished {
                out.push(WorkerEffect::Send(WorkerMessage::Result(ResultMessage {
                    assignment: offer.assignment.clone(),
                    result: Box::new(result.clone()),
                })));
            }
            return;
        }
        if self.active.contains_key(&offer.assignment) {
            out.push(self.offer_result(&offer.assignment, None));
            return;
        }
        if let Some(reason) = self.semantic_decline(&offer) {
            out.push(self.offer_result(&offer.assignment, Some(reason)));
            return;
        }
        // Re-estimate: the router's view may be stale. Pages are the capacity's call.
        let estimate = estimate(&offer.request, &offer.candidate);
        if let Some(reason) = estimate.infeasible
            && reason != Infeasible::InsufficientPages
        {
            out.push(self.offer_result(&offer.assignment, Some(reason.into())));
            return;
        }
        let route = offer.request.route_id();
        let admitted = self.capacity.admit(AdmitRequest {
            assignment: &offer.assignment,
            route: &route,
            request: &offer.request,
            candidate: &offer.candidate,
            estimate: &estimate,
            protected: &self.protected,
        });
        let admission = match admitted {
            Ok(admission) => admission,
            Err(reason) => {
                out.push(self.offer_result(&offer.assignment, Some(reason)));
                return;
            }
        };
        // First operation (§3.3).
        let c = &offer.candidate;
        // What is resident (forked at admission) is reused as is; a lower tier restores
        // the rest of its prefix first.
        let resident = c.resident_tokens();
        let (phase, kind) = if c.cached_token_count > resident {
            (AssignmentPhase::Restoring, OperationKind::Restore)
        } else if estimate.missing > 0 {
            (AssignmentPhase::Prefilling, OperationKind::Prefill)
        } else {
            (AssignmentPhase::Decoding, OperationKind::Decode)
        };
        // A restored prefix counts once restored.
        let cached_token_count = resident;
        let Offer {
            assignment,
            request,
            candidate,
            ..
        } = *offer;
        let work = Arc::new(Work {
            assignment: assignment.clone(),
            request,
            candidate,
            estimate,
            route,
            admission,
        });
        self.insert_active(
            assignment.clone(),
            Assignment {
                work: Arc::clone(&work),
                phase,
                in_flight: Some(kind),
                emitted: 0,
                cached_token_count,
                accepted_at: now,
                op_started_at: now,
                timings: WorkerTimings::default(),
            },
        );
        out.push(self.offer_result(&assignment, None));
        out.push(WorkerEffect::Local(LocalWorkerEffect::Start(Operation {
            kind,
            worker: self.id.clone(),
            work,
        })));
    }

    /// Checks 2–6 of §3.2 and draining, in order. Declines change no state.
    fn semantic_decline(&self, offer: &Offer) -> Option<DeclineReason> {
        if !self.online {
            return Some(DeclineReason::WorkerOffline);
        }
        if offer.worker_epoch != self.epoch {
            return Some(DeclineReason::WorkerEpochChanged);
        }
        if offer.candidate.worker_id != self.id {
            return Some(DeclineReason::WrongWorker);
        }
        if !self.models.contains(&offer.request.model) {
            return Some(DeclineReason::ModelNotLoaded);
        }
        // Quiescing assignments count: their operation may still write the route.
        if self.serves(&offer.request.id) {
            return Some(DeclineReason::RequestAlreadyAssigned);
        }
        if self.draining {
            return Some(DeclineReason::Draining);
        }
        None
    }

    /// An offer result carrying the worker's current epoch; `None` means accepted.
    fn offer_result(
        &self,
        assignment: &AssignmentId,
        decline: Option<DeclineReason>,
    ) -> WorkerEffect {
        WorkerEffect::Send(WorkerMessage::OfferResult(OfferResult {
            assignment: assignment.clone(),
            worker_epoch: self.epoch,
            accepted: decline.is_none(),
            reason: decline,
        }))
    }
}
