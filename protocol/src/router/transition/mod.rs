//! The router's transition table (spec §2.4), one method per input.
//!
//! Every handler starts with its guard (record exists, phase, current assignment, …) and
//! returns without effects when the guard fails: that is the fencing of §2.6.

use std::sync::Arc;

use super::record::{Entry, skips_worker};
use super::{DeliveryKind, LocalRouterEffect, Phase, Router, RouterError};
use crate::candidate::Candidate;
use crate::capacity::DeclineReason;
use crate::decision::{AttemptOutcome, CandidateSnapshot, DecisionEventKind, DecisionRecord};
use crate::ids::{AssignmentId, Epoch, RequestId, WorkerId};
use crate::request::{GenerationRequest, Token};
use crate::time::Millis;
use crate::wire::{Failure, WorkerResult};

mod steps;

use steps::{
    Out, Terminal, abandon_attempt, compact_candidates, deadline_timer, decision, deliver,
    end_attempt, finish, local, offer_next, send_cancel, set_phase,
};

impl Router {
    pub(super) fn collect_garbage(&mut self, now: Millis, out: &mut Out) {
        while let Some((at, _)) = self.index.expiry.first() {
            if *at > now {
                break;
            }
            let Some((_, id)) = self.index.expiry.pop_first() else {
                break;
            };
            if let Some(e) = self.requests.remove(&id) {
                let slot = self.index.counts.slot(e.phase);
                *slot = slot.saturating_sub(1);
                self.index.counts.collected += 1;
                decision(out, &id, now, DecisionEventKind::Collected);
            }
        }
    }

    /// A new request: offered at once, or (`hold`) kept waiting for KV pages — its
    /// record and deadline timer, no offer, until `RouterInput::Release`.
    pub(super) fn on_new(
        &mut self,
        now: Millis,
        request: Arc<GenerationRequest>,
        candidates: Vec<Candidate>,
        deadline: Option<Millis>,
        hold: bool,
        out: &mut Out,
    ) {
        let Some(mut e) = self.admit(now, request, candidates, deadline, out) else {
            return;
        };
        let deadline = e.record.deadline;
        if deadline <= now {
            let error = RouterError::DeadlineExceeded { deadline };
            finish(
                &self.config,
                &mut self.index,
                &mut e,
                now,
                Terminal::Failed(error),
                out,
            );
        } else {
            out.push(deadline_timer(&e));
            if hold {
                // Up to `max_waiting` records wait, each ranked again when it leaves:
                // keep what a finished record keeps, not every worker's candidates.
                compact_candidates(&self.config, &mut e);
                set_phase(&mut self.index, &mut e, Phase::Waiting);
                decision(out, &e.request.id, now, DecisionEventKind::Waiting);
            } else {
                offer_next(&self.config, &mut self.index, &mut e, now, out);
            }
        }
        self.requests.insert(e.request.id.clone(), e);
    }

    /// A waiting request leaves the queue: its candidates are this moment's, and it is
    /// offered as a new submit is. Anything but a waiting request is ignored.
    pub(super) fn on_release(
        &mut self,
        now: Millis,
        request: &RequestId,
        candidates: Vec<Candidate>,
        out: &mut Out,
    ) {
        let Router {
            config,
            requests,
            index,
        } = self;
        let Some(e) = requests.get_mut(request) else {
            return;
        };
        if e.phase != Phase::Waiting {
            return;
        }
        let snapshot = CandidateSnapshot::score(&e.request, candidates);
        let waited_ms = now.since(e.record.submitted_at);
        let (feasible, infeasible) = snapshot.counts();
        decision(
            out,
            request,
            now,
            DecisionEventKind::Released {
                waited_ms,
                feasible,
                infeasible,
            },
        );
        e.record.candidates = snapshot;
        e.record.candidates_omitted = 0;
        e.record.waited_ms = waited_ms;
        // `offered` stays 0, so the first offer is the new snapshot's best; the phase
        // moves on there (or to failed when nothing can take it).
        set_phase(index, e, Phase::Offered);
        offer_next(config, index, e, now, out);
    }

    /// The record of a new request (`None`: a duplicate, ignored), counted as offered
    /// until its first transition; the caller inserts it.
    fn admit(
        &mut self,
        now: Millis,
        request: Arc<GenerationRequest>,
        candidates: Vec<Candidate>,
        deadline: Option<Millis>,
        out: &mut Out,
    ) -> Option<Entry> {
        if self.requests.contains_key(&request.id) {
            return None; // duplicate submit: ignored
        }
        let snapshot = CandidateSnapshot::score(&request, candidates);
        let deadline = deadline.unwrap_or(now + self.config.default_deadline_ms);
        let id = request.id.clone();
        let (feasible, infeasible) = snapshot.counts();
        decision(
            out,
            &id,
            now,
            DecisionEventKind::Submitted {
                feasible,
                infeasible,
                deadline,
            },
        );
        let record = DecisionRecord {
            request: id,
            model: request.model.clone(),
            processed_tokens: request.processed(),
            max_new_tokens: request.max_new_tokens,
            submitted_at: now,
            deadline,
            waited_ms: 0,
            candidates: snapshot,
            candidates_omitted: 0,
            attempts: Vec::new(),
            first_delta_at: None,
            delivered_tokens: 0,
            outcome: None,
            finished_at: None,
            measured_ttft_ms: None,
            actual_cached_tokens: None,
            worker_timings: None,
        };
        self.index.counts.offered += 1;
        Some(Entry {
            request,
            // `received` is transient: the entry is counted as offered until the first
            // offer-next (or the hold) moves it on.
            phase: Phase::Offered,
            attempt: 0,
            assignment: None,
            current: None,
            offered: 0,
            order: Vec::new(),
            cursor: 0,
            excluded: Default::default(),
            delivered: 0,
            record,
        })
    }

    pub(super) fn on_cancel(&mut self, now: Millis, request: &RequestId, out: &mut Out) {
        let Router {
            config,
            requests,
            index,
        } = self;
        let Some(e) = requests.get_mut(request) else {
            return;
        };
        if e.phase.is_terminal() {
            return;
        }
        abandon_attempt(index, e, now, AttemptOutcome::Cancelled, out);
        finish(config, index, e, now, Terminal::Cancelled, out);
    }

    pub(super) fn on_offer_result(
        &mut self,
        now: Millis,
        assignment: &AssignmentId,
        worker_epoch: Epoch,
        accepted: bool,
        reason: Option<DeclineReason>,
        out: &mut Out,
    ) {
        let Router {
            config,
            requests,
            index,
        } = self;
        let Some(e) = requests.get_mut(&assignment.request) else {
            return;
        };
        if e.phase != Phase::Offered || !e.is_current(assignment) {
            return;
        }
        out.push(local(LocalRouterEffect::CancelOfferTimer {
            assignment: assignment.clone(),
        }));
        if accepted {
            set_phase(index, e, Phase::Assigned);
            if let Some(a) = e.last_attempt_mut() {
                a.accepted_at = Some(now);
                a.outcome = AttemptOutcome::Running;
            }
            let kind = DecisionEventKind::Accepted {
                attempt: assignment.attempt,
            };
            decision(out, &assignment.request, now, kind);
        } else {
            if skips_worker(reason)
                && let Some(worker) = e.current_worker().cloned()
            {
                e.exclude(worker);
            }
            let outcome = AttemptOutcome::Declined {
                reason,
                worker_epoch,
            };
            end_attempt(index, e, now, outcome, out);
            offer_next(config, index, e, now, out);
        }
    }

    pub(super) fn on_token(
        &mut self,
        now: Millis,
        assignment: &AssignmentId,
        token: Token,
        index: u32,
        out: &mut Out,
    ) {
        let Some(e) = self.requests.get_mut(&assignment.request) else {
            return;
        };
        if e.phase != Phase::Assigned || !e.is_current(assignment) || index != e.delivered {
            return;
        }
        e.delivered += 1;
        e.record.delivered_tokens = e.delivered;
        if index == 0 {
            let ttft_ms = now.since(e.record.submitted_at);
            e.record.first_delta_at = Some(now);
            e.record.measured_ttft_ms = Some(ttft_ms);
            decision(
                out,
                &assignment.request,
                now,
                DecisionEventKind::FirstDelta { ttft_ms },
            );
        }
        out.push(deliver(
            &assignment.request,
            DeliveryKind::Delta { token, index },
        ));
    }

    pub(super) fn on_result(
        &mut self,
        now: Millis,
        assignment: &AssignmentId,
        result: Box<WorkerResult>,
        out: &mut Out,
    ) {
        let Router {
            config,
            requests,
            index,
        } = self;
        let Some(e) = requests.get_mut(&assignment.request) else {
            return;
        };
        if e.phase != Phase::Assigned || !e.is_current(assignment) {
            return;
        }
        if result.is_completed() {
            end_attempt(index, e, now, AttemptOutcome::Completed, out);
            e.record.actual_cached_tokens = Some(result.cached_token_count);
            e.record.worker_timings = Some(result.timings);
            finish(config, index, e, now, Terminal::Completed(result), out);
            return;
        }
        let reason = result.failure.unwrap_or_else(Failure::unspecified);
        let worker = e.current_worker().cloned();
        let outcome = AttemptOutcome::Failed {
            reason: reason.clone(),
        };
        end_attempt(index, e, now, outcome, out);
        match worker {
            Some(worker) if e.delivered > 0 => {
                let error = RouterError::WorkerFailedAfterStream {
                    worker,
                    reason,
                    delivered: e.delivered,
                };
                finish(config, index, e, now, Terminal::Failed(error), out);
            }
            _ => offer_next(config, index, e, now, out),
        }
    }

    pub(super) fn on_unavailable(
        &mut self,
        now: Millis,
        worker: &WorkerId,
        assignment: &AssignmentId,
        out: &mut Out,
    ) {
        let Router {
            config,
            requests,
            index,
        } = self;
        let Some(e) = requests.get_mut(&assignment.request) else {
            return;
        };
        if !matches!(e.phase, Phase::Offered | Phase::Assigned)
            || !e.is_current(assignment)
            || e.current_worker() != Some(worker)
        {
            return;
        }
        if e.phase == Phase::Offered {
            out.push(local(LocalRouterEffect::CancelOfferTimer {
                assignment: assignment.clone(),
            }));
        }
        end_attempt(index, e, now, AttemptOutcome::WorkerUnavailable, out);
        e.exclude(worker.clone());
        if e.delivered > 0 {
            let error = RouterError::WorkerUnavailableAfterStream {
                worker: worker.clone(),
                delivered: e.delivered,
            };
            finish(config, index, e, now, Terminal::Failed(error), out);
        } else {
            offer_next(config, index, e, now, out);
        }
    }

    pub(super) fn on_offer_timeout(
        &mut self,
        now: Millis,
        assignment: &AssignmentId,
        out: &mut Out,
    ) {
        let Router {
            config,
            requests,
            index,
        } = self;
        let Some(e) = requests.get_mut(&assignment.request) else {
            return;
        };
        if e.phase != Phase::Offered || !e.is_current(assignment) {
            return;
        }
        let Some(worker) = e.current_worker().cloned() else {
            return;
        };
        end_attempt(index, e, now, AttemptOutcome::TimedOut, out);
        // A worker that did not answer in time is not offered this request again: it is
        // slow or unreachable, and it may still hold the timed-out attempt, so its other
        // alternatives would only be declined `request-already-assigned`.
        e.exclude(worker.clone());
        // Cancel first, so a late accept on the old worker is fenced there too; then
        // offer the next candidate.
        out.push(send_cancel(worker, assignment.clone()));
        offer_next(config, index, e, now, out);
    }

    pub(super) fn on_deadline(&mut self, now: Millis, request: &RequestId, out: &mut Out) {
        let Router {
            config,
            requests,
            index,
        } = self;
        let Some(e) = requests.get_mut(request) else {
            return;
        };
        if e.phase.is_terminal() || now < e.record.deadline {
            return;
        }
        let deadline = e.record.deadline;
        abandon_attempt(index, e, now, AttemptOutcome::Superseded, out);
        let error = RouterError::DeadlineExceeded { deadline };
        finish(config, index, e, now, Terminal::Failed(error), out);
    }
}
